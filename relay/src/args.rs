//! The relay's command line: `plimsoll-relay <port> <socket>`.

use std::path::PathBuf;

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
        write!(f, "{} (usage: plimsoll-relay <port> <socket>)", self.0)
    }
}

impl Args {
    /// Reads the arguments after the program's name.
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
