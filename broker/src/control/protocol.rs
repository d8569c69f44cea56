//! The control protocol's messages.
//!
//! One JSON object per line in each direction; every request line gets exactly one response
//! line, and a connection may carry many requests. Unknown fields are refused both ways, so a
//! daemon and a broker of different versions fail loudly instead of misreading each other.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol version [`Hello`] reports.
pub const VERSION: u32 = 1;

/// Prefix of a run socket's private directory. Defined here, in the part plimsolld links,
/// because plimsolld's orphan sweep reaps the directories a dead broker left behind.
pub const RUN_DIR_PREFIX: &str = "crsbx-broker";
/// Prefix of a session socket's private directory.
pub const SESSION_DIR_PREFIX: &str = "crsbx-session-broker";

/// Longest request or response line either side accepts, newline excluded.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A request from plimsolld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Liveness and registry generation; plimsolld's readiness probe uses it.
    Hello,
    /// Opens one run's grant: mints the credential and creates the run's socket.
    Open(OpenRun),
    /// Ends a run's grant at once: in-flight calls are cut and the socket is removed.
    Close {
        /// The run id given to [`Request::Open`].
        run: String,
    },
    /// Opens a session's socket (mounted once at session open; serves only lent grants).
    OpenSession(OpenSession),
    /// Ends a session's socket: a grant still lent is closed, the socket is removed.
    CloseSession {
        /// The slot id given to [`Request::OpenSession`].
        session: String,
    },
}

/// What plimsolld asks for when a run with a `grant_profile` starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenRun {
    /// Run id chosen by plimsolld: 32 lowercase hex characters, unique among open runs.
    pub run: String,
    /// The authenticated caller id (`""` in open dev mode, which is always refused).
    pub principal: String,
    /// The request's `grant_profile`.
    pub profile: String,
    /// The run's deadline in Unix milliseconds. The broker revokes the grant 5 s after it
    /// even if no `Close` ever arrives.
    pub deadline_unix_ms: u64,
    /// A session call: the profile must have `allow_in_sessions`.
    pub session: bool,
    /// Lend this run's grant to the socket of this open session (instead of a socket of its
    /// own). Needs `session: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
}

/// What plimsolld asks for when a docker session opens: one socket for the session's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// Session slot id chosen by plimsolld: 32 lowercase hex characters (never the session
    /// id the caller sees).
    pub session: String,
    /// The session's end in Unix ms; the broker removes the socket 5 s after it even if never
    /// closed.
    pub deadline_unix_ms: u64,
}

/// A response from the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello(Hello),
    /// Answer to a successful [`Request::Open`].
    Opened(RunGrant),
    /// Answer to a successful [`Request::Close`].
    Closed(RunSummary),
    /// Answer to a successful [`Request::OpenSession`].
    SessionOpened(SessionSocket),
    /// Answer to a successful [`Request::CloseSession`].
    SessionClosed,
    /// Any request the broker would not carry out.
    Refused(Refusal),
}

/// The broker's greeting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// [`VERSION`].
    pub version: u32,
    /// How many registries have been loaded since start (1 after the first load).
    pub generation: u64,
    /// Profiles in the current registry.
    pub profiles: u32,
}

/// What a run gets when its grant opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunGrant {
    /// Absolute path of the run's `host-api.sock`.
    pub socket: PathBuf,
    /// The JS global's name (`host` when the profile says `""`).
    pub global: String,
    /// The profile's allow list, for the advisory in-guest check (`spec/grants.md` §4).
    pub allow: Vec<AllowedRoute>,
    /// The profile's preamble (or the content of its `preamble_file`); may be empty.
    pub preamble: String,
}

/// What a session gets when its socket opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSocket {
    /// Absolute path of the session's `host-api.sock`.
    pub socket: PathBuf,
}

/// One allow-list entry as the guest client carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowedRoute {
    /// Upper-case method.
    pub m: String,
    /// Path template (`*` fills a segment).
    pub p: String,
}

/// Counts for a closed run: what its audit line says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSummary {
    /// Every call attempt, denied ones included.
    pub calls: u64,
    /// Calls refused by the broker (ended, capacity, budget, route, cap, size).
    pub denied: u64,
    /// Calls shed while the circuit breaker was open.
    pub shed: u64,
    /// Calls not kept in the trace because it was full (256 rows).
    pub dropped: u64,
    /// `"METHOD /template"` → calls that matched that route.
    pub routes: BTreeMap<String, u64>,
    /// Each forwarded call kept in the trace (at most 256): its route and time upstream.
    #[serde(default)]
    pub latencies: Vec<CallLatency>,
}

