//! The terms an open asks for, checked and settled (wire.md §7.2): the owner, the lifetime
//! and idle timeout (which a request can only shorten), the language hints, and the rule a
//! later call must restate.

use std::time::Duration;

use plimsoll::record::software_rule_id;
use plimsoll::refusal::Refusal;
use plimsoll::validate::LANGUAGES;
use plimsoll::wire::SoftwareRule;

/// The idle timeout no session goes below.
pub const MIN_IDLE: Duration = Duration::from_secs(1);
/// When a session with no idle timeout counts as unclaimed.
pub const UNCLAIMED_WITHOUT_IDLE: Duration = Duration::from_secs(5 * 60);

/// The owner as stated: empty means none; otherwise 1–64 bytes of `[A-Za-z0-9._:-]`, treated
/// as opaque.
pub fn check_owner(owner: &str) -> Result<(), Refusal> {
    let ok = owner.is_empty()
        || (owner.len() <= 64
            && owner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(Refusal::InvalidRequest(
            "owner must be 1 to 64 characters of [A-Za-z0-9._:-]".to_owned(),
        ))
    }
}

/// The session's lifetime: the daemon's, or the request's when it is shorter.
pub fn lifetime(requested_ms: u32, daemon: Duration) -> Duration {
    match requested_ms {
        0 => daemon,
        ms => Duration::from_millis(u64::from(ms)).min(daemon),
    }
}

/// The session's idle timeout: the daemon's, or the request's when it is shorter (a daemon
/// value of 0 means never, so any stated value is shorter); never below [`MIN_IDLE`].
pub fn idle(requested_ms: u32, daemon: Duration) -> Duration {
    let requested = Duration::from_millis(u64::from(requested_ms));
    match (requested_ms, daemon.is_zero()) {
        (0, _) => daemon,
        (_, true) => requested.max(MIN_IDLE),
        (_, false) => requested.min(daemon).max(MIN_IDLE),
    }
}

/// The hinted languages the environment runs: unknown names are refused, known ones the
/// environment lacks are dropped, and no hint means every language it runs.
pub fn languages(hints: &[String], available: &[String]) -> Result<Vec<String>, Refusal> {
    if let Some(bad) = hints.iter().find(|l| !LANGUAGES.contains(&l.as_str())) {
        return Err(Refusal::InvalidRequest(format!(
            "languages: {bad:?} is unknown: use javascript or python"
        )));
    }
    if hints.is_empty() {
        return Ok(available.to_vec());
    }
    Ok(available
        .iter()
        .filter(|l| hints.contains(l))
        .cloned()
        .collect())
}

/// A call must restate the open's rule: its own rule's id must equal the id of the merge
/// (intersection) of the open's rule and its own.
pub fn check_call_rule(
    open: Option<&SoftwareRule>,
    call: Option<&SoftwareRule>,
) -> Result<(), Refusal> {
    let open_id = software_rule_id(open);
    let call_id = software_rule_id(call);
    if open_id.is_empty() {
        return Ok(());
    }
    let refused = || {
        Refusal::InvalidRequest(
            "the call's software rule must restate the session's (the merge of the open's rule and the call's own); nothing ran"
                .to_owned(),
        )
    };
    let (Some(open), Some(call)) = (open, call) else {
        return Err(refused());
    };
    if call_id.is_empty() {
        return Err(refused());
    }
    let shared: Vec<String> = call
        .identities
        .iter()
        .filter(|i| open.identities.contains(i))
        .cloned()
        .collect();
    let merged = SoftwareRule {
        mode: if shared.len() == 1 {
            "exact"
        } else {
            "approved"
        }
        .to_owned(),
        identities: shared,
        ..Default::default()
    };
    if merged.identities.is_empty() || software_rule_id(Some(&merged)) != call_id {
        return Err(refused());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn rule(ids: &[&str]) -> SoftwareRule {
        SoftwareRule {
            mode: if ids.len() == 1 { "exact" } else { "approved" }.to_owned(),
            identities: ids.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn owners_are_opaque_but_bounded() {
        assert!(check_owner("").is_ok());
        assert!(check_owner(&"a".repeat(64)).is_ok());
        assert!(check_owner("team.a:b-c_d").is_ok());
        assert!(check_owner(&"a".repeat(65)).is_err());
        assert!(check_owner("has space").is_err());
        assert!(check_owner("é").is_err());
    }

    #[test]
    fn a_request_can_only_shorten_lifetime_and_idle() {
        let day = Duration::from_secs(1800);
        assert_eq!(lifetime(0, day), day);
        assert_eq!(lifetime(2_000, day), Duration::from_secs(2));
        assert_eq!(lifetime(u32::MAX, day), day);
        let five = Duration::from_secs(300);
        assert_eq!(idle(0, five), five);
        assert_eq!(idle(10, five), MIN_IDLE);
        assert_eq!(idle(2_000, five), Duration::from_secs(2));
        assert_eq!(idle(900_000, five), five);
        assert_eq!(idle(0, Duration::ZERO), Duration::ZERO);
        assert_eq!(idle(3_000, Duration::ZERO), Duration::from_secs(3));
    }

    #[test]
    fn language_hints_refuse_unknown_and_drop_missing() {
        let both = vec!["javascript".to_owned(), "python".to_owned()];
        let js = vec!["javascript".to_owned()];
        assert_eq!(languages(&[], &both).unwrap(), both);
        assert_eq!(
            languages(&["python".to_owned()], &js).unwrap(),
            Vec::<String>::new()
        );
        assert!(languages(&["ruby".to_owned()], &both).is_err());
    }

    #[test]
    fn a_call_must_restate_the_open_rule() {
        let open = rule(&["a", "b"]);
        assert!(check_call_rule(None, None).is_ok());
        assert!(check_call_rule(None, Some(&rule(&["x"]))).is_ok());
        assert!(check_call_rule(Some(&open), None).is_err());
        assert!(check_call_rule(Some(&open), Some(&rule(&["a", "b"]))).is_ok());
        assert!(check_call_rule(Some(&open), Some(&rule(&["a"]))).is_ok());
        assert!(check_call_rule(Some(&open), Some(&rule(&["a", "x"]))).is_err());
        assert!(check_call_rule(Some(&open), Some(&rule(&["x"]))).is_err());
    }
}
