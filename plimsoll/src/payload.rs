//! One borrowed view of a request, whichever message carries it.
//!
//! `Run` sends a [`RunRequest`] (a javascript, project or module payload; a cell is refused)
//! and `SessionRun` a [`SessionRunRequest`] (javascript, project or cell). Validation, the
//! request digest and the daemon's handlers ask the same things of either: which kind of
//! payload it is, the grant profile it names, its code, and the envelope fields the digest
//! covers. [`Request`] and [`Payload`] answer them once, so no caller matches on both
//! messages' payload types.
//!
//! ```
//! use plimsoll::payload::{PayloadKind, Request};
//! use plimsoll::wire::{JavaScriptRun, RunRequest};
//!
//! let req = RunRequest {
//!     payload: Some(JavaScriptRun {
//!         code: "console.log(1)".into(),
//!         grant_profile: "inventory".into(),
//!         ..Default::default()
//!     }.into()),
//!     ..Default::default()
//! };
//! let view = Request::from(&req);
//! assert_eq!(view.payload.kind(), Some(PayloadKind::Javascript));
//! assert_eq!(view.payload.grant_profile(), "inventory");
//! ```

use crate::wire::{
    CellRun, JavaScriptRun, ModuleRun, ProjectRun, RunRequest, SessionRunRequest, SoftwareRule,
    run_request, session_run_request,
};

/// The kind of payload a request carries; also the `kind` its digest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// A JavaScript snippet.
    Javascript,
    /// A multi-file, multi-step project.
    Project,
    /// A numeric model over a table of rows.
    Module,
    /// A notebook cell (sessions only).
    Cell,
}

impl PayloadKind {
    /// The kind's name, as digests and logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadKind::Javascript => "javascript",
            PayloadKind::Project => "project",
            PayloadKind::Module => "module",
            PayloadKind::Cell => "cell",
        }
    }
}

