//! What a client re-checks in every record it receives (`records.md` §8, at version 4).
//!
//! Each check recomputes something the caller knows independently (the request it sent, the
//! response it decoded, its own rule and chain) and compares it with what the record states.
//! Any failure means the answer cannot be trusted; clients report it as `data_loss`.

use super::digest::{record_digest, result_digest};
use super::rule::{rule_allows, software_rule_id};
use super::{RECORD_VERSION, UNANSWERED_CODES};
use crate::wire::{RunRecord, RunResponse, SoftwareRule};

/// Why a record does not match what the caller can recompute. One variant per check; each
/// names what the record states and what it should have stated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The response carries no record at all.
    #[error("run record: the response carries no run record")]
    NoRecord,
    /// The record is not the version this build reads and the daemon must emit.
    #[error("{}", version_problem(*found))]
    Version {
        /// The version the record states.
        found: u32,
    },
    /// An answered call's record states an unanswered error code.
    #[error("run record: an answered call's record states unanswered code {code:?}")]
    Unanswered {
        /// The code the record states.
        code: String,
    },
    /// The request digest is not the digest of the request the caller sent.
    #[error("run record: request digest {record}, the request sent digests to {computed}")]
    RequestDigest {
        /// What the record states.
        record: String,
        /// The caller's own recomputation.
        computed: String,
    },
    /// The result digest is not the digest of the result received.
    #[error("run record: result digest {record}, the result received digests to {computed}")]
    ResultDigest {
        /// What the record states.
        record: String,
        /// The caller's recomputation over the response.
        computed: String,
    },
    /// The record names another provider than the response's `sandbox`.
    #[error("run record: the record names provider {record:?}, the response {response:?}")]
    Provider {
        /// What the record states.
        record: String,
        /// `RunResponse.sandbox`.
        response: String,
    },
    /// The record states another tier than the response's `isolation`.
    #[error("run record: the record states isolation {record:?}, the response {response:?}")]
    Isolation {
        /// What the record states.
        record: String,
        /// `RunResponse.isolation`.
        response: String,
    },
    /// The record's environment differs from the response's.
    #[error("run record: the record states environment {record:?}, the response {response:?}")]
    Environment {
        /// What the record states.
        record: String,
        /// `RunResponse.environment`.
        response: String,
    },
    /// The record's instance differs from the response's.
    #[error("run record: the record states instance {record:?}, the response {response:?}")]
    Instance {
        /// What the record states.
        record: String,
        /// `RunResponse.instance`.
        response: String,
    },
    /// The record's instance is neither `""` nor a typed reference.
    #[error("run record: instance {instance:?} is not a typed reference (kind:id)")]
    InstanceForm {
        /// What the record states.
        instance: String,
    },
    /// The record's software identity differs from the response's.
    #[error("run record: the record states software {record:?}, the response {response:?}")]
    SoftwareIdentity {
        /// What the record states.
        record: String,
        /// `RunResponse.software_identity`.
        response: String,
    },
    /// The record's rule id is not the id of the rule the caller sent.
    #[error(
        "run record: the record states software rule {record:?}, the request's is {expected:?}"
    )]
    SoftwareRuleId {
        /// What the record states.
        record: String,
        /// The id of the caller's own rule.
        expected: String,
    },
    /// The software the record states is not allowed by the caller's rule.
    #[error("run record: software {identity:?} is not allowed by rule {rule_id:?}")]
    SoftwareNotAllowed {
        /// The identity the record states.
        identity: String,
        /// The id of the caller's rule.
        rule_id: String,
    },
    /// The record's own digest does not match its fields.
    #[error("run record: record digest {record}, its fields digest to {computed}")]
    RecordDigest {
        /// What the record states as `record_sha256`.
        record: String,
        /// The recomputation over its fields.
        computed: String,
    },
    /// A single run's record carries session fields.
    #[error(
        "run record: a single run's record carries session fields \
         (session {session:?}, sequence {sequence}, previous {previous:?})"
    )]
    SessionFields {
        /// The stated session fingerprint.
        session: String,
        /// The stated sequence.
        sequence: u64,
        /// The stated previous digest.
        previous: String,
    },
    /// An unanswered call's record states a result digest.
    #[error("run record: an unanswered call's record states result digest {result}")]
    UnansweredResult {
        /// The result digest it states.
        result: String,
    },
    /// An unanswered call's record states no Connect error code, or an unknown one.
    #[error("run record: an unanswered call's record states {code:?}, not a Connect error code")]
    UnansweredCode {
        /// The code it states.
        code: String,
    },
    /// A session call's record names another session.
    #[error("run record: the record names session {record:?}, the call's is {expected:?}")]
    Session {
        /// What the record states.
        record: String,
        /// The fingerprint of the caller's session.
        expected: String,
    },
    /// A session call's record is not the next in the chain.
    #[error("run record: the record states sequence {record}, the chain expects {expected}")]
    Sequence {
        /// What the record states.
        record: u64,
        /// The caller's last sequence plus one (saturating).
        expected: u64,
    },
    /// A session call's record does not link to the previous record.
    #[error("run record: the record links to {record:?}, the previous record is {expected:?}")]
    Previous {
        /// What the record states.
        record: String,
        /// The caller's last `record_sha256`.
        expected: String,
    },
}

