//! The guard's configuration, read once from its environment ([`crate::env`]). Every bad
//! variable is reported together, before anything binds.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::env::{self, Environment};

/// Default for [`env::MAX_CONCURRENT`], as plimsolld's.
pub const DEFAULT_MAX_CONCURRENT: u32 = 8;
/// Largest [`env::MAX_CONCURRENT`], as plimsolld's.
pub const MAX_CONCURRENT_LIMIT: u32 = 1024;

/// What the guard reads from its environment, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// [`env::GUARD_ADDR`], trimmed; `:port` means every interface.
    pub addr: String,
    /// [`env::GUARD_ADDR_FILE`].
    pub addr_file: Option<PathBuf>,
    /// [`env::BROKER_GUARD_SOCKET`], absolute.
    pub broker_socket: PathBuf,
    /// [`env::TLS_CERT`] and [`env::TLS_KEY`], or `None` for cleartext HTTP/1.1 and h2c.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// [`env::MAX_CONCURRENT`]: the decode pool holds twice this.
    pub max_concurrent: u32,
    /// [`env::HARDENED`].
    pub hardened: bool,
    /// [`env::LOG_FORMAT`] is `text`.
    pub text_logs: bool,
}

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A required variable is unset or blank.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A variable holds a value the guard does not accept.
    #[error("{name}={value:?} {reason}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value, cut to 64 characters.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// Hardened mode and a listener off loopback without TLS.
    #[error(
        "hardened mode: the guard listener {0} is not loopback and has no TLS \
         (set PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY)"
    )]
    CleartextOffLoopback(String),
}

/// Every problem found; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigError(pub Vec<ConfigProblem>);

// === impl Config ===

impl Config {
    /// Reads and checks every variable.
    pub fn from_env(vars: &dyn Environment) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let get = |name: &str| {
            vars.var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut invalid = |name, value: &str, reason| {
            problems.push(ConfigProblem::Invalid {
                name,
                value: value.chars().take(64).collect(),
                reason,
            })
        };
        let addr = get(env::GUARD_ADDR).unwrap_or_default();
        let resolved = if addr.is_empty() {
            None
        } else {
            let found = resolve(&addr);
            if found.is_none() {
                invalid(
                    env::GUARD_ADDR,
                    &addr,
                    "must be host:port, e.g. 127.0.0.1:8443",
                );
            }
            found
        };
        let broker_socket = get(env::BROKER_GUARD_SOCKET).map(PathBuf::from);
        if let Some(path) = &broker_socket
            && !path.is_absolute()
        {
            invalid(
                env::BROKER_GUARD_SOCKET,
                &path.display().to_string(),
                "must be an absolute path",
            );
        }
        let tls = match (get(env::TLS_CERT), get(env::TLS_KEY)) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                problems.push(ConfigProblem::Missing(env::TLS_KEY));
                None
            }
            (None, Some(_)) => {
                problems.push(ConfigProblem::Missing(env::TLS_CERT));
                None
            }
        };
        let max_concurrent = match get(env::MAX_CONCURRENT) {
            None => DEFAULT_MAX_CONCURRENT,
            Some(text) => match text.parse::<u32>() {
                Ok(n)
                    if (1..=MAX_CONCURRENT_LIMIT).contains(&n)
                        && text.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    n
                }
                _ => {
                    problems.push(ConfigProblem::Invalid {
                        name: env::MAX_CONCURRENT,
                        value: text.chars().take(64).collect(),
                        reason: "must be a whole number in [1, 1024]",
                    });
                    DEFAULT_MAX_CONCURRENT
                }
            },
        };
        let hardened = match get(env::HARDENED)
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("0" | "false") => false,
            Some("1" | "true") => true,
            Some(other) => {
                problems.push(ConfigProblem::Invalid {
                    name: env::HARDENED,
                    value: other.chars().take(64).collect(),
                    reason: "must be one of 0, 1, false, or true",
                });
                false
            }
        };
        if addr.is_empty() {
            problems.push(ConfigProblem::Missing(env::GUARD_ADDR));
        }
        if broker_socket.is_none() {
            problems.push(ConfigProblem::Missing(env::BROKER_GUARD_SOCKET));
        }
        if hardened
            && tls.is_none()
            && let Some(addrs) = &resolved
            && !addrs.iter().all(|a| a.ip().is_loopback())
        {
            problems.push(ConfigProblem::CleartextOffLoopback(addr.clone()));
        }
        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        Ok(Config {
            addr,
            addr_file: get(env::GUARD_ADDR_FILE).map(PathBuf::from),
            broker_socket: broker_socket.unwrap_or_default(),
            tls,
            max_concurrent,
            hardened,
            text_logs: get(env::LOG_FORMAT).is_some_and(|v| v.eq_ignore_ascii_case("text")),
        })
    }

    /// How many bodies may be read and decoded at once: twice the daemon's run cap.
    pub fn decode_slots(&self) -> usize {
        2 * self.max_concurrent as usize
    }
}