/// A request's payload, borrowed from either message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Payload<'a> {
    /// No payload was sent.
    None,
    /// A JavaScript snippet.
    Javascript(&'a JavaScriptRun),
    /// A project.
    Project(&'a ProjectRun),
    /// A module run (`Run` only).
    Module(&'a ModuleRun),
    /// A notebook cell (a `Run` may carry one, to be refused).
    Cell(&'a CellRun),
}

// === impl Payload ===

impl<'a> Payload<'a> {
    /// The payload of a `Run` request.
    pub fn of_run(payload: Option<&'a run_request::Payload>) -> Payload<'a> {
        match payload {
            None => Payload::None,
            Some(run_request::Payload::Javascript(js)) => Payload::Javascript(js),
            Some(run_request::Payload::Project(project)) => Payload::Project(project),
            Some(run_request::Payload::Module(module)) => Payload::Module(module),
            Some(run_request::Payload::Cell(cell)) => Payload::Cell(cell),
        }
    }

    /// The payload of a `SessionRun` request.
    pub fn of_session_run(payload: Option<&'a session_run_request::Payload>) -> Payload<'a> {
        match payload {
            None => Payload::None,
            Some(session_run_request::Payload::Javascript(js)) => Payload::Javascript(js),
            Some(session_run_request::Payload::Project(project)) => Payload::Project(project),
            Some(session_run_request::Payload::Cell(cell)) => Payload::Cell(cell),
        }
    }

    /// The payload's kind; `None` when no payload was sent.
    pub fn kind(&self) -> Option<PayloadKind> {
        match self {
            Payload::None => None,
            Payload::Javascript(_) => Some(PayloadKind::Javascript),
            Payload::Project(_) => Some(PayloadKind::Project),
            Payload::Module(_) => Some(PayloadKind::Module),
            Payload::Cell(_) => Some(PayloadKind::Cell),
        }
    }

    /// The grant profile the payload names; `""` for none, and for the kinds that cannot
    /// name one (modules and cells).
    pub fn grant_profile(&self) -> &'a str {
        match self {
            Payload::Javascript(js) => &js.grant_profile,
            Payload::Project(project) => &project.grant_profile,
            Payload::None | Payload::Module(_) | Payload::Cell(_) => "",
        }
    }

    /// How many bytes of code the payload carries, for the audit line: a snippet's or a
    /// cell's code, a project's file contents and steps; 0 for a module (data, not code).
    pub fn code_bytes(&self) -> usize {
        match self {
            Payload::None | Payload::Module(_) => 0,
            Payload::Javascript(js) => js.code.len(),
            Payload::Project(project) => {
                project.files.iter().map(|f| f.content.len()).sum::<usize>()
                    + project.steps.iter().map(String::len).sum::<usize>()
            }
            Payload::Cell(cell) => cell.code.len(),
        }
    }
}

/// A request's envelope and payload, borrowed from either message. `session_id` is not
/// here: nothing the two share depends on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request<'a> {
    /// `protocol`.
    pub protocol: u32,
    /// `minimum_isolation`, as sent.
    pub minimum_isolation: &'a str,
    /// `timeout_ms`, as sent (zero or negative included).
    pub timeout_ms: i32,
    /// `software_rule`, if present.
    pub software_rule: Option<&'a SoftwareRule>,
    /// `trace_id`, as sent.
    pub trace_id: &'a str,
    /// The payload.
    pub payload: Payload<'a>,
}

impl<'a> From<&'a RunRequest> for Request<'a> {
    fn from(req: &'a RunRequest) -> Request<'a> {
        Request {
            protocol: req.protocol,
            minimum_isolation: &req.minimum_isolation,
            timeout_ms: req.timeout_ms,
            software_rule: req.software_rule.as_option(),
            trace_id: &req.trace_id,
            payload: Payload::of_run(req.payload.as_ref()),
        }
    }
}

impl<'a> From<&'a SessionRunRequest> for Request<'a> {
    fn from(req: &'a SessionRunRequest) -> Request<'a> {
        Request {
            protocol: req.protocol,
            minimum_isolation: &req.minimum_isolation,
            timeout_ms: req.timeout_ms,
            software_rule: req.software_rule.as_option(),
            trace_id: &req.trace_id,
            payload: Payload::of_session_run(req.payload.as_ref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ProjectFile, SessionRunRequest};

    fn project() -> ProjectRun {
        ProjectRun {
            files: vec![ProjectFile {
                path: "a.js".into(),
                content: "1234".into(),
                ..Default::default()
            }],
            steps: vec!["node a.js".into()],
            grant_profile: "inv".into(),
            ..Default::default()
        }
    }

    #[test]
    fn both_messages_give_the_same_view_of_the_same_payload() {
        let run = RunRequest {
            protocol: 4,
            timeout_ms: -1,
            trace_id: "t".into(),
            payload: Some(project().into()),
            ..Default::default()
        };
        let call = SessionRunRequest {
            protocol: 4,
            timeout_ms: -1,
            trace_id: "t".into(),
            session_id: "s".into(),
            payload: Some(session_run_request::Payload::Project(Box::new(project()))),
            ..Default::default()
        };
        assert_eq!(Request::from(&run), Request::from(&call));
        let view = Request::from(&run).payload;
        assert_eq!(view.kind(), Some(PayloadKind::Project));
        assert_eq!(view.grant_profile(), "inv");
        assert_eq!(view.code_bytes(), 4 + "node a.js".len());
    }

    #[test]
    fn only_snippets_and_projects_name_a_grant_and_no_payload_has_no_kind() {
        let cell = CellRun {
            code: "x".into(),
            ..Default::default()
        };
        assert_eq!(Payload::Cell(&cell).grant_profile(), "");
        assert_eq!(Payload::Cell(&cell).kind(), Some(PayloadKind::Cell));
        assert_eq!(Payload::of_run(None).kind(), None);
        assert_eq!(Payload::of_session_run(None), Payload::None);
    }
}
