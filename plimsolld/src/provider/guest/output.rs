//! A guest's output, kept up to a cap per stream (providers.md §5.7), and the start marker that
//! tells a guest's exit from its provider's failure (§5.6, sharp edge 1).
//!
//! Bytes past the cap are read and dropped, so the guest never blocks on a full pipe, and the
//! stream's flag records the loss; the kept prefix carries no marker of its own.

/// Per-stream output cap.
pub const OUTPUT_CAP: usize = 64 * 1024;

/// A stream's kept bytes and whether any were dropped.
pub type Kept = (Vec<u8>, bool);

/// One stream, capped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capped {
    kept: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capped {
    /// An empty stream that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Capped {
        Capped {
            kept: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Keeps what fits of `bytes` and remembers whether anything was dropped.
    pub fn push(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Records that bytes were lost without seeing them (a stream abandoned for its size).
    pub fn mark_truncated(&mut self) {
        self.truncated = true;
    }

    /// The kept bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.kept
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept bytes and the flag.
    pub fn into_parts(self) -> Kept {
        (self.kept, self.truncated)
    }
}

/// A run's two streams. Stderr's cap is the output cap plus the marker line, so the guest gets
/// its full 64 KiB after the marker is taken off.
#[derive(Debug, Clone)]
pub struct Output {
    /// Standard output.
    pub stdout: Capped,
    /// Standard error, starting with the marker line when docker started the command.
    pub stderr: Capped,
    marker_line: Vec<u8>,
}

impl Output {
    /// Empty streams for a run whose marker is `marker`, keeping up to `stdout_cap` bytes of
    /// stdout ([`OUTPUT_CAP`] for a snippet; the project runner's report is larger).
    pub fn new(marker: &str, stdout_cap: usize) -> Output {
        let mut marker_line = marker.as_bytes().to_vec();
        marker_line.push(b'\n');
        Output {
            stdout: Capped::new(stdout_cap),
            stderr: Capped::new(OUTPUT_CAP + marker_line.len()),
            marker_line,
        }
    }

    /// Whether stderr began with the marker: the proof that the start script ran, so whatever
    /// happened after is the guest's doing. A marker later in the stream proves nothing (the
    /// guest can print anything).
    pub fn marker_seen(&self) -> bool {
        self.stderr.bytes().starts_with(&self.marker_line)
    }

    /// The guest's stdout and stderr (everything after the marker), with their flags; `None`
    /// when the marker is missing.
    pub fn guest_streams(self) -> Option<(Kept, Kept)> {
        if !self.marker_seen() {
            return None;
        }
        let (mut stderr, stderr_truncated) = self.stderr.into_parts();
        stderr.drain(..self.marker_line.len());
        Some((self.stdout.into_parts(), (stderr, stderr_truncated)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MARKER: &str = "plimsoll-started:0123456789abcdef";

    #[test]
    fn bytes_past_the_cap_are_dropped_and_flagged() {
        let mut c = Capped::new(4);
        c.push(b"ab");
        assert!(!c.clone().into_parts().1);
        c.push(b"cdef");
        c.push(b"g");
        assert_eq!(c.into_parts(), (b"abcd".to_vec(), true));
        let mut exact = Capped::new(2);
        exact.push(b"ab");
        assert_eq!(exact.into_parts(), (b"ab".to_vec(), false));
    }

    #[test]
    fn the_marker_is_taken_off_stderr_and_the_guest_keeps_a_full_cap() {
        let mut out = Output::new(MARKER, OUTPUT_CAP);
        out.stderr.push(format!("{MARKER}\n").as_bytes());
        out.stderr.push(&vec![b'e'; OUTPUT_CAP]);
        out.stdout.push(b"hi\n");
        let ((stdout, so_t), (stderr, se_t)) = out.guest_streams().unwrap();
        assert_eq!((stdout.as_slice(), so_t), (&b"hi\n"[..], false));
        assert_eq!((stderr.len(), se_t), (OUTPUT_CAP, false));
    }

    #[test]
    fn no_marker_or_a_late_marker_means_docker_did_not_start_the_command() {
        let mut out = Output::new(MARKER, OUTPUT_CAP);
        out.stderr.push(b"docker: Error response from daemon\n");
        assert!(!out.marker_seen());
        out.stderr.push(format!("{MARKER}\n").as_bytes());
        assert!(!out.marker_seen());
        assert!(out.guest_streams().is_none());
        let mut split = Output::new(MARKER, OUTPUT_CAP);
        split.stderr.push(&MARKER.as_bytes()[..5]);
        split
            .stderr
            .push(&format!("{}\nrest", &MARKER[5..]).into_bytes());
        assert_eq!(split.guest_streams().unwrap().1.0, b"rest");
    }
}