fn version_problem(found: u32) -> String {
    // A live answer must carry the current version; an older or newer one is a version
    // skew to report as such, never called forged.
    if found > RECORD_VERSION {
        format!(
            "run record: a newer daemon answered with record version {found}; \
             this build reads version {RECORD_VERSION}: upgrade the client"
        )
    } else {
        format!(
            "run record: the daemon answered with record version {found}; \
             this build requires version {RECORD_VERSION} of a live answer"
        )
    }
}

/// Whether `instance` is a record's valid instance: `""` (the provider names none) or a typed
/// reference matching `[a-z][a-z0-9-]{0,31}:[A-Za-z0-9._:-]{1,127}` in full, such as
/// `k8s-pod-uid:` and a pod's UID. ASCII only.
pub fn valid_instance(instance: &str) -> bool {
    if instance.is_empty() {
        return true;
    }
    // The kind cannot contain ':', so the first ':' is the separator.
    let Some((kind, id)) = instance.split_once(':') else {
        return false;
    };
    let kind_ok = matches!(kind.as_bytes().first(), Some(b'a'..=b'z'))
        && kind.len() <= 32
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let id_ok = (1..=127).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    kind_ok && id_ok
}

/// Checks the record of an answered call against what the caller knows, in the order of
/// `records.md` §8 at version 4, and returns the record.
///
/// `req_digest` is the caller's own [`request_digest`](super::request_digest) (or
/// [`session_request_digest`](super::session_request_digest)) of the request it sent, and
/// `rule` the software rule it sent (for a session call, the merged rule). The checks:
/// version is [`RECORD_VERSION`]; `unanswered` empty; request digest; result digest over
/// `resp`; provider and isolation equal `resp.sandbox` and `resp.isolation`; environment;
/// instance equal to `resp.instance` and [`valid_instance`]; software identity equal to the
/// response's, rule id equal to the rule's and the identity allowed by the rule; own digest.
///
/// This does not check the tier against the caller's floor, the session chain
/// ([`check_chain`]) or the absence of session fields on a single run ([`check_single`]).
pub fn check<'a>(
    req_digest: &str,
    rule: Option<&SoftwareRule>,
    resp: &'a RunResponse,
) -> Result<&'a RunRecord, RecordError> {
    let rec = resp.record.as_option().ok_or(RecordError::NoRecord)?;
    if rec.version != RECORD_VERSION {
        return Err(RecordError::Version { found: rec.version });
    }
    if !rec.unanswered.is_empty() {
        return Err(RecordError::Unanswered {
            code: rec.unanswered.clone(),
        });
    }
    check_request_digest(rec, req_digest)?;
    let result = result_digest(resp);
    if rec.result_sha256 != result {
        return Err(RecordError::ResultDigest {
            record: rec.result_sha256.clone(),
            computed: result,
        });
    }
    same(&rec.provider, &resp.sandbox, |record, response| {
        RecordError::Provider { record, response }
    })?;
    same(&rec.isolation, &resp.isolation, |record, response| {
        RecordError::Isolation { record, response }
    })?;
    same(&rec.environment, &resp.environment, |record, response| {
        RecordError::Environment { record, response }
    })?;
    same(&rec.instance, &resp.instance, |record, response| {
        RecordError::Instance { record, response }
    })?;
    check_instance_form(rec)?;
    same(
        &rec.software_identity,
        &resp.software_identity,
        |record, response| RecordError::SoftwareIdentity { record, response },
    )?;
    check_rule(rec, rule)?;
    check_own_digest(rec)?;
    Ok(rec)
}

