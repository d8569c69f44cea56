//! A guest process's identity, `pid:starttime:cmdlinehex` (providers.md §9.1, §9.6): what the
//! launcher and the relay report, what the checker confirms and what the sweep keeps.
//!
//! `cmdlinehex` is the lowercase hex of the process's arguments joined with NUL bytes (the raw
//! `/proc/<pid>/cmdline` without its final NUL). The start time may be negative: gVisor can
//! report one.

use std::fmt;

/// One process, as a guest program reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessId {
    /// The PID inside the container.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`, in clock ticks since boot.
    pub start: i64,
    /// The command line, NUL-joined, in lowercase hex.
    pub cmdline_hex: String,
}

/// Why a reported identity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The text is not `pid:starttime:cmdlinehex`.
    #[error("the process identity {0:?} is not pid:starttime:cmdlinehex")]
    Malformed(String),
    /// The command line is not the one plimsoll started.
    #[error("process {pid} runs another command line than the one started")]
    WrongCommand { pid: u32 },
}

/// The `cmdlinehex` of `argv`.
pub fn cmdline_hex(argv: &[String]) -> String {
    hex::encode(argv.join("\0"))
}

// === impl ProcessId ===

impl ProcessId {
    /// Parses `^[0-9]+:-?[0-9]+:[0-9a-f]+$`.
    pub fn parse(text: &str) -> Result<ProcessId, IdentityError> {
        let malformed = || IdentityError::Malformed(text.chars().take(120).collect());
        let mut parts = text.splitn(3, ':');
        let (Some(pid), Some(start), Some(cmdline)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let start_digits = start.strip_prefix('-').unwrap_or(start);
        let hex_ok = !cmdline.is_empty()
            && cmdline
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !digits(pid) || !digits(start_digits) || !hex_ok {
            return Err(malformed());
        }
        Ok(ProcessId {
            pid: pid.parse().map_err(|_| malformed())?,
            start: start.parse().map_err(|_| malformed())?,
            cmdline_hex: cmdline.to_owned(),
        })
    }

    /// Parses `text` and requires the command line to be exactly `argv`.
    pub fn verify(text: &str, argv: &[String]) -> Result<ProcessId, IdentityError> {
        let id = ProcessId::parse(text)?;
        if id.cmdline_hex != cmdline_hex(argv) {
            return Err(IdentityError::WrongCommand { pid: id.pid });
        }
        Ok(id)
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.pid, self.start, self.cmdline_hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn identities_round_trip_and_gvisor_start_times_may_be_negative() {
        let id = ProcessId::parse("42:-17:6e6f6465").unwrap();
        assert_eq!(
            (id.pid, id.start, id.cmdline_hex.as_str()),
            (42, -17, "6e6f6465")
        );
        assert_eq!(id.to_string(), "42:-17:6e6f6465");
    }

    #[test]
    fn malformed_identities_are_refused() {
        for bad in [
            "",
            "1:2",
            "1:2:",
            ":2:ab",
            "1::ab",
            "a:2:ab",
            "1:2:AB",
            "1:2:xy",
            "1:--2:ab",
            "1:2:ab:cd",
            " 1:2:ab",
            "1:2:ab\n",
            "99999999999:2:ab",
        ] {
            assert!(ProcessId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_command_line_must_be_the_one_started() {
        let started = argv(&["node", "-e", "x", "/tmp/d"]);
        let hex = cmdline_hex(&started);
        assert_eq!(hex, hex::encode(b"node\0-e\0x\0/tmp/d"));
        assert!(ProcessId::verify(&format!("7:1:{hex}"), &started).is_ok());
        let other = cmdline_hex(&argv(&["node", "-e", "y", "/tmp/d"]));
        assert_eq!(
            ProcessId::verify(&format!("7:1:{other}"), &started),
            Err(IdentityError::WrongCommand { pid: 7 })
        );
    }
}
