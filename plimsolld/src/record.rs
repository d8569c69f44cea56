//! Builds each answer's run record (records.md): the request and result
//! digests, the evidence fields and the record's own digest.
//!
//! The clock rules of records.md §6 live here: the wall clock is read once,
//! at handler entry; the end is that instant plus monotonic elapsed time.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use plimsoll::record::{self, Stamp};
use plimsoll::wire::{RunRequest, RunResponse};

/// The moment a request reached its handler, on both clocks.
pub struct Answer {
    /// Wall-clock ms since the Unix epoch at handler entry.
    pub started_unix_ms: i64,
    /// The monotonic instant of the same moment.
    pub started: Instant,
}

impl Answer {
    /// Reads both clocks now.
    pub fn arrived() -> Answer {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Answer {
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
        resp.record = buffa::MessageField::some(sealed);
        resp
    }
}
