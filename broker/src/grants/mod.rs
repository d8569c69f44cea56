//! The grants file (`spec/grants.md` §1): loading, every load-time validation, and the
//! validated [`Profile`]s a registry holds.
//!
//! A file either loads whole or not at all: one bad profile refuses the file, and the
//! error names the profile and the problem (`grants: profile "<name>": …`).

mod profile;
mod raw;
pub mod route;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::env::Environment;
pub use profile::{DEFAULT_MAX_CALLS, MAX_CALLS_CEILING, MAX_PROFILE_NAME_BYTES, check_name};
pub use route::{Route, RouteError, Target};

/// Largest grants file read.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Why a grants file did not load.
#[derive(Debug, thiserror::Error)]
pub enum GrantsError {
    /// The file could not be read.
    #[error("grants: {path}: {source}")]
    Read {
        /// The grants file.
        path: PathBuf,
        /// What reading returned.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("grants: {path}: larger than {MAX_FILE_BYTES} bytes")]
    TooLarge {
        /// The grants file.
        path: PathBuf,
    },
    /// Not the file's JSON shape: syntax, unknown field, wrong type, trailing data.
    #[error("grants: {path}: {detail}")]
    Shape {
        /// The grants file.
        path: PathBuf,
        /// serde's message, with line and column.
        detail: String,
    },
    /// A profile failed validation.
    #[error("grants: profile \"{profile}\": {detail}")]
    Profile {
        /// The profile's name as written.
        profile: String,
        /// What is wrong.
        detail: String,
    },
}

/// A validated profile: everything a run needs, secrets included (read at load).
#[derive(Clone)]
pub struct Profile {
    /// The profile's name.
    pub name: String,
    /// Where calls go.
    pub origin: Origin,
    /// The routes a run may call, in file order (the first match wins).
    pub allow: Vec<Route>,
    /// Who may open the profile.
    pub callers: Callers,
    /// JWT `scope` entries.
    pub scopes: Vec<String>,
    /// How the credential is made.
    pub token: TokenSpec,
    /// The JS global (`host` by default).
    pub global: String,
    /// The preamble, from `preamble` or `preamble_file`.
    pub preamble: String,
    /// The breaker's recovery probe.
    pub health_check: Option<Route>,
    /// Calls per run, denied ones included.
    pub max_calls: u32,
    /// Caps: index into `allow` → calls per run.
    pub route_caps: Vec<(usize, u32)>,
    /// Whether a session call may use the profile.
    pub allow_in_sessions: bool,
    /// Advisor input: routes the API has (checked, unused by the broker).
    pub catalog: Vec<Route>,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .field("allow", &self.allow.len())
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Profile {
    /// Whether `principal` may open this profile. An empty principal (open dev mode) and
    /// the id `*` never may.
    pub fn admits(&self, principal: &str) -> bool {
        if principal.is_empty() || principal == "*" {
            return false;
        }
        match &self.callers {
            Callers::Any => true,
            Callers::Only(ids) => ids.contains(principal),
        }
    }
}

/// An upstream origin: scheme, host and port, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `https`, or `http` on loopback.
    pub scheme: String,
    /// Host name or IP (IPv6 in brackets).
    pub host: String,
    /// Port (the scheme's default when not written).
    pub port: u16,
}

impl Origin {
    /// Whether calls use TLS.
    pub fn is_https(&self) -> bool {
        self.scheme == "https"
    }

    /// The `Host` header value.
    pub fn authority(&self) -> String {
        let default = if self.is_https() { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// `allowed_callers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callers {
    /// `"*"`: every authenticated caller.
    Any,
    /// These principal ids.
    Only(BTreeSet<String>),
}

/// Whether `s` is non-empty and only bytes 0x21–0x7e: safe as a bearer token (a static
/// token is checked at load, a minted one before it is used).
pub fn is_token_text(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// How a profile's credential is made (`spec/grants.md` §1.4).
#[derive(Clone)]
pub enum TokenSpec {
    /// No `token`: no upstream `Authorization` header.
    None,
    /// The same bearer for every run.
    Static {
        /// The bearer, read from the named variable at load.
        bearer: String,
    },
    /// An HS256 JWT minted per run.
    Jwt {
        /// The shared secret (≥ 32 bytes).
        secret: Vec<u8>,
        /// `aud`.
        audience: String,
        /// Upper bound on the lifetime.
        ttl_sec: u64,
        /// `iss`.
        issuer: Option<String>,
        /// The header's `kid`.
        key_id: Option<String>,
    },
}

impl fmt::Debug for TokenSpec {
    // Never prints a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSpec::None => f.write_str("None"),
            TokenSpec::Static { .. } => f.write_str("Static"),
            TokenSpec::Jwt { audience, .. } => write!(f, "Jwt {{ audience: {audience:?} }}"),
        }
    }
}

/// Reads and validates the grants file at `path`, reading profile variables from `env`.
pub fn load(path: &Path, env: &dyn Environment) -> Result<Vec<Profile>, GrantsError> {
    let bytes = read_capped(path, MAX_FILE_BYTES)
        .map_err(|source| GrantsError::Read {
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| GrantsError::TooLarge {
            path: path.to_owned(),
        })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    parse(&bytes, path, dir, env)
}

/// Reads a regular file of at most `limit` bytes; `None` when it holds more. Nothing past
/// the limit is read, and a FIFO or a device at `path` is refused without blocking.
pub(crate) fn read_capped(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// Validates grants file bytes. `path` names the file in errors; `dir` anchors
/// `preamble_file`.
pub fn parse(
    bytes: &[u8],
    path: &Path,
    dir: &Path,
    env: &dyn Environment,
) -> Result<Vec<Profile>, GrantsError> {
    let file: raw::RawFile = serde_json::from_slice(bytes).map_err(|e| GrantsError::Shape {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    file.profiles
        .0
        .into_iter()
        .map(|(name, raw)| {
            profile::validate(&name, raw, dir, env).map_err(|detail| GrantsError::Profile {
                profile: name,
                detail,
            })
        })
        .collect()
}
