//! Restoring a Connect error answer into a [`ClientError`] (wire.md §8.1, §8.4).
//!
//! The code comes from the JSON body (or, when it has none, from the HTTP status); the
//! `NotDispatched` detail marks the error, a `SessionEnded` detail types it, and an
//! `UnansweredCall` detail carries the record of a session call that may have run. Without
//! a detail the `Plimsoll-Not-Dispatched` header marks it. An answer that does not carry this
//! request's id back keeps only its code and message.

use base64::Engine as _;
use buffa::Message as _;
use connectrpc::ErrorCode;

use super::error::{ClientError, Failure, Mark};
use crate::record::UNANSWERED_CODES;
use crate::refusal::{
    NOT_DISPATCHED_TYPE, Reason, Refusal, SESSION_ENDED_TYPE, UNANSWERED_CALL_TYPE,
};
use crate::wire::{NotDispatched, RunRecord, SessionEnd, SessionEnded, UnansweredCall};

/// Appended to the message of an answer that was not bound to its request.
pub(crate) const NOT_BOUND: &str = "the answer does not carry this request's Plimsoll-Request-Id \
     back (a daemon older than protocol 3, or an intermediary that answered with another \
     request's answer or dropped the header), so what it says about the call is ignored";

/// Connect's code for an answer whose body names none.
fn code_for_status(status: u16) -> &'static str {
    match status {
        400 => "internal",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "unimplemented",
        429 | 502 | 503 | 504 => "unavailable",
        _ => "unknown",
    }
}

/// Standard or URL-safe base64, padded or not.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let core = s.trim_end_matches('=');
    if s.contains(['-', '_']) {
        URL_SAFE_NO_PAD.decode(core).ok()
    } else {
        STANDARD_NO_PAD.decode(core).ok()
    }
}

/// What the details of an error body state.
#[derive(Default)]
struct Details {
    mark: Option<Mark>,
    end: Option<(SessionEnd, String)>,
    unanswered: Option<RunRecord>,
}

