//! Every refusal the daemon can give, and the one table that maps each to its
//! Connect code and `NotDispatched` reason (wire.md §8.3).
//!
//! The rule this table keeps: only an error that provably ran nothing carries
//! a `NotDispatched` reason. An unmarked error means "may have run", and
//! clients never retry it on their own. The daemon encodes with this table and
//! the Rust client decodes with it, so the two cannot drift apart.

use connectrpc::{ConnectError, ErrorCode, ErrorDetail};

use crate::tier::{Floor, IsolationTier};
use crate::wire::{NotDispatched, NotDispatchedReason, SessionEnd, SessionEnded};

/// The protocol number this daemon serves and this library speaks.
///
/// wire.md describes protocol 3; the published Python client 0.23.0 states
/// protocol 4 (protocol 3 plus the `instance` evidence field and record
/// version 4), and that client must work unchanged, so 4 is served.
pub const PROTOCOL: u32 = 4;

/// Why a refused request provably ran nothing: the `NotDispatched` reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Malformed or out-of-bounds request; ended or unknown session; body too large.
    Request,
    /// Authentication, scope, grant-profile access.
    Permission,
    /// Protocol number missing or different.
    Protocol,
    /// The provider cannot do it, the provider is disabled, sessions are off, 404.
    Unsupported,
    /// The current tier is below the request's floor.
    Isolation,
    /// Admission, rate limit, decode slots, session caps.
    Capacity,
    /// The sandbox cannot be shown to be the stated one, or the software fails the rule.
    Environment,
}

impl Reason {
    /// Every reason, in wire order.
    pub const ALL: [Reason; 7] = [
        Reason::Request,
        Reason::Permission,
        Reason::Protocol,
        Reason::Unsupported,
        Reason::Isolation,
        Reason::Capacity,
        Reason::Environment,
    ];

    /// The reason's wire enum value.
    pub fn to_wire(self) -> NotDispatchedReason {
        match self {
            Reason::Request => NotDispatchedReason::NOT_DISPATCHED_REASON_REQUEST,
            Reason::Permission => NotDispatchedReason::NOT_DISPATCHED_REASON_PERMISSION,
            Reason::Protocol => NotDispatchedReason::NOT_DISPATCHED_REASON_PROTOCOL,
            Reason::Unsupported => NotDispatchedReason::NOT_DISPATCHED_REASON_UNSUPPORTED,
            Reason::Isolation => NotDispatchedReason::NOT_DISPATCHED_REASON_ISOLATION,
            Reason::Capacity => NotDispatchedReason::NOT_DISPATCHED_REASON_CAPACITY,
            Reason::Environment => NotDispatchedReason::NOT_DISPATCHED_REASON_ENVIRONMENT,
        }
    }

