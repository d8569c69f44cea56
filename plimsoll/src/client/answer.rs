//! A checked answer, and the checks that make it one.
//!
//! [`check_run`] applies, in the published client's order, every check on an answered
//! single run: the record (request digest, result digest, evidence, rule, own digest, no
//! session fields), the result's kind, and the tier against the floor. The same function
//! re-checks a saved answer offline ([`RunAnswer::verify`]), so `plimsoll verify` and the
//! live client cannot disagree.

use serde::{Deserialize, Serialize};

use super::error::{ClientError, data_loss, from_record_error};
use crate::payload::{Payload, PayloadKind};
use crate::record::{self, check_single};
use crate::tier::Floor;
use crate::wire::{
    CellResult, JavaScriptResult, ProjectResult, RunRecord, RunRequest, RunResponse, run_response,
};

/// A run's request as sent and its response as received, after every check passed.
///
/// It serializes as `{"request": …, "response": …}` in proto3 JSON, which is what
/// `plimsoll run --json` prints and `plimsoll verify` reads back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunAnswer {
    /// The request exactly as sent (its digest is the record's `request_sha256`).
    pub request: RunRequest,
    /// The response as received.
    pub response: RunResponse,
}

impl RunAnswer {
    /// The checked run record.
    pub fn record(&self) -> &RunRecord {
        // Every RunAnswer this module builds passed `check_single`, which requires a record;
        // a deserialized one without a record yields the default, which `verify` refuses.
        self.response
            .record
            .as_option()
            .unwrap_or_else(|| default_record())
    }

    /// The JavaScript result, if this was a snippet.
    pub fn javascript(&self) -> Option<&JavaScriptResult> {
        match &self.response.result {
            Some(run_response::Result::Javascript(j)) => Some(j),
            _ => None,
        }
    }

    /// The project result, if this was a project.
    pub fn project(&self) -> Option<&ProjectResult> {
        match &self.response.result {
            Some(run_response::Result::Project(p)) => Some(p),
            _ => None,
        }
    }

    /// The cell result, if this was a session cell.
    pub fn cell(&self) -> Option<&CellResult> {
        match &self.response.result {
            Some(run_response::Result::Cell(c)) => Some(c),
            _ => None,
        }
    }

    /// Re-checks a saved single-run answer offline, exactly as the live client checked it:
    /// the request digest is recomputed from the saved request, the floor and rule are the
    /// request's own.
    pub fn verify(&self) -> Result<&RunRecord, ClientError> {
        let Some(kind) = Payload::of_run(self.request.payload.as_ref()).kind() else {
            return Err(ClientError::RecordMismatch(data_loss(
                "the saved request has no payload",
            )));
        };
        let floor = Floor::parse(&self.request.minimum_isolation).map_err(|e| {
            ClientError::RecordMismatch(data_loss(format!("the saved request's floor: {e}")))
        })?;
        let digest = record::request_digest(&self.request);
        check_run(kind, &self.response, floor, || {
            check_single(
                &digest,
                self.request.software_rule.as_option(),
                &self.response,
            )
            .cloned()
        })?;
        Ok(self.record())
    }
}

fn default_record() -> &'static RunRecord {
    static EMPTY: std::sync::OnceLock<RunRecord> = std::sync::OnceLock::new();
    EMPTY.get_or_init(RunRecord::default)
}

/// The kind of result a response holds.
pub(crate) fn result_kind(resp: &RunResponse) -> Option<PayloadKind> {
    match &resp.result {
        Some(run_response::Result::Javascript(_)) => Some(PayloadKind::Javascript),
        Some(run_response::Result::Project(_)) => Some(PayloadKind::Project),
        Some(run_response::Result::Module(_)) => Some(PayloadKind::Module),
        Some(run_response::Result::Cell(_)) => Some(PayloadKind::Cell),
        None => None,
    }
}

/// The checks on an answered run, in the published client's order: the record (by
/// `check_record`), then the result's kind (a wrong kind wins over a record error), then
/// the record error, then the tier against the floor. Every failure is `data_loss` with the
/// response attached.
pub(crate) fn check_run(
    kind: PayloadKind,
    resp: &RunResponse,
    floor: Floor,
    check_record: impl FnOnce() -> Result<RunRecord, crate::record::RecordError>,
) -> Result<RunRecord, ClientError> {
    let checked = check_record();
    let got = result_kind(resp);
    if got != Some(kind) {
        return Err(ClientError::ResultKindMismatch(data_loss(format!(
            "the daemon answered a {} request with {} result",
            kind.as_str(),
            got.map_or("no", PayloadKind::as_str)
        )))
        .with_response(resp));
    }
    let rec = checked.map_err(|e| from_record_error(e).with_response(resp))?;
    check_floor(floor, &rec.isolation).map_err(|e| e.with_response(resp))?;
    Ok(rec)
}

/// The tier an answer states against the caller's floor: below it (or empty, or unknown)
/// is [`ClientError::IsolationEvidenceMismatch`], never retried.
pub(crate) fn check_floor(floor: Floor, isolation: &str) -> Result<(), ClientError> {
    if floor.is_met_by_wire(isolation) {
        return Ok(());
    }
    Err(ClientError::IsolationEvidenceMismatch(data_loss(format!(
        "result isolation {} is below the requested minimum {floor}; execution may have occurred",
        if isolation.is_empty() {
            "unknown"
        } else {
            isolation
        }
    ))))
}
