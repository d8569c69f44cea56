//! Per-call settings: the floor, the timeout, a trace id, a software rule, a grant profile,
//! and for sessions their lifetime, idle timeout, language hint and owner.
//!
//! Every setter only records the value; it is validated with the daemon's own rules
//! ([`crate::validate`]) when the call is made, and a bad value refuses the call before
//! anything is sent ([`ClientError::InvalidRequest`], marked `request`).

use std::time::Duration;

use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

use super::error::{ClientError, invalid};
use crate::tier::Floor;
use crate::validate;
use crate::wire::SoftwareRule;

/// Settings for one run: [`Client::run_javascript`](super::Client::run_javascript),
/// [`Client::run_project`](super::Client::run_project) and the session calls.
///
/// ```
/// use std::time::Duration;
/// use plimsoll::client::RunOptions;
///
/// let opts = RunOptions::new()
///     .minimum_isolation("process")
///     .timeout(Duration::from_secs(10))
///     .trace_id("build-42");
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub(crate) floor: String,
    pub(crate) timeout: Option<Duration>,
    pub(crate) trace_id: String,
    pub(crate) rule: Option<SoftwareRule>,
    pub(crate) grant_profile: String,
}

impl RunOptions {
    /// No floor, the daemon's default timeout, no trace id, no rule, no grant.
    pub fn new() -> RunOptions {
        RunOptions::default()
    }

    /// The weakest isolation tier the run accepts: `process`, `container`, `kernel` or `vm`
    /// (`""`, the default, is no floor). The daemon refuses a run it would execute below it
    /// (nothing runs), and this client re-checks the tier on the answer.
    pub fn minimum_isolation(mut self, tier: impl Into<String>) -> RunOptions {
        self.floor = tier.into();
        self
    }

    /// The run's whole budget. By default the daemon's own; the daemon clamps it to its
    /// provider's ceiling and 5 minutes. Sent in whole milliseconds, at least 1.
    pub fn timeout(mut self, timeout: Duration) -> RunOptions {
        self.timeout = Some(timeout);
        self
    }

    /// An opaque correlation id for the daemon's audit line: 1–64 bytes of
    /// `[A-Za-z0-9._:-]`. Anything else refuses the call locally.
    pub fn trace_id(mut self, id: impl Into<String>) -> RunOptions {
        self.trace_id = id.into();
        self
    }

    /// Requires the selected software to be this one identity (mode `exact`).
    pub fn software_exact(mut self, identity: impl Into<String>) -> RunOptions {
        self.rule = Some(SoftwareRule {
            mode: "exact".into(),
            identities: vec![identity.into()],
            ..Default::default()
        });
        self
    }

    /// Requires the selected software to be one of `identities` (mode `approved`, 1–32).
    pub fn software_approved<I, S>(mut self, identities: I) -> RunOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rule = Some(SoftwareRule {
            mode: "approved".into(),
            identities: identities.into_iter().map(Into::into).collect(),
            ..Default::default()
        });
        self
    }

    /// A grant profile configured on the daemon (at most 128 bytes); without one the run
    /// has no network. Cells carry none.
    pub fn grant_profile(mut self, profile: impl Into<String>) -> RunOptions {
        self.grant_profile = profile.into();
        self
    }
}

/// Settings for [`Client::open_session`](super::Client::open_session).
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    pub(crate) floor: String,
    pub(crate) rule: Option<SoftwareRule>,
    pub(crate) lifetime: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) trace_id: String,
    pub(crate) languages: Vec<String>,
    pub(crate) owner: Option<String>,
}

impl SessionOptions {
    /// The daemon's defaults and no owner.
    pub fn new() -> SessionOptions {
        SessionOptions::default()
    }

    /// The floor for the whole session: checked at open and sent with every call (a call
    /// may ask for more, never less).
    pub fn minimum_isolation(mut self, tier: impl Into<String>) -> SessionOptions {
        self.floor = tier.into();
        self
    }

    /// A software rule for the whole session; a call's own rule narrows it.
    pub fn software_rule(mut self, rule: SoftwareRule) -> SessionOptions {
        self.rule = Some(rule);
        self
    }

    /// Shortens the daemon's session lifetime (it can never lengthen it).
    pub fn lifetime(mut self, lifetime: Duration) -> SessionOptions {
        self.lifetime = Some(lifetime);
        self
    }

    /// Shortens the daemon's idle timeout (raised by the daemon to at least 1 s).
    pub fn idle_timeout(mut self, idle: Duration) -> SessionOptions {
        self.idle_timeout = Some(idle);
        self
    }

    /// A trace id, as [`RunOptions::trace_id`].
    pub fn trace_id(mut self, id: impl Into<String>) -> SessionOptions {
        self.trace_id = id.into();
        self
    }