    /// The reason's short name, as clients and the `Plimsoll-Not-Dispatched`
    /// header spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Request => "request",
            Reason::Permission => "permission",
            Reason::Protocol => "protocol",
            Reason::Unsupported => "unsupported",
            Reason::Isolation => "isolation",
            Reason::Capacity => "capacity",
            Reason::Environment => "environment",
        }
    }

    /// Reads a wire reason; `UNSPECIFIED` and unknown numbers mark nothing.
    pub fn from_wire(n: i32) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.to_wire() as i32 == n)
    }

    /// Reads a reason by its short name; anything else names none.
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// A refusal: a request the daemon turned away before anything ran.
///
/// Each variant is one row of wire.md §8.3. The message is what the caller
/// reads; it never carries a token, a session id or internal detail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// `ErrInvalidRequest`: the request breaks a validation rule.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request states no protocol number.
    #[error("protocol must be stated; this daemon serves protocol {PROTOCOL}")]
    ProtocolMissing,
    /// The request states a protocol this daemon does not serve.
    #[error("this daemon serves protocol {PROTOCOL} and the request states {0}; nothing ran")]
    ProtocolMismatch(u32),
    /// `ErrUnsupported`: the provider cannot run this kind of payload.
    #[error("{0}")]
    Unsupported(String),
    /// `ErrDisabled`: no provider is configured; nothing runs, ever.
    #[error("{0}")]
    Disabled(String),
    /// `ErrInsufficientIsolation`: the current tier is below the request's floor.
    #[error(
        "minimum_isolation {floor} is above this daemon's current isolation {tier}; nothing ran"
    )]
    InsufficientIsolation {
        /// The caller's floor.
        floor: Floor,
        /// The daemon's current tier.
        tier: IsolationTier,
    },
    /// `ErrSoftwareMismatch`: the selected software is outside the caller's rule.
    #[error("{0}")]
    SoftwareMismatch(String),
    /// The sandbox cannot be shown to be the one stated (not proven since
    /// restart, read-back failed, interpreter unreachable).
    #[error("{0}")]
    Environment(String),
    /// `ErrSessionEnded`: the session has ended.
    #[error("session ended: {detail}")]
    SessionEnded {
        /// Why it ended.
        reason: SessionEnd,
        /// A sentence for the caller.
        detail: String,
    },
    /// The session id is unknown, or belongs to another caller (the two look alike).
    #[error("no such session for this caller")]
    SessionNotFound,
    /// Authenticated, but not allowed (scope, grant profile).
    #[error("{0}")]
    PermissionDenied(String),
    /// No credential, or one that is not recognised.
    #[error("{0}")]
    Unauthenticated(String),
    /// `ErrAtCapacity`: admission shed the request; retry later.
    #[error("{0}")]
    AtCapacity(String),
    /// The declared body is larger than the 8 MiB cap.
    #[error("{0}")]
    BodyTooLarge(String),
    /// The call's deadline passed before anything was handed to the sandbox (a cell whose
    /// code was never sent, wire.md §8.3): nothing ran, and the time is gone.
    #[error("{0}")]
    DeadlineBeforeDispatch(String),
}

impl Refusal {
    /// One refusal of each kind (empty messages): the rows of the table, for a reader to walk
    /// (the Rust client classifies an answer by the row it matches).
    pub const ROWS: &[Refusal] = &[
        Refusal::InvalidRequest(String::new()),
        Refusal::ProtocolMissing,
        Refusal::ProtocolMismatch(0),
        Refusal::Unsupported(String::new()),
        Refusal::Disabled(String::new()),
        Refusal::InsufficientIsolation {
            floor: Floor::NONE,
            tier: IsolationTier::None,
        },
        Refusal::SoftwareMismatch(String::new()),
        Refusal::Environment(String::new()),
        Refusal::SessionEnded {
            reason: SessionEnd::SESSION_END_UNSPECIFIED,
            detail: String::new(),
        },
        Refusal::SessionNotFound,
        Refusal::PermissionDenied(String::new()),
        Refusal::Unauthenticated(String::new()),
        Refusal::AtCapacity(String::new()),
        Refusal::BodyTooLarge(String::new()),
        Refusal::DeadlineBeforeDispatch(String::new()),
    ];

    /// The Connect code and the `NotDispatched` reason of this refusal: the
    /// table of wire.md §8.3.
    pub fn code_and_reason(&self) -> (ErrorCode, Reason) {
        match self {
            Refusal::InvalidRequest(_) => (ErrorCode::InvalidArgument, Reason::Request),
            Refusal::ProtocolMissing => (ErrorCode::InvalidArgument, Reason::Protocol),
            Refusal::ProtocolMismatch(_) => (ErrorCode::Unimplemented, Reason::Protocol),
            Refusal::Unsupported(_) => (ErrorCode::Unimplemented, Reason::Unsupported),
            Refusal::Disabled(_) => (ErrorCode::FailedPrecondition, Reason::Unsupported),
            Refusal::InsufficientIsolation { .. } => {
                (ErrorCode::FailedPrecondition, Reason::Isolation)
            }
            Refusal::SoftwareMismatch(_) => (ErrorCode::FailedPrecondition, Reason::Environment),
            Refusal::Environment(_) => (ErrorCode::FailedPrecondition, Reason::Environment),
            Refusal::SessionEnded { .. } => (ErrorCode::FailedPrecondition, Reason::Request),
            Refusal::SessionNotFound => (ErrorCode::NotFound, Reason::Request),
            Refusal::PermissionDenied(_) => (ErrorCode::PermissionDenied, Reason::Permission),
            Refusal::Unauthenticated(_) => (ErrorCode::Unauthenticated, Reason::Permission),
            Refusal::AtCapacity(_) => (ErrorCode::ResourceExhausted, Reason::Capacity),
            Refusal::BodyTooLarge(_) => (ErrorCode::ResourceExhausted, Reason::Request),
            // The spec leaves the reason open; capacity is what the grant path uses for a
            // run whose time ran out before dispatch (grants.md §1.4).
            Refusal::DeadlineBeforeDispatch(_) => (ErrorCode::DeadlineExceeded, Reason::Capacity),
        }
    }

