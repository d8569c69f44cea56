//! The control protocol's messages.
//!
//! One JSON object per line in each direction; every request line gets exactly one response
//! line, and a connection may carry many requests. Unknown fields are refused both ways, so a
//! daemon and a broker of different versions fail loudly instead of misreading each other.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol version [`Hello`] reports. 2 added the catalogue ([`Request::Catalogue`],
/// [`Hello::catalogue`]); 3: a run or session names how its grant reaches the guest
/// ([`Delivery`]) and learns where ([`Reach`]), and [`Hello`] says whether a guard socket is
/// served; 4: a call lent to a guard session slot may ask for a token of its own
/// ([`OpenRun::call_token`]).
pub const VERSION: u32 = 4;

/// Longest request or response line either side accepts, newline excluded.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A request from plimsolld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Liveness and registry generation; plimsolld's readiness probe uses it.
    Hello,
    /// The credential-free catalogue of the current profiles: which exist, who may use
    /// them, which may be lent in sessions. plimsolld refuses what the catalogue already
    /// refuses without asking the broker to open anything.
    Catalogue,
    /// Opens one run's grant: mints the credential and makes the grant reachable the way
    /// the run asks (its own socket, a guard token, or the session's slot it is lent to).
    Open(OpenRun),
    /// Ends a run's grant at once: the socket is removed (or the token dies, or the session's
    /// slot is emptied), then in-flight calls are cut.
    Close {
        /// The run id given to [`Request::Open`].
        run: String,
    },
    /// Opens a session's slot: a socket (mounted once at session open) or a guard token, for
    /// the session's life; it serves only the grant a call lends it.
    OpenSession(OpenSession),
    /// Ends a session's slot: a grant still lent is closed, the socket is removed or the
    /// token dies.
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
    /// How the grant reaches the guest. A lent run must name its session's delivery.
    pub delivery: Delivery,
    /// Lend this run's grant to the slot of this open session (instead of a socket or token
    /// of its own). Needs `session: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// A lent call: how many processes earlier calls of the session left running in the
    /// sandbox (held stopped by plimsolld while the grant is lent). The audit line says so:
    /// the call shared its kernel with them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept_from_earlier_calls: u32,
    /// A call lent to a guard-delivered session slot: mint a guard token for this call
    /// alone, dead when the run closes, and answer it instead of [`Reach::SessionSlot`]
    /// (E2B_SESSION_GRANTS=call: the VM's guard rule names a fresh token per call, so no
    /// token seen in one call works in another). Needs `slot` and `delivery: guard`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub call_token: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How a grant reaches the guest: the provider's choice (grants.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// A Unix socket on the host that the provider mounts or relays into the sandbox
    /// (docker, wasm's host functions, openshell's relay).
    Socket,
    /// The guard: a per-run token the guard accepts for this grant only (e2b, dockercloud).
    /// The broker must serve a guard socket.
    Guard,
}

/// Where a grant is reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reach {
    /// Absolute path of a `host-api.sock`.
    Socket(PathBuf),
    /// A guard token, `crg_` and 64 hex characters: a credential for this grant alone,
    /// accepted only by the guard, dead when the run (or session) ends. Never log it.
    GuardToken(String),
    /// The session's slot it is lent to: wherever the session's own [`Reach`] said.
    SessionSlot,
}

/// What plimsolld asks for when a session opens: one slot for the session's life, reached
/// the way `delivery` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// Session slot id chosen by plimsolld: 32 lowercase hex characters (never the session
    /// id the caller sees).
    pub session: String,
    /// The session's end in Unix ms; the broker removes the slot 5 s after it even if never
    /// closed.
    pub deadline_unix_ms: u64,
    /// How the slot reaches the guest.
    pub delivery: Delivery,
}

/// A response from the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello(Hello),
    /// Answer to [`Request::Catalogue`].
    Catalogue(Catalogue),
    /// Answer to a successful [`Request::Open`].
    Opened(RunGrant),
    /// Answer to a successful [`Request::Close`].
    Closed(RunSummary),
    /// Answer to a successful [`Request::OpenSession`].
    SessionOpened(SessionSlot),
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
    /// Whether the broker serves a guard socket (so [`Delivery::Guard`] can be asked for).
    pub guard: bool,
    /// Calls in flight over every open run right now.
    pub in_flight: u64,
    /// [`Catalogue::fingerprint`] of the current registry: a changed value means plimsolld's
    /// copy of the catalogue is stale (a reload, or another broker process).
    pub catalogue: String,
}

/// The current profiles as plimsolld may know them: names, callers, session use. Never a
/// credential, a URL or a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalogue {
    /// A digest of `profiles` (SHA-256, hex), as [`Hello::catalogue`] states it.
    pub fingerprint: String,
    /// One entry per profile, by name.
    pub profiles: Vec<CatalogueEntry>,
}

/// One profile in the [`Catalogue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueEntry {
    /// The profile's name.
    pub name: String,
    /// Its `allowed_callers`, sorted; `["*"]` admits every authenticated caller.
    pub allowed_callers: Vec<String>,
    /// Its `allow_in_sessions`.
    pub allow_in_sessions: bool,
}

// === impl Catalogue ===

