//! Building the record the daemon sends: the evidence of one call, stamped with its clock and
//! chain position, with its own digest set.

use std::time::Duration;

use super::RECORD_VERSION;
use super::digest::record_digest;
use crate::wire::RunRecord;

/// Everything a record states besides its two digests: the evidence a call ran under, its
/// clock, and its place in a session's chain.
///
/// For a single run, `session` is `""`, `sequence` 0 and `previous_sha256` `""`
/// (`records.md` §7). `Stamp::default()` is a single run with every field empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// Provider id; equals `RunResponse.sandbox`.
    pub provider: String,
    /// Tier the call ran at; equals `RunResponse.isolation`.
    pub isolation: String,
    /// The content-addressed outer image or interpreter actually selected; equals
    /// `RunResponse.environment`.
    pub environment: String,
    /// Verified sandbox policy digest, or `""`.
    pub policy: String,
    /// Selected executable manifest identity; equals `RunResponse.software_identity`.
    pub software_identity: String,
    /// The caller's rule id, from [`software_rule_id`](super::software_rule_id).
    pub software_rule_id: String,
    /// The sandbox instance that ran the call as a typed reference
    /// (`k8s-pod-uid:<uid>`), or `""`; equals `RunResponse.instance`.
    pub instance: String,
    /// Wall-clock ms at handler entry, read once.
    pub started_unix_ms: i64,
    /// Time since handler entry on a monotonic clock; never a second wall-clock reading.
    pub elapsed: Duration,
    /// Session fingerprint ([`session_fingerprint`](super::session_fingerprint)), or `""`.
    pub session: String,
    /// 1, 2, … within a session, unanswered calls included; 0 for single runs.
    pub sequence: u64,
    /// The previous call's `record_sha256`; `""` on sequence 1 and for single runs.
    pub previous_sha256: String,
}

/// A version-[`RECORD_VERSION`] record of an answered call, with `record_sha256` set.
///
/// `ended_unix_ms` is `started_unix_ms` plus `elapsed` in whole milliseconds (truncated),
/// saturating at `i64::MAX`, so it is never before `started_unix_ms`. `unanswered` is `""`.
///
/// This does not check the stamp (a valid instance form, matching evidence); the caller
/// builds the response from the same values.
pub fn seal(request_sha256: String, result_sha256: String, stamp: Stamp) -> RunRecord {
    build(request_sha256, result_sha256, String::new(), stamp)
}

/// A version-[`RECORD_VERSION`] record of a session call that may have run but ended in an
/// error, with `record_sha256` set: `result_sha256` is `""` and `unanswered` is `code`.
///
/// `code` is the error's Connect code string (`deadline_exceeded`, `internal`, …); see
/// [`UNANSWERED_CODES`](super::UNANSWERED_CODES). It is not checked here, and `ok` or `""`
/// would make a record clients refuse. The record counts in the session's chain.
pub fn seal_unanswered(request_sha256: String, code: &str, stamp: Stamp) -> RunRecord {
    build(request_sha256, String::new(), code.to_owned(), stamp)
}

fn build(
    request_sha256: String,
    result_sha256: String,
    unanswered: String,
    stamp: Stamp,
) -> RunRecord {
    let mut record = RunRecord {
        version: RECORD_VERSION,
        request_sha256,
        result_sha256,
        unanswered,
        provider: stamp.provider,
        isolation: stamp.isolation,
        environment: stamp.environment,
        policy: stamp.policy,
        software_identity: stamp.software_identity,
        software_rule_id: stamp.software_rule_id,
        instance: stamp.instance,
        started_unix_ms: stamp.started_unix_ms,
        ended_unix_ms: ended_unix_ms(stamp.started_unix_ms, stamp.elapsed),
        session: stamp.session,
        sequence: stamp.sequence,
        previous_sha256: stamp.previous_sha256,
        ..Default::default()
    };
    record.record_sha256 = record_digest(&record);
    record
}

/// `started + elapsed` in ms; elapsed is never negative, so saturating keeps `ended ≥ started`.
fn ended_unix_ms(started_unix_ms: i64, elapsed: Duration) -> i64 {
    let elapsed_ms = i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
    started_unix_ms.saturating_add(elapsed_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            provider: "docker".into(),
            isolation: "kernel".into(),
            environment: "docker-image:sha256:01".into(),
            software_identity: "img:a".into(),
            software_rule_id: "exact:img:a".into(),
            instance: "k8s-pod-uid:abc".into(),
            started_unix_ms: 1_790_000_000_000,
            elapsed: Duration::from_micros(812_999),
            ..Default::default()
        }
    }

    #[test]
    fn seal_emits_current_version_with_its_own_digest() {
        let rec = seal("aa".into(), "bb".into(), stamp());
        assert_eq!(rec.version, RECORD_VERSION);
        assert_eq!(rec.version, 4);
        assert_eq!(rec.request_sha256, "aa");
        assert_eq!(rec.result_sha256, "bb");
        assert_eq!(rec.unanswered, "");
        assert_eq!(rec.instance, "k8s-pod-uid:abc");
        assert_eq!(rec.record_sha256, record_digest(&rec));
    }

    #[test]
    fn ended_is_started_plus_whole_elapsed_ms() {
        let rec = seal("aa".into(), "bb".into(), stamp());
        assert_eq!(rec.ended_unix_ms, 1_790_000_000_812);
    }

    #[test]
    fn ended_never_precedes_started_even_at_the_limits() {
        let zero = Stamp {
            elapsed: Duration::ZERO,
            ..stamp()
        };
        let rec = seal("aa".into(), "bb".into(), zero);
        assert_eq!(rec.ended_unix_ms, rec.started_unix_ms);

        let huge = Stamp {
            started_unix_ms: i64::MAX - 5,
            elapsed: Duration::from_secs(u64::MAX),
            ..stamp()
        };
        let rec = seal("aa".into(), "bb".into(), huge);
        assert_eq!(rec.ended_unix_ms, i64::MAX);
        assert!(rec.ended_unix_ms >= rec.started_unix_ms);

        let negative = Stamp {
            started_unix_ms: -10,
            elapsed: Duration::from_millis(3),
            ..stamp()
        };
        assert_eq!(seal("aa".into(), "bb".into(), negative).ended_unix_ms, -7);
    }

    #[test]
    fn unanswered_record_has_no_result_and_states_the_code() {
        let chained = Stamp {
            session: "5947".into(),
            sequence: 2,
            previous_sha256: "cc".into(),
            ..stamp()
        };
        let rec = seal_unanswered("aa".into(), "deadline_exceeded", chained);
        assert_eq!(rec.version, RECORD_VERSION);
        assert_eq!(rec.result_sha256, "");
        assert_eq!(rec.unanswered, "deadline_exceeded");
        assert_eq!(rec.sequence, 2);
        assert_eq!(rec.record_sha256, record_digest(&rec));
    }

    #[test]
    fn any_field_change_breaks_the_sealed_digest() {
        let rec = seal("aa".into(), "bb".into(), stamp());
        let mut tampered = rec.clone();
        tampered.instance = "k8s-pod-uid:other".into();
        assert_ne!(record_digest(&tampered), rec.record_sha256);
        let mut tampered = rec.clone();
        tampered.ended_unix_ms += 1;
        assert_ne!(record_digest(&tampered), rec.record_sha256);
    }
}
