//! The checks a run's open goes through, in the order of the control protocol's semantics,
//! before anything is bound or served: the run id, the session slot of a lent run, the
//! profile and the caller, `allow_in_sessions`, the deadline, then the credential is minted.
//! Each failure is the refusal plimsolld gets; nothing is left behind.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::control::protocol::{Delivery, OpenRun, RefusalReason, Response};
use crate::credential::{self, Credential};
use crate::deadline::time_left;
use crate::grants::Profile;
use crate::registry::Registry;
use crate::session::{self, Session, Sessions};

/// A run that passed every check: what binding and serving it need.
pub(super) struct Admitted {
    /// The profile, as it is now (the run keeps this snapshot).
    pub profile: Arc<Profile>,
    /// The minted credential, or `None` for a profile without one.
    pub credential: Option<Credential>,
    /// Time until the run's deadline.
    pub budget: Duration,
    /// The session whose socket the run is lent to, or `None` for a socket of its own.
    pub lent_to: Option<Arc<Session>>,
}

/// Run ids and session slot ids are 32 lowercase hex characters.
pub(crate) fn is_hex_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks `request` against the open runs (`already_open`: its id is in the table), whether
/// the broker serves a guard socket (`guard`), the open sessions and the current `registry`,
/// at `now`.
pub(super) fn admit(
    request: &OpenRun,
    already_open: bool,
    guard: bool,
    sessions: &Sessions,
    registry: &Registry,
    now: SystemTime,
) -> Result<Admitted, Response> {
    // The run id.
    if !is_hex_id(&request.run) {
        return Err(Response::refused(
            RefusalReason::Request,
            "run id must be 32 lowercase hex characters",
        ));
    }
    if already_open {
        return Err(Response::refused(
            RefusalReason::Request,
            "duplicate run id",
        ));
    }
    // The delivery, and the session slot of a lent run.
    check_delivery(request.delivery, guard)?;
    let lent_to = match &request.slot {
        None => None,
        Some(slot) => Some(session::check_slot(
            sessions,
            slot,
            request.session,
            request.delivery,
        )?),
    };
    if request.call_token && (lent_to.is_none() || request.delivery != Delivery::Guard) {
        return Err(Response::refused(
            RefusalReason::Request,
            "a call token is minted only for a call lent to a guard-delivered session slot",
        ));
    }
    // Unknown profile, foreign caller and anonymous caller: one answer, so profile names
    // cannot be enumerated.
    let unavailable = || {
        Response::refused(
            RefusalReason::Permission,
            format!(
                "grant_profile \"{}\" is not available to this caller",
                request.profile
            ),
        )
    };
    let Some(profile) = registry.get(&request.profile).cloned() else {
        return Err(unavailable());
    };
    if !profile.admits(&request.principal) {
        return Err(unavailable());
    }
    if request.session && !profile.allow_in_sessions {
        return Err(Response::refused(
            RefusalReason::Permission,
            format!(
                "grant_profile \"{}\" is not allowed in sessions",
                request.profile
            ),
        ));
    }
    // The deadline.
    let Some(budget) = time_left(request.deadline_unix_ms, now) else {
        return Err(Response::refused(
            RefusalReason::Capacity,
            "the run's deadline has already passed",
        ));
    };
    // The credential, valid no longer than the run.
    let credential = credential::mint(
        &profile.token,
        &request.principal,
        &profile.scopes,
        budget,
        now,
    )
    .map_err(|error| {
        Response::refused(
            RefusalReason::Permission,
            format!(
                "grant_profile \"{}\": the credential could not be issued: {error}",
                request.profile
            ),
        )
    })?;
    Ok(Admitted {
        profile,
        credential,
        budget,
        lent_to,
    })
}

/// Guard delivery needs a guard socket to be served on.
pub(crate) fn check_delivery(delivery: Delivery, guard: bool) -> Result<(), Response> {
    if delivery == Delivery::Guard && !guard {
        return Err(Response::refused(
            RefusalReason::Request,
            "guard delivery needs a broker that serves a guard socket (PLIMSOLL_BROKER_GUARD_SOCKET)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_and_session_ids_are_32_lowercase_hex() {
        assert!(is_hex_id(&"0a".repeat(16)));
        assert!(!is_hex_id(&"0A".repeat(16)));
        assert!(!is_hex_id(&"0a".repeat(15)));
        assert!(!is_hex_id(&"zz".repeat(16)));
    }
}