/// The addresses `addr` names (`:port` is every interface); `None` when it is not
/// `host:port` or names nothing.
pub fn resolve(addr: &str) -> Option<Vec<SocketAddr>> {
    let target = bind_target(addr);
    let found: Vec<SocketAddr> = target.to_socket_addrs().ok()?.collect();
    (!found.is_empty()).then_some(found)
}

/// What to bind for `addr`: Go's `:port` means every interface.
pub fn bind_target(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            (env::GUARD_ADDR, "127.0.0.1:0"),
            (env::BROKER_GUARD_SOCKET, "/run/plimsoll/guard.sock"),
        ]
    }

    #[test]
    fn the_defaults_and_a_full_configuration_read_back() {
        let config = Config::from_env(&env(&base())).unwrap();
        assert_eq!(config.max_concurrent, 8);
        assert_eq!(config.decode_slots(), 16);
        assert!(config.tls.is_none() && !config.hardened && !config.text_logs);
        let mut all = base();
        all.extend([
            (env::TLS_CERT, "/c.pem"),
            (env::TLS_KEY, "/k.pem"),
            (env::MAX_CONCURRENT, " 3 "),
            (env::HARDENED, "TRUE"),
            (env::LOG_FORMAT, "text"),
            (env::GUARD_ADDR_FILE, "/tmp/guard.addr"),
        ]);
        let config = Config::from_env(&env(&all)).unwrap();
        assert_eq!(config.decode_slots(), 6);
        assert!(config.hardened && config.text_logs && config.tls.is_some());
    }

    #[test]
    fn every_bad_variable_is_reported_at_once() {
        let err = Config::from_env(&env(&[
            (env::GUARD_ADDR, "8443"),
            (env::BROKER_GUARD_SOCKET, "relative.sock"),
            (env::TLS_CERT, "/c.pem"),
            (env::MAX_CONCURRENT, "0"),
            (env::HARDENED, "yes"),
        ]))
        .unwrap_err();
        let names: Vec<String> = err.0.iter().map(ToString::to_string).collect();
        assert_eq!(err.0.len(), 5, "{names:?}");
        assert!(
            Config::from_env(&env(&[]))
                .unwrap_err()
                .0
                .contains(&ConfigProblem::Missing(env::GUARD_ADDR))
        );
    }

    #[test]
    fn hardened_mode_refuses_cleartext_off_loopback_only() {
        let mut off = base();
        off[0] = (env::GUARD_ADDR, ":8443");
        off.push((env::HARDENED, "1"));
        let err = Config::from_env(&env(&off)).unwrap_err();
        assert!(matches!(
            err.0[..],
            [ConfigProblem::CleartextOffLoopback(_)]
        ));
        off.extend([(env::TLS_CERT, "/c.pem"), (env::TLS_KEY, "/k.pem")]);
        assert!(Config::from_env(&env(&off)).is_ok());
        let mut loopback = base();
        loopback.push((env::HARDENED, "1"));
        assert!(Config::from_env(&env(&loopback)).is_ok());
    }
}