impl Catalogue {
    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&CatalogueEntry> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

// === impl CatalogueEntry ===

impl CatalogueEntry {
    /// Whether `principal` may use the profile: never `""` or `"*"`, as the broker decides
    /// (grants.md §1.5).
    pub fn admits(&self, principal: &str) -> bool {
        !principal.is_empty()
            && principal != "*"
            && self
                .allowed_callers
                .iter()
                .any(|c| c == "*" || c == principal)
    }
}

/// What a run gets when its grant opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunGrant {
    /// Where the guest reaches the grant.
    pub reach: Reach,
    /// The JS global's name (`host` when the profile says `""`).
    pub global: String,
    /// The profile's allow list, for the advisory in-guest check (`spec/grants.md` §4).
    pub allow: Vec<AllowedRoute>,
    /// The profile's preamble (or the content of its `preamble_file`); may be empty.
    pub preamble: String,
}

/// What a session gets when its slot opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSlot {
    /// Where the guest reaches the grant a call lends: a socket or a guard token (never
    /// [`Reach::SessionSlot`]).
    pub reach: Reach,
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

impl Response {
    /// The broker's refusal, for `reason`, with a message safe to show the caller.
    pub fn refused(reason: RefusalReason, message: impl Into<String>) -> Response {
        Response::Refused(Refusal {
            reason,
            message: message.into(),
        })
    }
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
            delivery: Delivery::Socket,
            slot: None,
            kept_from_earlier_calls: 0,
            call_token: false,
        });
        let line = serde_json::to_string(&open).unwrap();
        assert!(line.starts_with(r#"{"op":"open","run":"#), "{line}");
        assert!(
            line.ends_with(r#""session":false,"delivery":"socket"}"#),
            "{line}"
        );
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
            version: 4,
            generation: 2,
            profiles: 3,
            guard: true,
            in_flight: 4,
            catalogue: "ab".into(),
        }))
        .unwrap();
        assert_eq!(
            hello,
            r#"{"status":"hello","version":4,"generation":2,"profiles":3,"guard":true,"in_flight":4,"catalogue":"ab"}"#
        );
    }

    #[test]
    fn session_messages_have_a_fixed_shape() {
        let open = Request::OpenSession(OpenSession {
            session: "cd".repeat(16),
            deadline_unix_ms: 7,
            delivery: Delivery::Guard,
        });
        let line = serde_json::to_string(&open).unwrap();
        assert_eq!(
            line,
            format!(
                r#"{{"op":"open_session","session":"{}","deadline_unix_ms":7,"delivery":"guard"}}"#,
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
        let opened = Response::SessionOpened(SessionSlot {
            reach: Reach::Socket("/tmp/s/host-api.sock".into()),
        });
        let line = serde_json::to_string(&opened).unwrap();
        assert_eq!(
            line,
            r#"{"status":"session_opened","reach":{"socket":"/tmp/s/host-api.sock"}}"#
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
    fn a_grant_says_where_it_is_reached() {
        let token = format!("crg_{}", "ab".repeat(32));
        for (reach, text) in [
            (Reach::Socket("/s".into()), r#"{"socket":"/s"}"#.to_owned()),
            (
                Reach::GuardToken(token.clone()),
                format!(r#"{{"guard_token":"{token}"}}"#),
            ),
            (Reach::SessionSlot, r#""session_slot""#.to_owned()),
        ] {
            let grant = Response::Opened(RunGrant {
                reach: reach.clone(),
                global: "host".into(),
                allow: Vec::new(),
                preamble: String::new(),
            });
            let line = serde_json::to_string(&grant).unwrap();
            assert!(line.contains(&format!(r#""reach":{text}"#)), "{line}");
            assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), grant);
        }
        assert!(serde_json::from_str::<Reach>(r#"{"socket":"/s","x":1}"#).is_err());
        assert!(serde_json::from_str::<Delivery>(r#""relay""#).is_err());
    }

    #[test]
    fn the_catalogue_admits_as_the_broker_does() {
        let catalogue = Catalogue {
            fingerprint: "f".into(),
            profiles: vec![
                CatalogueEntry {
                    name: "inv".into(),
                    allowed_callers: vec!["alice".into()],
                    allow_in_sessions: false,
                },
                CatalogueEntry {
                    name: "open".into(),
                    allowed_callers: vec!["*".into()],
                    allow_in_sessions: true,
                },
            ],
        };
        let inv = catalogue.get("inv").unwrap();
        assert!(inv.admits("alice") && !inv.admits("bob") && !inv.admits(""));
        let open = catalogue.get("open").unwrap();
        assert!(open.admits("bob") && !open.admits("*") && !open.admits(""));
        assert!(catalogue.get("nope").is_none());
        let line = serde_json::to_string(&Response::Catalogue(catalogue.clone())).unwrap();
        assert!(
            line.starts_with(
                r#"{"status":"catalogue","fingerprint":"f","profiles":[{"name":"inv","#
            ),
            "{line}"
        );
        assert_eq!(
            serde_json::from_str::<Response>(&line).unwrap(),
            Response::Catalogue(catalogue)
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"catalogue"}"#).unwrap(),
            Request::Catalogue
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
            delivery: Delivery::Socket,
            slot: None,
            kept_from_earlier_calls: 0,
            call_token: false,
        };
        let line = serde_json::to_string(&Request::Open(open.clone())).unwrap();
        assert!(!line.contains("slot"), "{line}");
        open.slot = Some("cd".repeat(16));
        let line = serde_json::to_string(&Request::Open(open.clone())).unwrap();
        assert!(line.ends_with(&format!(
            r#""session":true,"delivery":"socket","slot":"{}"}}"#,
            "cd".repeat(16)
        )));
        assert_eq!(
            serde_json::from_str::<Request>(&line).unwrap(),
            Request::Open(open)
        );
    }
}
