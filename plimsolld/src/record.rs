//! Builds each answer's run record (records.md): the request and result digests, the
//! evidence fields and the record's own digest, for a single run and for each call of a
//! session, whose records form the session's hash chain.
//!
//! The clock rules of records.md §6 live here: the wall clock is read once, at handler entry
//! ([`Arrival::now`]); the end is that instant plus monotonic elapsed time.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use buffa::MessageField;
use plimsoll::record::{self, Stamp};
use plimsoll::wire::{RunRecord, RunRequest, RunResponse, SessionRunRequest};

use crate::session::Stated;

/// The moment a request reached its handler, on both clocks.
pub struct Arrival {
    /// Wall-clock ms since the Unix epoch at handler entry.
    pub started_unix_ms: i64,
    /// The monotonic instant of the same moment.
    pub started: Instant,
}

/// A session's hash chain so far (records.md §7): each sealed call, answered or not, is its
/// next link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Executed calls so far (unanswered ones included).
    pub sequence: u64,
    /// The last record's digest; "" before the first call.
    pub last_record: String,
}

// === impl Arrival ===

impl Arrival {
    /// Reads both clocks now.
    pub fn now() -> Arrival {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Arrival {
            started_unix_ms: wall,
            started: Instant::now(),
        }
    }

    /// Seals a single run's answer: canonicalises what will be sent, digests
    /// the request as received and the result as it will be sent, and
    /// attaches a version-4 record with no session fields.
    pub fn seal_single(
        &self,
        mut resp: RunResponse,
        req: &RunRequest,
        policy: &str,
    ) -> RunResponse {
        record::canonicalize_response(&mut resp);
        resp.instance = checked_instance(std::mem::take(&mut resp.instance));
        let stamp = Stamp {
            provider: resp.sandbox.clone(),
            isolation: resp.isolation.clone(),
            environment: resp.environment.clone(),
            policy: policy.to_owned(),
            software_identity: resp.software_identity.clone(),
            software_rule_id: record::software_rule_id(req.software_rule.as_option()),
            instance: resp.instance.clone(),
            started_unix_ms: self.started_unix_ms,
            elapsed: self.started.elapsed(),
            ..Stamp::default()
        };
        let sealed = record::seal(
            record::request_digest(req),
            record::result_digest(&resp),
            stamp,
        );
        resp.record = MessageField::some(sealed);
        resp
    }

    /// Seals a session call's answer as the next link of `chain`: like
    /// [`seal_single`](Self::seal_single), with the evidence the session's open stated and
    /// the session fields (fingerprint, sequence, previous digest).
    pub fn seal_call(
        &self,
        mut resp: RunResponse,
        req: &SessionRunRequest,
        stated: &Stated,
        chain: &mut Chain,
    ) -> RunResponse {
        record::canonicalize_response(&mut resp);
        let sealed = record::seal(
            record::session_request_digest(req),
            record::result_digest(&resp),
            self.call_stamp(req, stated, chain),
        );
        chain.advance(&sealed);
        resp.record = MessageField::some(sealed);
        resp
    }

    /// Seals the record of a session call that may have run but has no result (`code`: the
    /// Connect code its caller gets): it is the next link of `chain` all the same.
    pub fn seal_unanswered_call(
        &self,
        req: &SessionRunRequest,
        code: &str,
        stated: &Stated,
        chain: &mut Chain,
    ) -> RunRecord {
        let sealed = record::seal_unanswered(
            record::session_request_digest(req),
            code,
            self.call_stamp(req, stated, chain),
        );
        chain.advance(&sealed);
        sealed
    }

    fn call_stamp(&self, req: &SessionRunRequest, stated: &Stated, chain: &Chain) -> Stamp {
        Stamp {
            provider: stated.sandbox.to_owned(),
            isolation: stated.tier.as_str().to_owned(),
            environment: stated.environment.clone(),
            policy: stated.policy.clone(),
            software_identity: stated.software_identity.clone(),
            software_rule_id: record::software_rule_id(req.software_rule.as_option()),
            instance: stated.instance.clone(),
            started_unix_ms: self.started_unix_ms,
            elapsed: self.started.elapsed(),
            session: stated.fingerprint.clone(),
            sequence: chain.sequence + 1,
            previous_sha256: chain.last_record.clone(),
        }
    }
}

// === impl Chain ===

impl Chain {
    fn advance(&mut self, sealed: &RunRecord) {
        self.sequence += 1;
        self.last_record = sealed.record_sha256.clone();
    }
}

/// `instance` when it has the shape the published client accepts (records.md: `kind:id`,
/// the id at most 127 characters), else "" and a warning: a provider's odd sandbox id must
/// cost the answer its instance, not make every client reject it as `data_loss`.
pub fn checked_instance(instance: String) -> String {
    if record::valid_instance(&instance) {
        return instance;
    }
    tracing::warn!(
        length = instance.len(),
        "a sandbox instance the clients would refuse is left out of the answer and its record"
    );
    String::new()
}

#[cfg(test)]
mod tests {
    use super::checked_instance;

    #[test]
    fn an_instance_the_clients_would_refuse_is_left_out() {
        assert_eq!(checked_instance("e2b:i0abc".to_owned()), "e2b:i0abc");
        assert_eq!(checked_instance(String::new()), "");
        let long = format!("dockercloud:{}", "a".repeat(128));
        assert_eq!(checked_instance(long), "");
        assert_eq!(checked_instance("no-kind-here".to_owned()), "");
    }
}
