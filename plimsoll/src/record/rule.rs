//! The software rule's id, as a record states it (`records.md` §5), and whether a rule allows
//! an identity (`wire.md` §6.3).

use sha2::{Digest, Sha256};

use crate::wire::SoftwareRule;

/// The rule, unless it is "no rule": absent, or an empty mode with no identities (`wire.md` §6.3).
fn stated_rule(rule: Option<&SoftwareRule>) -> Option<&SoftwareRule> {
    rule.filter(|r| !(r.mode.is_empty() && r.identities.is_empty()))
}

/// The id a record states for the caller's software rule (`records.md` §5).
///
/// - `""` when there is no rule: `None`, or an empty mode with no identities.
/// - `exact:<identity>` whenever the rule has exactly one identity, whatever its mode (a
///   one-identity `approved` rule is `exact:` too).
/// - Otherwise `approved:sha256:` and the lowercase hex SHA-256 of the identities sorted
///   bytewise and joined with one `0x00` byte. The order sent does not matter here, unlike in
///   the request digest.
///
/// The rule is not validated: an invalid rule (a mode with no identities, duplicates) still
/// gets an id by the same formula, so check syntax first where it matters.
pub fn software_rule_id(rule: Option<&SoftwareRule>) -> String {
    let Some(rule) = stated_rule(rule) else {
        return String::new();
    };
    if let [only] = rule.identities.as_slice() {
        return format!("exact:{only}");
    }
    let mut sorted: Vec<&[u8]> = rule.identities.iter().map(|i| i.as_bytes()).collect();
    sorted.sort_unstable();
    let mut hasher = Sha256::new();
    for (n, identity) in sorted.iter().enumerate() {
        if n > 0 {
            hasher.update([0u8]);
        }
        hasher.update(identity);
    }
    format!("approved:sha256:{}", hex::encode(hasher.finalize()))
}

/// Whether `rule` allows the selected software `identity`.
///
/// No rule allows anything, including `""`. Otherwise the identity must be one of the rule's:
/// an `exact` rule allows its one identity and an `approved` rule any listed one. An empty
/// identity never satisfies a rule, even one that (invalidly) lists `""`.
pub fn rule_allows(rule: Option<&SoftwareRule>, identity: &str) -> bool {
    match stated_rule(rule) {
        None => true,
        Some(rule) => !identity.is_empty() && rule.identities.iter().any(|i| i == identity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(mode: &str, identities: &[&str]) -> SoftwareRule {
        SoftwareRule {
            mode: mode.into(),
            identities: identities.iter().map(|i| (*i).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn no_rule_and_empty_rule_have_empty_id() {
        assert_eq!(software_rule_id(None), "");
        assert_eq!(software_rule_id(Some(&rule("", &[]))), "");
    }

    #[test]
    fn exact_rule_id_is_its_identity() {
        assert_eq!(
            software_rule_id(Some(&rule("exact", &["img:a"]))),
            "exact:img:a"
        );
    }

    #[test]
    fn one_identity_approved_rule_is_exact() {
        assert_eq!(
            software_rule_id(Some(&rule("approved", &["img:a"]))),
            "exact:img:a"
        );
    }

    #[test]
    fn multi_identity_approved_id_hashes_sorted_nul_joined_identities() {
        let want = format!(
            "approved:sha256:{}",
            hex::encode(Sha256::digest(b"a\0b\0c"))
        );
        assert_eq!(
            software_rule_id(Some(&rule("approved", &["b", "a", "c"]))),
            want
        );
        assert_eq!(
            software_rule_id(Some(&rule("approved", &["c", "b", "a"]))),
            want
        );
        // Cross-checked with the published client's `SoftwareRule.rule_id`.
        assert_eq!(
            want,
            "approved:sha256:8badde10c760e9b702defb4b5e225de79c515b1d2a5cfb000e140f3c6fbb5629"
        );
    }

    #[test]
    fn sorting_is_bytewise_not_by_char_case() {
        // 'B' (0x42) sorts before 'a' (0x61) bytewise.
        let want = format!("approved:sha256:{}", hex::encode(Sha256::digest(b"B\0a")));
        assert_eq!(software_rule_id(Some(&rule("approved", &["a", "B"]))), want);
    }

    #[test]
    fn rules_allow_only_listed_non_empty_identities() {
        assert!(rule_allows(None, ""));
        assert!(rule_allows(Some(&rule("", &[])), "anything"));
        let exact = rule("exact", &["img:a"]);
        assert!(rule_allows(Some(&exact), "img:a"));
        assert!(!rule_allows(Some(&exact), "img:b"));
        assert!(!rule_allows(Some(&exact), ""));
        let approved = rule("approved", &["img:a", "img:b"]);
        assert!(rule_allows(Some(&approved), "img:b"));
        assert!(!rule_allows(Some(&approved), "img:c"));
        assert!(!rule_allows(Some(&rule("approved", &["", "img:a"])), ""));
    }
}
