//! Where grants come from (grants.md §1, config.md `PLIMSOLL_GRANTS_FILE`).
//!
//! The variable names belong to the broker crate (`broker::env`), which reads them too;
//! the daemon only decides which grant path to take:
//! - `PLIMSOLL_BROKER_SOCKET` set: an operator-run broker listens there (production: its
//!   own environment holds the secrets);
//! - else `PLIMSOLL_GRANTS_FILE` set: plimsolld starts and supervises a `broker` child with
//!   its own environment (development: weaker, the secrets pass through plimsolld);
//! - neither: grants are off and every `grant_profile` is unavailable.

use std::path::PathBuf;

use super::env::Strings;

/// The grant path the operator chose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GrantSource {
    /// No broker: a request naming a profile is refused as unavailable.
    #[default]
    Off,
    /// Connect to an operator-run broker's control socket.
    External(PathBuf),
    /// Start and supervise a `broker` child that loads this grants file.
    Supervised(PathBuf),
}

/// Why the grant settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantsConfigProblem {
    /// The control socket must be an absolute path (it is dialled from any directory).
    #[error("{var}={value:?} must be an absolute path to the broker's control socket")]
    SocketNotAbsolute {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
}

impl GrantsConfigProblem {
    /// The variable the problem is about.
    pub fn variable(&self) -> &'static str {
        match self {
            Self::SocketNotAbsolute { var, .. } => var,
        }
    }
}

/// Reads the grant path. Blank values count as unset.
pub fn read(env: &dyn Strings) -> Result<GrantSource, GrantsConfigProblem> {
    let get = |name: &str| {
        env.get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(socket) = get(broker::env::BROKER_SOCKET) {
        let path = PathBuf::from(&socket);
        if !path.is_absolute() {
            return Err(GrantsConfigProblem::SocketNotAbsolute {
                var: broker::env::BROKER_SOCKET,
                value: socket,
            });
        }
        return Ok(GrantSource::External(path));
    }
    Ok(get(broker::env::GRANTS_FILE)
        .map(|f| GrantSource::Supervised(PathBuf::from(f)))
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_external_broker_wins_over_a_grants_file() {
        let both = env(&[
            (broker::env::BROKER_SOCKET, "/run/broker.sock"),
            (broker::env::GRANTS_FILE, "/etc/grants.json"),
        ]);
        assert_eq!(
            read(&both).unwrap(),
            GrantSource::External("/run/broker.sock".into())
        );
        let file = env(&[(broker::env::GRANTS_FILE, " /etc/grants.json ")]);
        assert_eq!(
            read(&file).unwrap(),
            GrantSource::Supervised("/etc/grants.json".into())
        );
        assert_eq!(
            read(&env(&[(broker::env::GRANTS_FILE, "  ")])).unwrap(),
            GrantSource::Off
        );
        assert!(read(&env(&[(broker::env::BROKER_SOCKET, "rel.sock")])).is_err());
    }
}
