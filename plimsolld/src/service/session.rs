//! `OpenSession`, `SessionRun` and `CloseSession` (wire.md §7).
//!
//! No provider built so far keeps sessions, so sessions are off: an open is
//! refused as unsupported after its envelope checks, and every session id is
//! unknown. The session issue replaces this with the real session table.

use connectrpc::ConnectError;
use plimsoll::refusal::Refusal;
use plimsoll::validate;
use plimsoll::wire::{
    CloseSessionRequest, CloseSessionResponse, OpenSessionRequest, OpenSessionResponse,
    SessionRunRequest, SessionRunResponse,
};

use super::State;

/// Opens a session: protocol, floor syntax and rule syntax first, then the
/// refusal that sessions are off.
pub(super) fn open(
    state: &State,
    req: OpenSessionRequest,
) -> Result<OpenSessionResponse, ConnectError> {
    validate::check_protocol(req.protocol)?;
    validate::check_floor(&req.minimum_isolation)?;
    validate::check_software_rule(req.software_rule.as_option())?;
    let sandbox = state.provider.describe().sandbox;
    Err(Refusal::Unsupported(format!(
        "sessions are off: the {sandbox} provider keeps no sessions on this daemon"
    ))
    .into())
}

/// Runs a call in a session: the envelope checks, then the lookup, which
/// finds nothing while sessions are off.
pub(super) fn run(
    _state: &State,
    req: SessionRunRequest,
) -> Result<SessionRunResponse, ConnectError> {
    validate::check_protocol(req.protocol)?;
    validate::check_floor(&req.minimum_isolation)?;
    validate::check_software_rule(req.software_rule.as_option())?;
    Err(Refusal::SessionNotFound.into())
}

/// Closes a session: the protocol check, then the lookup.
pub(super) fn close(
    _state: &State,
    req: CloseSessionRequest,
) -> Result<CloseSessionResponse, ConnectError> {
    validate::check_protocol(req.protocol)?;
    Err(Refusal::SessionNotFound.into())
}
