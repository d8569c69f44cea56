//! The guest client library (grants.md §4): `globalThis[global]` with `call`, `get`, `put`,
//! `post`, `patch` and `del`, each returning a Promise, followed by the profile's preamble.
//!
//! One template (`host_client.js`) serves every guest; only the transport differs:
//! - [`node`]: `node:http` over the Unix socket named by `HOST_API_SOCKET` (docker
//!   snippets, prepended; docker projects, as the plan's `hostSDK`; openshell's relay);
//! - [`node_guard`]: one `POST` of the envelope per call to the guard URL, never following a
//!   redirect (e2b, dockercloud: a granted snippet gets it prepended, a project step through
//!   `NODE_OPTIONS=--import`); `fetch`, or `node:https` to a pinned address when the VM has
//!   no nameserver (e2b);
//! - [`quickjs`]: the wasm guest's synchronous `__coderunner_host_call`.
//!
//! The library carries a copy of the allow list for an early, advisory refusal. It is not
//! a boundary: the broker checks every call again, and the guest may rewrite all of this.

use super::GuestGrant;
use guard::token;

/// The template; `__GLOBAL__`, `__ALLOW__` and `__TRANSPORT__` are filled in.
const TEMPLATE: &str = include_str!("host_client.js");

/// How both Node transports read an answer (`__ANSWER__` in them): the status and the body
/// as text, resolving or rejecting the call's promise.
const NODE_ANSWER: &str = r#"(res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () =>
          resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString("utf8") }),
        );
      }"#;

/// The Node transport: one HTTP/1.1 request per call on the run's socket, the raw path as
/// the target, the body as JSON with its length.
const NODE_TRANSPORT: &str = r#"async (method, path, body) => {
    const http = await import("node:http");
    const payload = body === undefined ? undefined : JSON.stringify(body);
    return await new Promise((resolve, reject) => {
      const headers = {};
      if (payload !== undefined) {
        headers["content-type"] = "application/json";
        headers["content-length"] = Buffer.byteLength(payload);
      }
      const socketPath = process.env.HOST_API_SOCKET || "/run/host-api.sock";
      const req = http.request({ socketPath, method, path, headers }, __ANSWER__);
      req.on("error", reject);
      if (payload !== undefined) req.write(payload);
      req.end();
    });
  }"#;

/// The QuickJS transport: the host function answers synchronously with `{status, body}`.
const QUICKJS_TRANSPORT: &str = r#"((relay) => async (method, path, body) => {
    const envelope = { method, path };
    if (body !== undefined) envelope.body = body;
    return relay(JSON.stringify(envelope));
  })(globalThis.__coderunner_host_call)"#;

/// The guard transport (grants.md §4): the envelope posted as JSON to the guard URL,
/// `redirect: "error"` so no answer can send it (or its header) elsewhere; the status and
/// text come back. `__GUARD_URL__` and `__HEADERS__` are filled in as JSON.
const GUARD_TRANSPORT: &str = r#"async (method, path, body) => {
    const envelope = { method, path };
    if (body !== undefined) envelope.body = body;
    const res = await fetch(__GUARD_URL__, {
      method: "POST",
      redirect: "error",
      headers: __HEADERS__,
      body: JSON.stringify(envelope),
    });
    return { status: res.status, body: await res.text() };
  }"#;

/// [`GUARD_TRANSPORT`] for a VM without a nameserver (E2B with `dnsServers: []`): the guard's
/// name is never looked up; the connection goes to `__ADDRESS__` with the name as its TLS
/// server name and `Host`. E2B's egress firewall matches that name and dials it itself, so
/// the address only has to leave the VM. `node:https` follows no redirect.
const PINNED_GUARD_TRANSPORT: &str = r#"async (method, path, body) => {
    const https = await import("node:https");
    const envelope = { method, path };
    if (body !== undefined) envelope.body = body;
    const payload = JSON.stringify(envelope);
    const address = __ADDRESS__;
    const lookup = (_name, options, done) =>
      options && options.all ? done(null, [{ address, family: 4 }]) : done(null, address, 4);
    return await new Promise((resolve, reject) => {
      const headers = __HEADERS__;
      headers["content-length"] = Buffer.byteLength(payload);
      const req = https.request(__GUARD_URL__, { method: "POST", headers, lookup }, __ANSWER__);
      req.on("error", reject);
      req.end(payload);
    });
  }"#;

/// Who adds a guard call's `X-Plimsoll-Guard` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPlacement {
    /// The vendor's egress proxy, from a network rule outside the VM (E2B): the library
    /// carries no token and the guest never sees one.
    Proxy,
    /// The guest's client (Docker Cloud, whose proxy cannot add headers): the library
    /// carries the run's token. It works only at the guard, only for this run's grant, and
    /// dies with the run.
    Guest,
}

/// The library for a Node guest (docker snippets and projects).
pub fn node(grant: &GuestGrant) -> String {
    render(grant, NODE_TRANSPORT)
}