    /// The `SessionEnded` detail's reason and sentence, for the session refusals.
    pub fn session_end(&self) -> Option<(SessionEnd, &str)> {
        match self {
            Refusal::SessionEnded { reason, detail } => Some((*reason, detail)),
            Refusal::SessionNotFound => Some((
                SessionEnd::SESSION_END_NOT_FOUND,
                "no such session for this caller",
            )),
            _ => None,
        }
    }

    /// The Connect error the caller receives: code, message, the
    /// `NotDispatched` detail and, for session refusals, the `SessionEnded` detail.
    pub fn to_connect_error(&self) -> ConnectError {
        let (code, reason) = self.code_and_reason();
        let mut err = ConnectError::new(code, self.to_string());
        err = err.with_detail(not_dispatched_detail(reason));
        if let Some((end, detail)) = self.session_end() {
            err = err.with_detail(session_ended_detail(end, detail));
        }
        err
    }
}

impl From<Refusal> for ConnectError {
    fn from(r: Refusal) -> ConnectError {
        r.to_connect_error()
    }
}

/// The full name every error detail is typed by.
pub const NOT_DISPATCHED_TYPE: &str = "plimsoll.v1.NotDispatched";
/// The full name of the session-end detail.
pub const SESSION_ENDED_TYPE: &str = "plimsoll.v1.SessionEnded";
/// The full name of the unanswered-call detail.
pub const UNANSWERED_CALL_TYPE: &str = "plimsoll.v1.UnansweredCall";

/// The `NotDispatched{reason}` error detail.
pub fn not_dispatched_detail(reason: Reason) -> ErrorDetail {
    let msg = NotDispatched {
        reason: reason.to_wire().into(),
        ..Default::default()
    };
    ErrorDetail::from_message(NOT_DISPATCHED_TYPE, &msg)
}

/// The `NotDispatched` reason `err` carries, read back through the message
/// [`not_dispatched_detail`] wrote: `None` for an unmarked error (it may have run), and for
/// a detail that does not decode or names no reason this build knows.
pub fn not_dispatched_reason(err: &ConnectError) -> Option<Reason> {
    use base64::Engine as _;
    let value = err
        .details
        .iter()
        .find(|d| d.type_url == NOT_DISPATCHED_TYPE)?
        .value
        .as_deref()?;
    let raw = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value.trim_end_matches('='))
        .ok()?;
    let detail = <NotDispatched as buffa::Message>::decode_from_slice(&raw).ok()?;
    Reason::from_wire(detail.reason.to_i32())
}

/// The `SessionEnded{reason, detail}` error detail.
pub fn session_ended_detail(reason: SessionEnd, detail: &str) -> ErrorDetail {
    let msg = SessionEnded {
        reason: reason.into(),
        detail: detail.to_owned(),
        ..Default::default()
    };
    ErrorDetail::from_message(SESSION_ENDED_TYPE, &msg)
}

