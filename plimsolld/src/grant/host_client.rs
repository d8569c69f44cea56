//! The guest client library (grants.md §4): `globalThis[global]` with `call`, `get`, `put`,
//! `post`, `patch` and `del`, each returning a Promise, followed by the profile's preamble.
//!
//! One template (`host_client.js`) serves every guest; only the transport differs:
//! - [`node`]: `node:http` over the Unix socket named by `HOST_API_SOCKET` (docker
//!   snippets, prepended; docker projects, as the plan's `hostSDK`);
//! - [`quickjs`]: the wasm guest's synchronous `__coderunner_host_call`.
//!
//! The library carries a copy of the allow list for an early, advisory refusal. It is not
//! a boundary: the broker checks every call again, and the guest may rewrite all of this.

use super::GuestGrant;

/// The template; `__GLOBAL__`, `__ALLOW__` and `__TRANSPORT__` are filled in.
const TEMPLATE: &str = include_str!("host_client.js");

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
      const req = http.request({ socketPath, method, path, headers }, (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () =>
          resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString("utf8") }),
        );
      });
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

/// The library for a Node guest (docker snippets and projects).
pub fn node(grant: &GuestGrant) -> String {
    render(grant, NODE_TRANSPORT)
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
        .replace("__TRANSPORT__", transport);
    if !grant.preamble.is_empty() {
        library.push_str(&grant.preamble);
        library.push('\n');
    }
    library
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::grant::Route;

    fn grant() -> GuestGrant {
        GuestGrant {
            socket: PathBuf::from("/tmp/x/host-api.sock"),
            global: "inv\"entory".to_owned(),
            allow: vec![Route {
                m: "GET".to_owned(),
                p: "/items/*".to_owned(),
            }],
            preamble: "globalThis.extra = 1;".to_owned(),
        }
    }

    #[test]
    fn the_library_names_the_global_as_json_and_ends_with_the_preamble() {
        let js = node(&grant());
        assert!(js.contains(r#"const name = "inv\"entory";"#), "{js}");
        assert!(js.contains(r#"[{"m":"GET","p":"/items/*"}]"#), "{js}");
        assert!(js.contains("node:http"));
        assert!(js.trim_end().ends_with("globalThis.extra = 1;"));
        let q = quickjs(&grant());
        assert!(q.contains("__coderunner_host_call") && !q.contains("node:http"));
        assert!(!q.contains("__TRANSPORT__") && !q.contains("__ALLOW__"));
    }
}
