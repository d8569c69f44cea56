//! One of the interpreter's output streams during a cell: only the bytes between the cell's
//! start and end markers count, and only up to the cell's cap of them is forwarded.
//!
//! The FIFO is read for the interpreter's whole life, so a read can hold anything: output
//! from between cells, half a marker, several markers. Only the shortest tail that could still
//! begin the awaited marker is held back, so output reaches the daemon as soon as it is
//! written.

/// A cell's markers, which carry its nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Markers {
    /// The markers the kernel writes around cell `nonce`'s output.
    pub fn new(nonce: &str) -> Markers {
        Markers {
            start: format!("\0plimsoll-cell-start-{nonce}\0").into_bytes(),
            end: format!("\0plimsoll-cell-end-{nonce}\0").into_bytes(),
        }
    }
}

/// One stream of the current cell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stream {
    started: bool,
    ended: bool,
    pending: Vec<u8>,
    sent: usize,
    cap: usize,
    truncated: bool,
}

/// What one read came to: the bytes to forward (within the cap) and whether the end marker
/// was seen.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    pub forward: Vec<u8>,
    pub ended: bool,
}

impl Stream {
    /// A stream that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Stream {
        Stream {
            cap,
            ..Stream::default()
        }
    }

    /// Whether the end marker was seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Whether bytes past the cap were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Feeds one read through the markers.
    pub fn feed(&mut self, markers: &Markers, chunk: &[u8]) -> Fed {
        let mut fed = Fed::default();
        if self.ended {
            return fed;
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(chunk);
        let mut rest: &[u8] = &buf;
        if !self.started {
            let Some(at) = find(rest, &markers.start) else {
                let keep = rest.len().min(markers.start.len() - 1);
                self.pending = rest[rest.len() - keep..].to_vec();
                return fed;
            };
            self.started = true;
            rest = &rest[at + markers.start.len()..];
        }
        if let Some(at) = find(rest, &markers.end) {
            fed.forward = self.keep(&rest[..at]);
            self.ended = true;
            fed.ended = true;
            return fed;
        }
        let hold = marker_prefix(rest, &markers.end);
        fed.forward = self.keep(&rest[..rest.len() - hold]);
        self.pending = rest[rest.len() - hold..].to_vec();
        fed
    }

    /// At the cell's end without an end marker: what was held back as a possible marker is
    /// output after all.
    pub fn flush(&mut self) -> Vec<u8> {
        if !self.started || self.ended || self.pending.is_empty() {
            return Vec::new();
        }
        let pending = std::mem::take(&mut self.pending);
        self.keep(&pending)
    }

    /// What fits under the cap; the rest only sets the flag.
    fn keep(&mut self, bytes: &[u8]) -> Vec<u8> {
        let room = self.cap.saturating_sub(self.sent);
        if bytes.len() > room {
            self.truncated = true;
        }
        let kept = &bytes[..bytes.len().min(room)];
        self.sent += kept.len();
        kept.to_vec()
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest tail of `buf` that could begin `marker`.
fn marker_prefix(buf: &[u8], marker: &[u8]) -> usize {
    let longest = buf.len().min(marker.len().saturating_sub(1));
    (1..=longest)
        .rev()
        .find(|k| buf[buf.len() - k..] == marker[..*k])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "0123456789abcdef0123456789abcdef";

    fn start() -> Vec<u8> {
        format!("\0plimsoll-cell-start-{N}\0").into_bytes()
    }

    fn end() -> Vec<u8> {
        format!("\0plimsoll-cell-end-{N}\0").into_bytes()
    }

    /// Feeds `bytes` in pieces of `size` and returns everything forwarded and whether it ended.
    fn feed_in_pieces(stream: &mut Stream, bytes: &[u8], size: usize) -> (Vec<u8>, bool) {
        let markers = Markers::new(N);
        let mut out = Vec::new();
        let mut ended = false;
        for piece in bytes.chunks(size) {
            let fed = stream.feed(&markers, piece);
            out.extend(fed.forward);
            ended |= fed.ended;
        }
        (out, ended)
    }

    #[test]
    fn only_the_bytes_between_the_markers_are_forwarded_however_the_reads_fall() {
        let mut all = b"before the cell\0plimsoll-cell-".to_vec();
        all.extend(start());
        all.extend(b"hello \0plimsoll-cell-end-other\0 world");
        all.extend(end());
        all.extend(b"after");
        for size in 1..=all.len() {
            let mut stream = Stream::new(1 << 20);
            let (out, ended) = feed_in_pieces(&mut stream, &all, size);
            assert_eq!(
                out, b"hello \0plimsoll-cell-end-other\0 world",
                "size {size}"
            );
            assert!(ended && stream.ended() && !stream.truncated());
        }
    }

    #[test]
    fn output_is_forwarded_at_once_except_a_possible_marker_start() {
        let markers = Markers::new(N);
        let mut stream = Stream::new(100);
        assert_eq!(stream.feed(&markers, &start()).forward, b"");
        assert_eq!(stream.feed(&markers, b"abc\0plim").forward, b"abc");
        assert_eq!(stream.feed(&markers, b"x").forward, b"\0plimx");
        assert_eq!(stream.feed(&markers, b"\0").forward, b"");
        assert_eq!(stream.flush(), b"\0");
    }

    #[test]
    fn the_cap_keeps_the_first_bytes_and_sets_the_flag() {
        let mut all = start();
        all.extend(b"0123456789");
        all.extend(end());
        let mut stream = Stream::new(4);
        let (out, ended) = feed_in_pieces(&mut stream, &all, 3);
        assert_eq!(out, b"0123");
        assert!(ended && stream.truncated());
        let mut zero = Stream::new(0);
        let (out, _) = feed_in_pieces(&mut zero, &all, 7);
        assert!(out.is_empty() && zero.truncated());
    }

    #[test]
    fn nothing_counts_after_the_end_or_without_a_start() {
        let markers = Markers::new(N);
        let mut stream = Stream::new(100);
        assert_eq!(stream.feed(&markers, b"no marker here").forward, b"");
        assert_eq!(
            stream.flush(),
            b"",
            "a stream that never started flushes nothing"
        );
        let mut all = start();
        all.extend(end());
        let fed = stream.feed(&markers, &all);
        assert!(fed.ended && fed.forward.is_empty());
        assert_eq!(stream.feed(&markers, b"late").forward, b"");
        assert_eq!(stream.flush(), b"");
    }

    #[test]
    fn marker_prefixes_are_the_longest_tail_that_could_begin_the_marker() {
        assert_eq!(marker_prefix(b"ab\0pl", b"\0plimsoll"), 3);
        assert_eq!(marker_prefix(b"ab", b"\0plimsoll"), 0);
        assert_eq!(marker_prefix(b"\0plimsol", b"\0plimsoll"), 8);
        assert_eq!(marker_prefix(b"", b"\0p"), 0);
    }
}