/// How long one forwarded call spent upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallLatency {
    /// `"METHOD /template"`: the grant route, never the raw path.
    pub route: String,
    /// Microseconds from the request to the end of the response.
    pub micros: u64,
}

/// A request the broker would not carry out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// How plimsolld should mark the run's refusal.
    pub reason: RefusalReason,
    /// A message safe to show the caller (never a secret).
    pub message: String,
}

/// The `NotDispatched` reason a refusal maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// Unknown or forbidden profile, session not allowed, credential not minted.
    Permission,
    /// The run's deadline has already passed, or the broker is full.
    Capacity,
    /// A malformed request: bad or duplicate run or session id, unknown run or session, a
    /// session socket already lent.
    Request,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_by_op() {
        let open = Request::Open(OpenRun {
            run: "ab".repeat(16),
            principal: "alice".into(),
            profile: "inv".into(),
            deadline_unix_ms: 5,
            session: false,
            slot: None,
        });
        let line = serde_json::to_string(&open).unwrap();
        assert!(line.starts_with(r#"{"op":"open","run":"#), "{line}");
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), open);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"hello"}"#).unwrap(),
            Request::Hello
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"close","run":"x"}"#).unwrap(),
            Request::Close { run: "x".into() }
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        // (A unit variant of an internally tagged enum ignores extra keys; `hello` carries
        // nothing, so nothing can be misread.)
        assert!(serde_json::from_str::<Request>(r#"{"op":"close","run":"x","y":2}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"nope"}"#).is_err());
    }

    #[test]
    fn responses_are_tagged_by_status() {
        let refused = Response::Refused(Refusal {
            reason: RefusalReason::Permission,
            message: "no".into(),
        });
        let line = serde_json::to_string(&refused).unwrap();
        assert_eq!(
            line,
            r#"{"status":"refused","reason":"permission","message":"no"}"#
        );
        let hello = serde_json::to_string(&Response::Hello(Hello {
            version: 1,
            generation: 2,
            profiles: 3,
        }))
        .unwrap();
        assert_eq!(
            hello,
            r#"{"status":"hello","version":1,"generation":2,"profiles":3}"#
        );
    }

    #[test]
    fn session_messages_have_a_fixed_shape() {
        let open = Request::OpenSession(OpenSession {
            session: "cd".repeat(16),
            deadline_unix_ms: 7,
        });
        let line = serde_json::to_string(&open).unwrap();
        assert_eq!(
            line,
            format!(
                r#"{{"op":"open_session","session":"{}","deadline_unix_ms":7}}"#,
                "cd".repeat(16)
            )
        );
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), open);
        let close = Request::CloseSession {
            session: "x".into(),
        };
        let line = serde_json::to_string(&close).unwrap();
        assert_eq!(line, r#"{"op":"close_session","session":"x"}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), close);
        let opened = Response::SessionOpened(SessionSocket {
            socket: "/tmp/s/host-api.sock".into(),
        });
        let line = serde_json::to_string(&opened).unwrap();
        assert_eq!(
            line,
            r#"{"status":"session_opened","socket":"/tmp/s/host-api.sock"}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), opened);
        let closed = serde_json::to_string(&Response::SessionClosed).unwrap();
        assert_eq!(closed, r#"{"status":"session_closed"}"#);
        assert_eq!(
            serde_json::from_str::<Response>(&closed).unwrap(),
            Response::SessionClosed
        );
    }

    #[test]
    fn a_slot_is_sent_only_when_set() {
        let mut open = OpenRun {
            run: "ab".repeat(16),
            principal: "alice".into(),
            profile: "inv".into(),
            deadline_unix_ms: 5,
            session: true,
            slot: None,
        };
        let line = serde_json::to_string(&Request::Open(open.clone())).unwrap();
        assert!(!line.contains("slot"), "{line}");
        open.slot = Some("cd".repeat(16));
        let line = serde_json::to_string(&Request::Open(open.clone())).unwrap();
        assert!(line.ends_with(&format!(r#""session":true,"slot":"{}"}}"#, "cd".repeat(16))));
        assert_eq!(
            serde_json::from_str::<Request>(&line).unwrap(),
            Request::Open(open)
        );
    }
}
