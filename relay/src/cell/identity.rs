//! The relay's own identity, `pid:starttime:cmdlinehex` (providers.md §9.1): what its first
//! line reports and what the daemon's check confirms from outside.

use std::fmt::Write as _;
use std::io;

/// This process's identity, read from `/proc/self`.
pub fn of_self() -> io::Result<String> {
    let stat = std::fs::read("/proc/self/stat")?;
    let cmdline = std::fs::read("/proc/self/cmdline")?;
    let start = start_time(&stat).ok_or_else(|| io::Error::other("malformed /proc/self/stat"))?;
    Ok(format!(
        "{}:{start}:{}",
        std::process::id(),
        cmdline_hex(&cmdline)
    ))
}

/// Field 22 of a stat line (the start time): the 20th after the command name, which may
/// itself hold spaces and parentheses.
fn start_time(stat: &[u8]) -> Option<String> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    rest.split(' ').nth(19).map(str::to_owned)
}

/// The command line's NUL-separated arguments, without the final NUL, in lowercase hex.
fn cmdline_hex(cmdline: &[u8]) -> String {
    let args = cmdline.strip_suffix(b"\0").unwrap_or(cmdline);
    let mut hex = String::with_capacity(args.len() * 2);
    for b in args {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = b"42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(start_time(stat).unwrap(), "98765");
        assert_eq!(start_time(b"42 (x) S 1"), None);
    }

    #[test]
    fn the_command_line_is_hex_without_its_final_nul() {
        assert_eq!(
            cmdline_hex(b"node\0-e\0x\0"),
            "6e6f6465002d650078".to_owned()
        );
        assert_eq!(cmdline_hex(b""), "");
    }

    #[test]
    fn this_process_reports_itself() {
        let id = of_self().unwrap();
        let mut parts = id.splitn(3, ':');
        assert_eq!(parts.next().unwrap(), std::process::id().to_string());
        assert!(parts.next().unwrap().parse::<i64>().is_ok());
        assert!(!parts.next().unwrap().is_empty());
    }
}
