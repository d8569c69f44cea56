//! The relay's command lines: `plimsoll-relay <port> <socket>` (grants on OpenShell) and
//! `plimsoll-relay cell <kernel dir> <work dir>` (a session's cell relay, [`crate::cell`]) and
//! `plimsoll-relay agent <guest uid>` (a docker session's agent, [`crate::agent`]).

use std::path::PathBuf;

use crate::agent::guard::MAX_GUEST_ID;

/// The word that selects the cell relay.
pub const CELL: &str = "cell";
/// The word that selects the session agent.
pub const AGENT: &str = "agent";

/// Which relay the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The grants relay: a port and a socket.
    Grants(Args),
    /// The cell relay for one interpreter.
    Cell(CellArgs),
    /// The session agent for the guest uid (gid the same), 1..=65532.
    Agent(u32),
}

/// What the cell relay serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellArgs {
    /// The interpreter's kernel directory: its `out` and `err` FIFOs and `ctl.sock`.
    pub kernel_dir: PathBuf,
    /// Where cells' files land (absolute, exactly as the daemon passed it).
    pub work: String,
}

/// What the relay serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The up side's loopback TCP port.
    pub port: u16,
    /// The down side's Unix socket path (absolute; must not exist yet).
    pub socket: PathBuf,
}

/// Why a command line is refused.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (usage: plimsoll-relay <port> <socket> | plimsoll-relay cell <kernel dir> <work dir> | plimsoll-relay agent <guest uid>)",
            self.0
        )
    }
}

impl Mode {
    /// Reads the arguments after the program's name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Mode, UsageError> {
        let args: Vec<String> = args.into_iter().collect();
        if args.first().map(String::as_str) == Some(AGENT) {
            return agent(&args);
        }
        if args.first().map(String::as_str) != Some(CELL) {
            return Args::parse(args).map(Mode::Grants);
        }
        let [_, dir, work] = args.as_slice() else {
            return Err(UsageError(format!(
                "cell expects 2 arguments, got {}",
                args.len() - 1
            )));
        };
        for path in [dir, work] {
            if !path.starts_with('/') || path.contains('\0') {
                return Err(UsageError(format!("{path:?} is not an absolute path")));
            }
        }
        Ok(Mode::Cell(CellArgs {
            kernel_dir: PathBuf::from(dir),
            work: work.clone(),
        }))
    }
}

/// `agent <guest uid>`: decimal, no sign or leading zero, 1..=65532 (uid+1 must fit).
fn agent(args: &[String]) -> Result<Mode, UsageError> {
    let [_, uid] = args else {
        return Err(UsageError(format!(
            "agent expects 1 argument, got {}",
            args.len() - 1
        )));
    };
    uid.parse::<u32>()
        .ok()
        .filter(|u| (1..=MAX_GUEST_ID).contains(u) && uid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|_| !uid.starts_with('0'))
        .map(Mode::Agent)
        .ok_or_else(|| UsageError(format!("guest uid {uid:?} is not in 1..{MAX_GUEST_ID}")))
}

impl Args {
    /// Reads the grants relay's arguments after the program's name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, UsageError> {
        let args: Vec<String> = args.into_iter().collect();
        let [port, socket] = args.as_slice() else {
            return Err(UsageError(format!(
                "expected 2 arguments, got {}",
                args.len()
            )));
        };
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0 && !port.starts_with('+') && !port.starts_with('0'))
            .ok_or_else(|| UsageError(format!("port {port:?} is not in 1..65535")))?;
        if !socket.starts_with('/') || socket.contains('\0') {
            return Err(UsageError(format!(
                "socket {socket:?} is not an absolute path"
            )));
        }
        Ok(Args {
            port,
            socket: PathBuf::from(socket),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Args, UsageError> {
        Args::parse(words.iter().map(|w| (*w).to_owned()))
    }

    #[test]
    fn a_port_and_an_absolute_socket_are_accepted() {
        let args = parse(&["20001", "/tmp/.plimsoll-host-0123456789ab.sock"]).unwrap();
        assert_eq!(args.port, 20001);
        assert_eq!(
            args.socket,
            PathBuf::from("/tmp/.plimsoll-host-0123456789ab.sock")
        );
    }

    #[test]
    fn cell_takes_a_kernel_dir_and_a_work_dir() {
        let words = ["cell", "/tmp/.plimsoll-interp/python", "/work"].map(str::to_owned);
        assert_eq!(
            Mode::parse(words).unwrap(),
            Mode::Cell(CellArgs {
                kernel_dir: PathBuf::from("/tmp/.plimsoll-interp/python"),
                work: "/work".to_owned(),
            })
        );
        for bad in [
            &["cell"][..],
            &["cell", "/d"],
            &["cell", "d", "/w"],
            &["cell", "/d", "w"],
            &["cell", "/d", "/w", "x"],
        ] {
            assert!(
                Mode::parse(bad.iter().map(|w| (*w).to_owned())).is_err(),
                "{bad:?}"
            );
        }
        let grants = ["20001", "/tmp/s"].map(str::to_owned);
        assert!(matches!(Mode::parse(grants), Ok(Mode::Grants(_))));
    }

    #[test]
    fn agent_takes_one_guest_uid_in_range() {
        let parse = |w: &[&str]| Mode::parse(w.iter().map(|s| (*s).to_owned()));
        assert_eq!(parse(&["agent", "1000"]).unwrap(), Mode::Agent(1000));
        assert_eq!(parse(&["agent", "65532"]).unwrap(), Mode::Agent(65532));
        for bad in [
            &["agent"][..],
            &["agent", "0"],
            &["agent", "65533"],
            &["agent", "+5"],
            &["agent", "05"],
            &["agent", "-1"],
            &["agent", " 5"],
            &["agent", "5", "6"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn anything_else_is_a_usage_error() {
        for bad in [
            &[][..],
            &["1"],
            &["0", "/s"],
            &["65536", "/s"],
            &["+5", "/s"],
            &["05", "/s"],
            &["x", "/s"],
            &["5", "rel"],
            &["5", "/s", "extra"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