    /// The languages the session's cells will use (`javascript`, `python`): a hint for a
    /// warm pool, not a limit.
    pub fn languages<I, S>(mut self, languages: I) -> SessionOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.languages = languages.into_iter().map(Into::into).collect();
        self
    }

    /// The end user the session is for, so a per-owner cap applies across processes. It
    /// never leaves this process: the daemon gets [`owner_digest`] of it, keyed by the
    /// client's token. Must not be empty.
    pub fn owner(mut self, owner: impl Into<String>) -> SessionOptions {
        self.owner = Some(owner.into());
        self
    }
}

/// What an owner is sent as (wire.md §7.2): lowercase hex of HMAC-SHA256 with key
/// SHA-256(`"plimsoll session owner key v2\n"` ‖ token) over
/// `"plimsoll session owner v2\n"` ‖ owner. The same in every official client, so the
/// processes of one app agree on a user; without a token the key is that of `""`.
pub fn owner_digest(token: Option<&str>, owner: &str) -> String {
    let key = Sha256::digest(format!(
        "plimsoll session owner key v2\n{}",
        token.unwrap_or("")
    ));
    // HMAC takes a key of any length; this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return String::new();
    };
    mac.update(b"plimsoll session owner v2\n");
    mac.update(owner.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

// === validation into wire fields ===

pub(crate) fn floor(s: &str) -> Result<Floor, ClientError> {
    validate::check_floor(s).map_err(|r| invalid(r.to_string()))
}

pub(crate) fn trace_id(s: &str) -> Result<String, ClientError> {
    if s.is_empty() {
        return Ok(String::new());
    }
    validate::trace_id(s)
        .map(str::to_owned)
        .ok_or_else(|| invalid("trace_id must be 1 to 64 characters of [A-Za-z0-9._:-]"))
}

pub(crate) fn rule(rule: Option<&SoftwareRule>) -> Result<Option<SoftwareRule>, ClientError> {
    validate::check_software_rule(rule).map_err(|r| invalid(r.to_string()))?;
    Ok(rule
        .filter(|r| !(r.mode.is_empty() && r.identities.is_empty()))
        .cloned())
}

/// A run's budget in whole milliseconds for the int32 field: 0 for the daemon's default,
/// clamped (never wrapped), at least 1 for any positive duration.
pub(crate) fn timeout_ms(t: Option<Duration>) -> i32 {
    match t {
        None => 0,
        Some(d) if d.is_zero() => 0,
        Some(d) => i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1),
    }
}

/// A session duration for the uint32 field, as [`timeout_ms`].
pub(crate) fn duration_ms(t: Option<Duration>) -> u32 {
    match t {
        None => 0,
        Some(d) if d.is_zero() => 0,
        Some(d) => u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1),
    }
}

/// A session's rule and a call's both apply: the call runs under their intersection.
pub(crate) fn merge_rules(
    session: Option<&SoftwareRule>,
    call: Option<&SoftwareRule>,
) -> Result<Option<SoftwareRule>, ClientError> {
    match (session, call) {
        (None, c) => Ok(c.cloned()),
        (s, None) => Ok(s.cloned()),
        (Some(s), Some(c)) => {
            let ids: Vec<String> = s
                .identities
                .iter()
                .filter(|i| c.identities.contains(i))
                .cloned()
                .collect();
            if ids.is_empty() {
                return Err(invalid(
                    "the call's software rule shares no identity with the session's",
                ));
            }
            Ok(Some(SoftwareRule {
                mode: if ids.len() == 1 { "exact" } else { "approved" }.into(),
                identities: ids,
                ..Default::default()
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_whole_milliseconds_clamped_and_at_least_one() {
        assert_eq!(timeout_ms(None), 0);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(10))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_millis(1500))), 1500);
        assert_eq!(
            timeout_ms(Some(Duration::from_secs(u64::MAX / 4))),
            i32::MAX
        );
    }

    #[test]
    fn owner_digest_is_keyed_by_the_token() {
        let a = owner_digest(Some("t1"), "alice");
        assert_eq!(a.len(), 64);
        assert_ne!(a, owner_digest(Some("t2"), "alice"));
        assert_ne!(a, owner_digest(Some("t1"), "bob"));
        assert_eq!(owner_digest(None, "alice"), owner_digest(Some(""), "alice"));
    }

    #[test]
    fn merged_rule_is_the_intersection() {
        let s = SoftwareRule {
            mode: "approved".into(),
            identities: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let c = SoftwareRule {
            mode: "approved".into(),
            identities: vec!["b".into(), "c".into()],
            ..Default::default()
        };
        let m = merge_rules(Some(&s), Some(&c)).ok().flatten();
        assert_eq!(
            m.map(|r| (r.mode, r.identities)),
            Some(("exact".into(), vec!["b".into()]))
        );
        let none = SoftwareRule {
            mode: "exact".into(),
            identities: vec!["z".into()],
            ..Default::default()
        };
        assert!(merge_rules(Some(&s), Some(&none)).is_err());
    }

    #[test]
    fn bad_trace_id_is_refused_locally() {
        assert!(trace_id("ok.id:1-2_3").is_ok());
        assert!(trace_id("no spaces").is_err());
        assert!(trace_id(&"x".repeat(65)).is_err());
    }
}
