//! What can go wrong with a call, and whether anything ran.
//!
//! Every failure is a [`ClientError`]. Its variant says what kind of failure it is (the same
//! kinds the published Python client raises); the [`Failure`] inside says the Connect code,
//! the message and, above all, [`Failure::not_dispatched`]: set only when the daemon stated
//! (or this client knows) that nothing ran. An error without a mark may follow execution and
//! is never a safe automatic retry.

use std::fmt;

use super::SessionAnswer;
use crate::refusal::{Reason, Refusal};
use crate::wire::{CloseSessionResponse, DescribeResponse, RunRecord, RunResponse, SessionEnd};

/// The not-dispatched mark of a refusal: proof that nothing ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mark {
    /// A reason from the table of wire.md §8.3.
    Reason(Reason),
    /// The daemon marked the answer with a reason number this client has no name for: still
    /// a statement that nothing ran.
    Unknown,
}

impl Mark {
    /// The mark as clients and the `Plimsoll-Not-Dispatched` header spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Reason(r) => r.as_str(),
            Mark::Unknown => "unknown",
        }
    }

    /// Reads a reason by its short name (`request`, `permission`, …); `unknown` and anything
    /// else is no mark.
    pub fn from_name(name: &str) -> Option<Mark> {
        Reason::from_name(name).map(Mark::Reason)
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything one failure states: the Connect code, the message, the mark, and what was
/// received with it.
#[derive(Debug, Clone, Default)]
pub struct Failure {
    /// The Connect code, snake_case (`failed_precondition`, `data_loss`, …), as the daemon
    /// sent it or as this client assigned it.
    pub code: String,
    /// A sentence for a person. It never holds the token or a session id.
    pub message: String,
    /// Set only when nothing ran: the daemon's `NotDispatched` detail (or, for an answer
    /// written before any handler, its `Plimsoll-Not-Dispatched` header), or this client's
    /// own refusal before sending. Never set on an answer that was not bound to the request.
    pub not_dispatched: Option<Mark>,
    /// The HTTP status of the daemon's answer; `None` when there was none.
    pub http_status: Option<u16>,
    /// The answer did not carry this request's `Plimsoll-Request-Id` back, so nothing it
    /// said about the call was believed.
    pub answer_not_bound: bool,
    /// The record of a session call that may have run but ended in an error
    /// (`UnansweredCall`). Once the session has checked it and moved its chain on,
    /// [`Failure::unanswered_checked`] is true.
    pub unanswered: Option<Box<RunRecord>>,
    /// Whether [`Failure::unanswered`] was checked and counted in the session's chain.
    pub unanswered_checked: bool,
    /// That checked unanswered call as a saved call: its request as sent and its record
    /// (the request carries the session id; [`SessionAnswer`]'s `Debug` leaves it out).
    pub unanswered_call: Option<Box<SessionAnswer>>,
    /// For `SessionEnded`: why the session ended and the daemon's detail.
    pub session_end: Option<(SessionEnd, String)>,
    /// For a data-loss error on a run: the response as it was received, so the caller can
    /// see what came back (it did not check).
    pub response: Option<Box<RunResponse>>,
    /// For `ProtocolMismatch` raised by `describe`: what the daemon described.
    pub describe: Option<Box<DescribeResponse>>,
    /// For a `Chain` error at close: the daemon's summary.
    pub close: Option<Box<CloseSessionResponse>>,
}

impl Failure {
    /// A failure with `code` and `message` and nothing else.
    pub fn new(code: &str, message: impl Into<String>) -> Failure {
        Failure {
            code: code.to_owned(),
            message: message.into(),
            ..Failure::default()
        }
    }

    /// The same failure, marked as not dispatched for `reason`.
    pub fn marked(mut self, reason: Reason) -> Failure {
        self.not_dispatched = Some(Mark::Reason(reason));
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Every way a call can fail. The variants mirror the published client's error classes;
/// the doc of each says which code it carries and whether it can be marked.
///
/// The `data_loss` variants ([`ClientError::is_data_loss`]) mean the daemon answered and
/// the answer does not check: the run may already have executed, so they are never a
/// retry signal.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not an absolute http(s) URL without userinfo, query or fragment
    /// (`invalid_argument`, nothing sent).
    #[error("{0}")]
    InvalidBaseUrl(Box<Failure>),
    /// Cleartext HTTP to a host that is not loopback without the explicit opt-in
    /// (`invalid_argument`, nothing sent).
    #[error("{0}")]
    InsecureHttp(Box<Failure>),
    /// A client option is unusable: a token that is not visible ASCII, an unreadable CA
    /// file, a zero timeout (`invalid_argument`, nothing sent).
    #[error("{0}")]
    InvalidOption(Box<Failure>),
    /// The request is malformed or out of bounds: refused by this client before sending
    /// (marked `request`) or by the daemon (`invalid_argument`).
    #[error("{0}")]
    InvalidRequest(Box<Failure>),
    /// The daemon's current tier is below the request's floor; nothing ran.
    #[error("{0}")]
    InsufficientIsolation(Box<Failure>),
    /// The software the daemon would run is outside the request's rule; nothing ran.
    #[error("{0}")]
    SoftwareMismatch(Box<Failure>),
    /// The daemon's provider runs nothing (`failed_precondition`).
    #[error("{0}")]
    Disabled(Box<Failure>),
    /// The provider cannot do it, or sessions are off (`unimplemented`).
    #[error("{0}")]
    Unsupported(Box<Failure>),
    /// The daemon serves another protocol number: refused by the daemon, or found by
    /// `describe` (which attaches the description in [`Failure::describe`]).
    #[error("{0}")]
    ProtocolMismatch(Box<Failure>),
    /// Shed by admission or a rate limit; retry later (`resource_exhausted`, `capacity`).
    #[error("{0}")]
    AtCapacity(Box<Failure>),
    /// The session has ended ([`Failure::session_end`] says why), or this client already
    /// closed it.
    #[error("{0}")]
    SessionEnded(Box<Failure>),
    /// No usable answer: the connection failed, or the answer is not a Connect answer.
    /// Marked `environment` only when it failed before any byte of the request left.
    #[error("{0}")]
    Transport(Box<Failure>),
    /// The exchange did not finish within the client's request timeout.
    #[error("{0}")]
    Timeout(Box<Failure>),
    /// The answer is larger than 32 MiB.
    #[error("{0}")]
    ResponseTooLarge(Box<Failure>),
    /// The answer is not a well-formed message of the expected type (`internal`).
    #[error("{0}")]
    MalformedResponse(Box<Failure>),
    /// A success answer without this request's `Plimsoll-Request-Id`: it may have run, and
    /// nothing it says is believed (`data_loss`).
    #[error("{0}")]
    AnswerNotBound(Box<Failure>),
    /// The run record does not match the request sent or the result received (`data_loss`).
    #[error("{0}")]
    RecordMismatch(Box<Failure>),
    /// The answer carries no run record (`data_loss`).
    #[error("{0}")]
    NoRecord(Box<Failure>),
    /// The record's version is not the one this client reads (`data_loss`).
    #[error("{0}")]
    RecordVersion(Box<Failure>),
    /// A session's chain is broken: a call this client did not make ran in the session, or a
    /// record was dropped, replayed or reordered (`data_loss`).
    #[error("{0}")]
    Chain(Box<Failure>),
    /// The tier the answer states is below the request's floor (`data_loss`; the run may
    /// have executed at the weaker tier).
    #[error("{0}")]
    IsolationEvidenceMismatch(Box<Failure>),
    /// A session opened on software outside the requested rule (`data_loss`).
    #[error("{0}")]
    SoftwareEvidenceMismatch(Box<Failure>),
    /// The answer holds a result of another kind than the request, or none (`data_loss`).
    #[error("{0}")]
    ResultKindMismatch(Box<Failure>),
    /// Any other answer: its code is in [`Failure::code`] (`unauthenticated`,
    /// `permission_denied`, `not_found`, `internal`, …).
    #[error("{0}")]
    Other(Box<Failure>),
}

/// Every variant carries one [`Failure`]; this names them once for the accessors.
macro_rules! the_failure {
    ($error:expr, $f:ident) => {
        match $error {
            ClientError::InvalidBaseUrl($f)
            | ClientError::InsecureHttp($f)
            | ClientError::InvalidOption($f)
            | ClientError::InvalidRequest($f)
            | ClientError::InsufficientIsolation($f)
            | ClientError::SoftwareMismatch($f)
            | ClientError::Disabled($f)
            | ClientError::Unsupported($f)
            | ClientError::ProtocolMismatch($f)
            | ClientError::AtCapacity($f)
            | ClientError::SessionEnded($f)
            | ClientError::Transport($f)
            | ClientError::Timeout($f)
            | ClientError::ResponseTooLarge($f)
            | ClientError::MalformedResponse($f)
            | ClientError::AnswerNotBound($f)
            | ClientError::RecordMismatch($f)
            | ClientError::NoRecord($f)
            | ClientError::RecordVersion($f)
            | ClientError::Chain($f)
            | ClientError::IsolationEvidenceMismatch($f)
            | ClientError::SoftwareEvidenceMismatch($f)
            | ClientError::ResultKindMismatch($f)
            | ClientError::Other($f) => $f,
        }
    };
}

impl ClientError {
    /// The kind a daemon refusal is to this client: the published client's error class for
    /// that row of wire.md §8.3 (§8.4). `None` for a refusal without a class of its own: its
    /// answer is classified by its code like any other.
    pub(crate) fn kind_of(refusal: &Refusal) -> Option<fn(Box<Failure>) -> ClientError> {
        Some(match refusal {
            Refusal::InvalidRequest(_) | Refusal::ProtocolMissing | Refusal::BodyTooLarge(_) => {
                ClientError::InvalidRequest
            }
            Refusal::ProtocolMismatch(_) => ClientError::ProtocolMismatch,
            Refusal::Unsupported(_) => ClientError::Unsupported,
            Refusal::Disabled(_) => ClientError::Disabled,
            Refusal::InsufficientIsolation { .. } => ClientError::InsufficientIsolation,
            // One row on the wire (failed_precondition, environment): the client cannot tell
            // them apart.
            Refusal::SoftwareMismatch(_) | Refusal::Environment(_) => ClientError::SoftwareMismatch,
            Refusal::SessionEnded { .. } | Refusal::SessionNotFound => ClientError::SessionEnded,
            Refusal::AtCapacity(_) => ClientError::AtCapacity,
            Refusal::PermissionDenied(_)
            | Refusal::Unauthenticated(_)
            | Refusal::DeadlineBeforeDispatch(_) => return None,
        })
    }

    /// What the failure states.
    pub fn failure(&self) -> &Failure {
        the_failure!(self, f)
    }

    pub(crate) fn failure_mut(&mut self) -> &mut Failure {
        the_failure!(self, f)
    }

    /// The Connect code, snake_case.
    pub fn code(&self) -> &str {
        &self.failure().code
    }

    /// The not-dispatched mark: `Some` only when nothing ran. `None` means the call may have
    /// run; never retry it automatically.
    pub fn not_dispatched_reason(&self) -> Option<Mark> {
        self.failure().not_dispatched
    }

    /// Whether the daemon answered and the answer does not check (`data_loss`).
    pub fn is_data_loss(&self) -> bool {
        self.code() == "data_loss"
    }

    /// The response received with a data-loss error, as it came back.
    pub fn response(&self) -> Option<&RunResponse> {
        self.failure().response.as_deref()
    }

    /// The checked record of an unanswered session call, counted in the session's chain.
    pub fn unanswered_record(&self) -> Option<&RunRecord> {
        let f = self.failure();
        if f.unanswered_checked {
            f.unanswered.as_deref()
        } else {
            None
        }
    }

    /// A checked unanswered session call as a saved call: its request and its record, the
    /// way [`verify_chain`](super::verify_chain) checks it again.
    pub fn unanswered_call(&self) -> Option<&SessionAnswer> {
        let f = self.failure();
        if f.unanswered_checked {
            f.unanswered_call.as_deref()
        } else {
            None
        }
    }

    pub(crate) fn with_response(mut self, resp: &RunResponse) -> ClientError {
        self.failure_mut().response = Some(Box::new(resp.clone()));
        self
    }
}

/// This client's own refusal before sending, as the daemon would refuse it: the code, mark,
/// session end and kind of `refusal`'s row, with `message`.
pub(crate) fn refused(refusal: &Refusal, message: impl Into<String>) -> ClientError {
    let (code, reason) = refusal.code_and_reason();
    let mut f = Failure::new(code.as_str(), message).marked(reason);
    f.session_end = refusal
        .session_end()
        .map(|(end, detail)| (end, detail.to_owned()));
    ClientError::kind_of(refusal).unwrap_or(ClientError::Other)(Box::new(f))
}

/// A local refusal before sending: `invalid_argument`, marked `request`.
pub(crate) fn invalid(message: impl Into<String>) -> ClientError {
    let refusal = Refusal::InvalidRequest(message.into());
    refused(&refusal, format!("plimsoll: {refusal}"))
}

/// A data-loss failure with `message`.
pub(crate) fn data_loss(message: impl Into<String>) -> Box<Failure> {
    Box::new(Failure::new(
        "data_loss",
        format!("plimsoll: {}", message.into()),
    ))
}

/// What a record check found, as the published client's error kinds.
pub(crate) fn from_record_error(e: crate::record::RecordError) -> ClientError {
    use crate::record::RecordError as E;
    match e {
        E::NoRecord => ClientError::NoRecord(data_loss(e.to_string())),
        E::Version { .. } => ClientError::RecordVersion(data_loss(e.to_string())),
        E::Session { .. } | E::Sequence { .. } | E::Previous { .. } => {
            ClientError::Chain(data_loss(e.to_string()))
        }
        other => ClientError::RecordMismatch(data_loss(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_from_their_names() {
        assert_eq!(
            Mark::from_name("isolation"),
            Some(Mark::Reason(Reason::Isolation))
        );
        assert_eq!(Mark::from_name("unknown"), None);
        assert_eq!(Mark::from_name("bogus"), None);
    }

    #[test]
    fn local_refusal_is_marked_request() {
        let e = invalid("code must not be empty");
        assert!(matches!(e, ClientError::InvalidRequest(_)));
        assert_eq!(e.code(), "invalid_argument");
        assert_eq!(
            e.not_dispatched_reason(),
            Some(Mark::Reason(Reason::Request))
        );
    }

    #[test]
    fn chain_record_errors_become_chain_errors() {
        let e = from_record_error(crate::record::RecordError::Sequence {
            record: 3,
            expected: 2,
        });
        assert!(matches!(e, ClientError::Chain(_)));
        assert!(e.is_data_loss());
        assert_eq!(e.not_dispatched_reason(), None);
    }
}