fn read_details(body: &serde_json::Value) -> Details {
    let mut out = Details::default();
    let Some(details) = body.get("details").and_then(|d| d.as_array()) else {
        return out;
    };
    for d in details {
        let (Some(type_name), Some(value)) = (
            d.get("type").and_then(|t| t.as_str()),
            d.get("value").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        let type_name = type_name.rsplit('/').next().unwrap_or(type_name);
        // An undecodable detail states nothing; in particular not that nothing ran.
        let Some(raw) = decode_base64(value) else {
            continue;
        };
        if type_name == NOT_DISPATCHED_TYPE && out.mark.is_none() {
            if let Ok(nd) = NotDispatched::decode_from_slice(&raw) {
                out.mark =
                    Some(Reason::from_wire(nd.reason.to_i32()).map_or(Mark::Unknown, Mark::Reason));
            }
        } else if type_name == SESSION_ENDED_TYPE && out.end.is_none() {
            if let Ok(se) = SessionEnded::decode_from_slice(&raw) {
                // The detail says the session ended: an unnamed number is an end all the same.
                let reason = se
                    .reason
                    .as_known()
                    .filter(|r| *r != SessionEnd::SESSION_END_UNSPECIFIED)
                    .unwrap_or(SessionEnd::SESSION_END_UNSPECIFIED);
                out.end = Some((reason, se.detail));
            }
        } else if type_name == UNANSWERED_CALL_TYPE
            && out.unanswered.is_none()
            && let Ok(uc) = UnansweredCall::decode_from_slice(&raw)
        {
            out.unanswered = uc.record.as_option().cloned();
        }
    }
    out
}

/// The error a Connect error answer describes. `bound`: the answer carried this request's
/// id back exactly once. `header_mark`: its `Plimsoll-Not-Dispatched` header.
pub(crate) fn error_from_wire(
    status: u16,
    body: &[u8],
    bound: bool,
    header_mark: Option<&str>,
) -> ClientError {
    let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    let code = parsed
        .get("code")
        .and_then(|c| c.as_str())
        .filter(|c| UNANSWERED_CODES.contains(c))
        .unwrap_or_else(|| code_for_status(status))
        .to_owned();
    let mut message = parsed
        .get("message")
        .and_then(|m| m.as_str())
        .filter(|m| !m.is_empty())
        .map_or_else(|| format!("HTTP {status}"), str::to_owned);
    let mut details = read_details(&parsed);
    if !bound {
        details = Details::default();
        message = format!("{message} ({NOT_BOUND})");
    } else if details.mark.is_none() {
        details.mark = header_mark.and_then(Mark::from_name);
    }
    let failure = Box::new(Failure {
        code: code.clone(),
        message: format!("plimsoll: {code}: {message}"),
        not_dispatched: details.mark,
        http_status: Some(status),
        answer_not_bound: !bound,
        // A record only travels with an error that may have run.
        unanswered: details
            .unanswered
            .filter(|_| details.mark.is_none())
            .map(Box::new),
        unanswered_checked: false,
        session_end: details.end.clone(),
        ..Failure::default()
    });
    classify(&code, details.mark, details.end.is_some(), failure)
}

/// Picks the kind from the code, the mark and whether a session end was stated, reading the
/// daemon's refusal table ([`Refusal::ROWS`]) backwards: a session end types an answer whose
/// code the table sends with one; otherwise the row with this code and mark gives the kind.
/// An answer that is no row (unmarked: it may have run), or whose row has no class of its
/// own, takes its code's kind (wire.md §8.4).
fn classify(code: &str, mark: Option<Mark>, ended: bool, f: Box<Failure>) -> ClientError {
    let code = code.parse::<ErrorCode>().ok();
    let reason = match mark {
        Some(Mark::Reason(r)) => Some(r),
        _ => None,
    };
    let row = |r: &Refusal| {
        let (c, why) = r.code_and_reason();
        Some(c) == code
            && match r.session_end() {
                Some(_) => ended,
                None => Some(why) == reason,
            }
    };
    let by_end = Refusal::ROWS.iter().filter(|r| r.session_end().is_some());
    let by_mark = Refusal::ROWS.iter().filter(|r| r.session_end().is_none());
    if let Some(kind) = by_end
        .chain(by_mark)
        .filter(|r| row(r))
        .find_map(ClientError::kind_of)
    {
        return kind(f);
    }
    match code {
        Some(ErrorCode::FailedPrecondition) => ClientError::Disabled(f),
        Some(ErrorCode::Unimplemented) => ClientError::Unsupported(f),
        Some(ErrorCode::InvalidArgument) => ClientError::InvalidRequest(f),
        // Unmarked, they may follow execution: no class says "refused" (nor, for over
        // capacity, "retry later").
        Some(ErrorCode::Canceled | ErrorCode::DeadlineExceeded) => ClientError::Other(f),
        _ if ended => ClientError::SessionEnded(f),
        _ => ClientError::Other(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(code: &str, details: &[(&str, &str)]) -> Vec<u8> {
        let details: Vec<_> = details
            .iter()
            .map(|(t, v)| serde_json::json!({"type": t, "value": v}))
            .collect();
        serde_json::to_vec(&serde_json::json!({"code": code, "message": "m", "details": details}))
            .unwrap_or_default()
    }

    fn kind(e: &ClientError) -> std::mem::Discriminant<ClientError> {
        std::mem::discriminant(e)
    }

    #[test]
    fn every_row_of_the_table_reads_back_as_its_kind_code_mark_and_end() {
        for row in Refusal::ROWS {
            let (code, reason) = row.code_and_reason();
            let expected = ClientError::kind_of(row).unwrap_or(ClientError::Other)(Box::default());
            let err = row.to_connect_error();
            let body = serde_json::to_vec(&err).unwrap_or_default();
            let read = error_from_wire(code.http_status().as_u16(), &body, true, None);
            // The client's own refusal of the row is the same error as the daemon's.
            let local = super::super::error::refused(row, "m");
            for e in [&read, &local] {
                assert_eq!(kind(e), kind(&expected), "{row:?}: {e:?}");
                assert_eq!(e.code(), code.as_str(), "{row:?}");
                assert_eq!(e.not_dispatched_reason(), Some(Mark::Reason(reason)));
                let end = row.session_end().map(|(r, d)| (r, d.to_owned()));
                assert_eq!(e.failure().session_end, end, "{row:?}");
            }
        }
    }

    #[test]
    fn a_call_cut_short_by_its_session_end_reads_back_unmarked_as_session_ended() {
        let err = crate::refusal::session_ended_under_call(
            SessionEnd::SESSION_END_EXPIRED,
            "gone",
            |_| {
                connectrpc::ErrorDetail::from_message(
                    UNANSWERED_CALL_TYPE,
                    &UnansweredCall::default(),
                )
            },
        );
        let body = serde_json::to_vec(&err).unwrap_or_default();
        let e = error_from_wire(400, &body, true, None);
        assert!(matches!(e, ClientError::SessionEnded(_)), "{e:?}");
        assert_eq!(e.not_dispatched_reason(), None);
        assert_eq!(e.code(), "failed_precondition");
    }

    #[test]
    fn isolation_refusal_is_insufficient_isolation_marked_isolation() {
        let e = error_from_wire(
            400,
            &body(
                "failed_precondition",
                &[("plimsoll.v1.NotDispatched", "CAU")],
            ),
            true,
            None,
        );
        assert!(matches!(e, ClientError::InsufficientIsolation(_)));
        assert_eq!(
            e.not_dispatched_reason(),
            Some(Mark::Reason(Reason::Isolation))
        );
    }

    #[test]
    fn unbound_error_keeps_only_code_and_message() {
        let e = error_from_wire(
            429,
            &body(
                "resource_exhausted",
                &[("type.googleapis.com/plimsoll.v1.NotDispatched", "CAY")],
            ),
            false,
            Some("request"),
        );
        assert!(matches!(e, ClientError::Other(_)));
        assert_eq!(e.not_dispatched_reason(), None);
        assert!(e.failure().answer_not_bound);
    }

    #[test]
    fn bare_404_takes_the_header_mark_and_the_status_code() {
        let e = error_from_wire(404, b"404 page not found", true, Some("unsupported"));
        assert!(matches!(e, ClientError::Unsupported(_)));
        assert_eq!(e.code(), "unimplemented");
        assert_eq!(
            e.not_dispatched_reason(),
            Some(Mark::Reason(Reason::Unsupported))
        );
    }

    #[test]
    fn detail_mark_wins_over_header() {
        let e = error_from_wire(
            429,
            &body(
                "resource_exhausted",
                &[("plimsoll.v1.NotDispatched", "CAY=")],
            ),
            true,
            Some("request"),
        );
        assert!(matches!(e, ClientError::AtCapacity(_)));
    }

    #[test]
    fn session_ended_detail_types_the_error() {
        // SessionEnded{reason: EXPIRED (2), detail: "x"}
        let e = error_from_wire(
            400,
            &body(
                "failed_precondition",
                &[
                    ("plimsoll.v1.SessionEnded", "CAISAXg"),
                    ("plimsoll.v1.NotDispatched", "CAE"),
                ],
            ),
            true,
            None,
        );
        assert!(matches!(e, ClientError::SessionEnded(_)));
        let end = e.failure().session_end.clone();
        assert_eq!(end, Some((SessionEnd::SESSION_END_EXPIRED, "x".to_owned())));
    }
}