/// The library for a Node guest that reaches its grant through the guard at `guard_url`
/// (e2b, dockercloud). With [`TokenPlacement::Guest`] the grant's guard token goes in each
/// call's `X-Plimsoll-Guard` header; with [`TokenPlacement::Proxy`] no token is in the
/// library at all. With `pinned`, the guard's name is never looked up (a VM without a
/// nameserver): the library connects to that address ([`PINNED_GUARD_TRANSPORT`]).
pub fn node_guard(
    grant: &GuestGrant,
    guard_url: &str,
    placement: TokenPlacement,
    pinned: Option<std::net::Ipv4Addr>,
) -> String {
    let mut headers = serde_json::Map::new();
    headers.insert("content-type".into(), "application/json".into());
    if placement == TokenPlacement::Guest
        && let Some(token) = grant.access.guard_token()
    {
        headers.insert(token::HEADER.into(), token.expose().into());
    }
    let url = serde_json::to_string(guard_url).unwrap_or_else(|_| "\"\"".to_owned());
    let headers = serde_json::Value::Object(headers).to_string();
    let transport = match pinned {
        None => GUARD_TRANSPORT.to_owned(),
        Some(address) => PINNED_GUARD_TRANSPORT.replace("__ADDRESS__", &format!("\"{address}\"")),
    };
    let transport = transport
        .replace("__GUARD_URL__", &url)
        .replace("__HEADERS__", &headers);
    render(grant, &transport)
}

/// The library for the wasm guest (QuickJS).
pub fn quickjs(grant: &GuestGrant) -> String {
    render(grant, QUICKJS_TRANSPORT)
}

fn render(grant: &GuestGrant, transport: &str) -> String {
    // JSON text is a JavaScript expression, so the name and the allow list cannot break
    // out of their places whatever the grants file holds.
    let name = serde_json::to_string(&grant.global).unwrap_or_else(|_| "\"host\"".to_owned());
    let allow = serde_json::to_string(
        &grant
            .allow
            .iter()
            .map(|r| serde_json::json!({ "m": r.m, "p": r.p }))
            .collect::<Vec<_>>(),
    )
    .unwrap_or_else(|_| "[]".to_owned());
    let mut library = TEMPLATE
        .replace("__GLOBAL__", &name)
        .replace("__ALLOW__", &allow)
        .replace(
            "__TRANSPORT__",
            &transport.replace("__ANSWER__", NODE_ANSWER),
        );
    if !grant.preamble.is_empty() {
        library.push_str(&grant.preamble);
        library.push('\n');
    }
    library
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::grant::{GuardToken, GuestAccess, Route};

    fn grant() -> GuestGrant {
        GuestGrant::new(
            GuestAccess::Socket(PathBuf::from("/tmp/x/host-api.sock")),
            "inv\"entory".to_owned(),
            vec![Route {
                m: "GET".to_owned(),
                p: "/items/*".to_owned(),
            }],
            "globalThis.extra = 1;".to_owned(),
        )
    }

    #[test]
    fn the_guard_library_carries_the_token_only_when_the_guest_must_hold_it() {
        let (token, _) = GuardToken::mint();
        let mut g = grant();
        g.access = GuestAccess::Guard(token.clone());
        let url = "https://guard.example.com/v1/dockercloud/guard";
        let held = node_guard(&g, url, TokenPlacement::Guest, None);
        assert!(held.contains(&format!(r#""x-plimsoll-guard":"{}""#, token.expose())));
        assert!(held.contains(r#"fetch("https://guard.example.com/v1/dockercloud/guard""#));
        assert!(held.contains(r#"redirect: "error""#) && !held.contains("node:http"));
        let injected = node_guard(&g, url, TokenPlacement::Proxy, None);
        assert!(!injected.contains(token.expose()) && !injected.contains("x-plimsoll-guard"));
        assert!(injected.contains(r#"{"content-type":"application/json"}"#));
        assert!(!injected.contains("__"), "every placeholder is filled");
        let pinned = node_guard(
            &g,
            url,
            TokenPlacement::Proxy,
            Some(std::net::Ipv4Addr::new(203, 0, 113, 9)),
        );
        assert!(
            pinned.contains(r#"const address = "203.0.113.9";"#),
            "{pinned}"
        );
        assert!(
            pinned.contains(r#"https.request("https://guard.example.com/v1/dockercloud/guard""#)
        );
        assert!(!pinned.contains("fetch(") && !pinned.contains(token.expose()));
        assert!(pinned.contains("Buffer.concat(chunks)"));
        assert!(!pinned.contains("__"), "every placeholder is filled");
    }

    #[test]
    fn the_library_names_the_global_as_json_and_ends_with_the_preamble() {
        let js = node(&grant());
        assert!(js.contains(r#"const name = "inv\"entory";"#), "{js}");
        assert!(js.contains(r#"[{"m":"GET","p":"/items/*"}]"#), "{js}");
        assert!(js.contains("node:http"));
        assert!(js.contains("Buffer.concat(chunks)") && !js.contains("__ANSWER__"));
        assert!(js.trim_end().ends_with("globalThis.extra = 1;"));
        let q = quickjs(&grant());
        assert!(q.contains("__coderunner_host_call") && !q.contains("node:http"));
        assert!(!q.contains("__TRANSPORT__") && !q.contains("__ALLOW__"));
    }
}