/// The error for a session call that its session's end cut short while it ran (wire.md §7.3):
/// the code of the ended-session row and its `SessionEnded` detail, but no `NotDispatched`
/// mark, because the call's code may have run. `unanswered` is given that code and returns
/// the call's `UnansweredCall` detail (its record states the code); the message is `detail`.
pub fn session_ended_under_call(
    reason: SessionEnd,
    detail: &str,
    unanswered: impl FnOnce(ErrorCode) -> ErrorDetail,
) -> ConnectError {
    let ended = Refusal::SessionEnded {
        reason,
        detail: detail.to_owned(),
    };
    let (code, _) = ended.code_and_reason();
    ConnectError::new(code, detail.to_owned())
        .with_detail(unanswered(code))
        .with_detail(session_ended_detail(reason, detail))
}

/// The answer to an infrastructure fault: `internal`, unmarked (it may have
/// run), and a message that names only the id under which the daemon logged
/// the detail.
pub fn internal_error(id: &str) -> ConnectError {
    ConnectError::internal(format!(
        "internal error {id}; the daemon's log holds its detail"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    /// Each variant's place in [`Refusal::ROWS`]. A new variant fails to compile here: give
    /// it the next place and add it to the rows.
    fn row_index(r: &Refusal) -> usize {
        match r {
            Refusal::InvalidRequest(_) => 0,
            Refusal::ProtocolMissing => 1,
            Refusal::ProtocolMismatch(_) => 2,
            Refusal::Unsupported(_) => 3,
            Refusal::Disabled(_) => 4,
            Refusal::InsufficientIsolation { .. } => 5,
            Refusal::SoftwareMismatch(_) => 6,
            Refusal::Environment(_) => 7,
            Refusal::SessionEnded { .. } => 8,
            Refusal::SessionNotFound => 9,
            Refusal::PermissionDenied(_) => 10,
            Refusal::Unauthenticated(_) => 11,
            Refusal::AtCapacity(_) => 12,
            Refusal::BodyTooLarge(_) => 13,
            Refusal::DeadlineBeforeDispatch(_) => 14,
        }
    }

    #[test]
    fn the_rows_hold_every_variant_once() {
        let indices: Vec<usize> = Refusal::ROWS.iter().map(row_index).collect();
        assert_eq!(indices, (0..Refusal::ROWS.len()).collect::<Vec<_>>());
    }

    #[test]
    fn every_refusal_reads_back_the_reason_the_table_wrote() {
        let refusals = [
            Refusal::InvalidRequest("x".into()),
            Refusal::ProtocolMissing,
            Refusal::ProtocolMismatch(3),
            Refusal::Unsupported("x".into()),
            Refusal::Disabled("x".into()),
            Refusal::InsufficientIsolation {
                floor: Floor::parse("vm").expect("floor"),
                tier: IsolationTier::Process,
            },
            Refusal::SoftwareMismatch("x".into()),
            Refusal::Environment("x".into()),
            Refusal::SessionEnded {
                reason: SessionEnd::SESSION_END_EXPIRED,
                detail: "x".into(),
            },
            Refusal::SessionNotFound,
            Refusal::PermissionDenied("x".into()),
            Refusal::Unauthenticated("x".into()),
            Refusal::AtCapacity("x".into()),
            Refusal::BodyTooLarge("x".into()),
            Refusal::DeadlineBeforeDispatch("x".into()),
        ];
        for refusal in refusals.iter().chain(Refusal::ROWS) {
            let (_, reason) = refusal.code_and_reason();
            assert_eq!(
                not_dispatched_reason(&refusal.to_connect_error()),
                Some(reason),
                "{refusal:?}"
            );
        }
        assert_eq!(
            not_dispatched_reason(&internal_error("0123456789abcdef")),
            None
        );
    }

    fn detail_bytes(err: &ConnectError, type_name: &str) -> Vec<u8> {
        let d = err
            .details
            .iter()
            .find(|d| d.type_url == type_name)
            .expect("detail present");
        let v = d.value.as_deref().expect("detail value");
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(v)
            .expect("base64")
    }

    #[test]
    fn isolation_refusal_carries_reason_five() {
        let r = Refusal::InsufficientIsolation {
            floor: Floor::parse("container").expect("floor"),
            tier: IsolationTier::Process,
        };
        let err = r.to_connect_error();
        assert_eq!(err.code, ErrorCode::FailedPrecondition);
        assert_eq!(detail_bytes(&err, NOT_DISPATCHED_TYPE), vec![0x08, 0x05]);
    }

    #[test]
    fn capacity_refusal_carries_reason_six() {
        let err = Refusal::AtCapacity("full".into()).to_connect_error();
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert_eq!(detail_bytes(&err, NOT_DISPATCHED_TYPE), vec![0x08, 0x06]);
    }

    #[test]
    fn a_deadline_before_dispatch_is_deadline_exceeded_marked_capacity() {
        let err = Refusal::DeadlineBeforeDispatch("late".into()).to_connect_error();
        assert_eq!(err.code, ErrorCode::DeadlineExceeded);
        assert_eq!(detail_bytes(&err, NOT_DISPATCHED_TYPE), vec![0x08, 0x06]);
    }

    #[test]
    fn missing_protocol_is_invalid_argument_with_reason_protocol() {
        let err = Refusal::ProtocolMissing.to_connect_error();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(detail_bytes(&err, NOT_DISPATCHED_TYPE), vec![0x08, 0x03]);
        assert_eq!(
            err.message.as_deref(),
            Some("protocol must be stated; this daemon serves protocol 4")
        );
    }

    #[test]
    fn other_protocol_is_unimplemented_and_names_both_numbers() {
        let err = Refusal::ProtocolMismatch(3).to_connect_error();
        assert_eq!(err.code, ErrorCode::Unimplemented);
        assert_eq!(
            err.message.as_deref(),
            Some("this daemon serves protocol 4 and the request states 3; nothing ran")
        );
    }

    #[test]
    fn unknown_session_carries_not_found_end_and_reason_request() {
        let err = Refusal::SessionNotFound.to_connect_error();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert_eq!(detail_bytes(&err, NOT_DISPATCHED_TYPE), vec![0x08, 0x01]);
        let ended = detail_bytes(&err, SESSION_ENDED_TYPE);
        assert_eq!(&ended[..2], &[0x08, 0x09]);
    }

    #[test]
    fn a_call_cut_short_by_its_session_end_has_the_ended_code_and_no_mark() {
        let mut stated = None;
        let err = session_ended_under_call(SessionEnd::SESSION_END_EXPIRED, "gone", |code| {
            stated = Some(code);
            ErrorDetail::from_message(UNANSWERED_CALL_TYPE, &NotDispatched::default())
        });
        let row = Refusal::SessionEnded {
            reason: SessionEnd::SESSION_END_EXPIRED,
            detail: "gone".into(),
        };
        assert_eq!(stated, Some(row.code_and_reason().0));
        assert_eq!(err.code, ErrorCode::FailedPrecondition);
        assert_eq!(err.message.as_deref(), Some("gone"));
        assert_eq!(not_dispatched_reason(&err), None);
        let types: Vec<&str> = err.details.iter().map(|d| d.type_url.as_str()).collect();
        assert_eq!(types, [UNANSWERED_CALL_TYPE, SESSION_ENDED_TYPE]);
        assert_eq!(&detail_bytes(&err, SESSION_ENDED_TYPE)[..2], &[0x08, 0x02]);
    }

    #[test]
    fn internal_error_is_unmarked() {
        let err = internal_error("0123456789abcdef");
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(err.details.is_empty());
    }

    #[test]
    fn reasons_round_trip_through_wire_numbers_and_names() {
        for (r, n) in Reason::ALL.into_iter().zip(1..) {
            assert_eq!(r.to_wire() as i32, n, "{r:?}");
            assert_eq!(Reason::from_wire(n), Some(r));
            assert_eq!(Reason::from_name(r.as_str()), Some(r));
        }
        assert_eq!(Reason::from_wire(0), None);
        assert_eq!(Reason::from_wire(8), None);
        assert_eq!(Reason::from_name("unknown"), None);
    }
}