/// [`check`] for a single `Run`: additionally, the record carries no session fields
/// (`session` `""`, `sequence` 0, `previous_sha256` `""`).
pub fn check_single<'a>(
    req_digest: &str,
    rule: Option<&SoftwareRule>,
    resp: &'a RunResponse,
) -> Result<&'a RunRecord, RecordError> {
    let rec = check(req_digest, rule, resp)?;
    if !rec.session.is_empty() || rec.sequence != 0 || !rec.previous_sha256.is_empty() {
        return Err(RecordError::SessionFields {
            session: rec.session.clone(),
            sequence: rec.sequence,
            previous: rec.previous_sha256.clone(),
        });
    }
    Ok(rec)
}

/// Checks the record inside an `UnansweredCall` error (`records.md` §8.10, at version 4):
/// version, a valid instance, no result digest, a Connect error code other than `ok`, the
/// request digest, the rule id and that the rule allows the stated software, and the own
/// digest.
///
/// It does not check the tier against the floor, the chain ([`check_chain`]), or that
/// provider, isolation and software identity equal what the session stated at open; the
/// session holds those and compares them itself.
pub fn check_unanswered(
    req_digest: &str,
    rule: Option<&SoftwareRule>,
    rec: &RunRecord,
) -> Result<(), RecordError> {
    if rec.version != RECORD_VERSION {
        return Err(RecordError::Version { found: rec.version });
    }
    check_instance_form(rec)?;
    if !rec.result_sha256.is_empty() {
        return Err(RecordError::UnansweredResult {
            result: rec.result_sha256.clone(),
        });
    }
    if !UNANSWERED_CODES.contains(&rec.unanswered.as_str()) {
        return Err(RecordError::UnansweredCode {
            code: rec.unanswered.clone(),
        });
    }
    check_request_digest(rec, req_digest)?;
    check_rule(rec, rule)?;
    check_own_digest(rec)
}

/// Checks a session call's place in its chain (`records.md` §7, §8.8): `session` equals the
/// caller's fingerprint, `sequence` is `last_sequence + 1` and `previous_sha256` equals
/// `last_sha256` (`""` before the first call, when `last_sequence` is 0).
///
/// Use after [`check`] or [`check_unanswered`]; unanswered calls count in the chain too.
pub fn check_chain(
    rec: &RunRecord,
    session: &str,
    last_sequence: u64,
    last_sha256: &str,
) -> Result<(), RecordError> {
    same(&rec.session, session, |record, expected| {
        RecordError::Session { record, expected }
    })?;
    // After u64::MAX no next record can exist, so every record there is refused.
    let expected = last_sequence.saturating_add(1);
    if last_sequence == u64::MAX || rec.sequence != expected {
        return Err(RecordError::Sequence {
            record: rec.sequence,
            expected,
        });
    }
    same(&rec.previous_sha256, last_sha256, |record, expected| {
        RecordError::Previous { record, expected }
    })
}

fn same(
    record: &str,
    other: &str,
    error: impl FnOnce(String, String) -> RecordError,
) -> Result<(), RecordError> {
    if record == other {
        Ok(())
    } else {
        Err(error(record.to_owned(), other.to_owned()))
    }
}

fn check_request_digest(rec: &RunRecord, req_digest: &str) -> Result<(), RecordError> {
    same(&rec.request_sha256, req_digest, |record, computed| {
        RecordError::RequestDigest { record, computed }
    })
}

fn check_instance_form(rec: &RunRecord) -> Result<(), RecordError> {
    if valid_instance(&rec.instance) {
        Ok(())
    } else {
        Err(RecordError::InstanceForm {
            instance: rec.instance.clone(),
        })
    }
}

fn check_rule(rec: &RunRecord, rule: Option<&SoftwareRule>) -> Result<(), RecordError> {
    let rule_id = software_rule_id(rule);
    if rec.software_rule_id != rule_id {
        return Err(RecordError::SoftwareRuleId {
            record: rec.software_rule_id.clone(),
            expected: rule_id,
        });
    }
    if !rule_allows(rule, &rec.software_identity) {
        return Err(RecordError::SoftwareNotAllowed {
            identity: rec.software_identity.clone(),
            rule_id,
        });
    }
    Ok(())
}

fn check_own_digest(rec: &RunRecord) -> Result<(), RecordError> {
    let computed = record_digest(rec);
    if rec.record_sha256 == computed {
        Ok(())
    } else {
        Err(RecordError::RecordDigest {
            record: rec.record_sha256.clone(),
            computed,
        })
    }
}
