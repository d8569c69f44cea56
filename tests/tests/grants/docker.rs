//! The guest-facing grant claims on docker snippets (grants.md §3 docker row, §4): the
//! run's socket at `/run/host-api.sock`, `HOST_API_SOCKET`, the node client prepended, and
//! nothing of the sort without a grant. The runtime comes from
//! `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc`, the default, or `runsc`), as in `tests/docker.rs`;
//! missing docker or images FAIL unless `PLIMSOLL_TEST_DOCKER_SKIP=1`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Fixture, SECRET, bearers, borrowed, ran, refused, run, run_request, verify_jwt};
use plimsoll_tests::Daemon;
use plimsoll_tests::docker::{docker_ready, runsc, tier};

/// A docker daemon's proof takes longer than the harness's default wait.
const START: Duration = Duration::from_secs(120);

pub(crate) fn docker_daemon(f: &Fixture) -> Daemon {
    let mut extra = vec![("SANDBOX_PROVIDER", "docker")];
    if runsc() {
        extra.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    let env = f.env(&extra);
    Daemon::start_within(&borrowed(&env), START)
}

/// Everything a node guest can look at for a credential: its environment, the files under
/// the usual directories and its process's environ, reported as paths of hits (a JWT-shaped
/// string or the test secrets' prefix), never as content.
pub(crate) const LOOK_AROUND: &str = r#"
const fs = require('fs');
const hits = [];
// A decoy proves the search finds what it looks for. The secret's prefix is put together at
// run time, so the program's own text (a project step's command line) is no hit.
const prefix = ['grants', 'test', 'secret'].join('-');
fs.writeFileSync('/tmp/decoy', prefix + '-decoy');
const suspicious = (t) => /eyJ[A-Za-z0-9_-]{8,}\.eyJ/.test(t) || t.includes(prefix);
const walk = (dir, depth) => {
  if (depth > 8) return;
  let names;
  try { names = fs.readdirSync(dir); } catch (_) { return; }
  for (const n of names) {
    const p = (dir === '/' ? '' : dir) + '/' + n;
    let st;
    try { st = fs.lstatSync(p); } catch (_) { continue; }
    if (st.isDirectory()) walk(p, depth + 1);
    else if (st.isFile() && st.size < (1 << 20)) {
      try { if (suspicious(fs.readFileSync(p, 'latin1'))) hits.push(p); } catch (_) {}
    }
  }
};
for (const d of ['/run', '/tmp', '/etc', '/home', '/root', '/var', '/opt', '/srv', '/mnt']) walk(d, 0);
for (const p of ['/proc/self/environ', '/proc/self/cmdline', '/proc/1/environ']) {
  try { if (suspicious(fs.readFileSync(p, 'latin1'))) hits.push(p); } catch (_) {}
}
"#;

#[test]
fn docker_snippets_reach_only_their_grant_and_never_the_credential() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let d = docker_daemon(&f);
    let tier = tier();
    assert_eq!(d.listening["isolation"], tier, "{}", d.listening);

    // Granted: the client works, the socket and its variable are there, nothing leaks.
    let code = format!(
        "(async () => {{\n{LOOK_AROUND}\n\
         const item = await host.get('/items/7');\n\
         console.log(JSON.stringify({{ item, socket: process.env.HOST_API_SOCKET,\n\
           exists: fs.existsSync('/run/host-api.sock'), hits, env: process.env }}));\n\
         }})().catch((e) => {{ console.error(String(e)); process.exit(3); }});"
    );
    let out = run(d.addr, &f.alice, &code, "inv");
    assert_eq!(out.exit_code, 0, "{out:?}");
    let seen: Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(seen["item"]["id"], 7, "{seen}");
    assert_eq!(seen["socket"], "/run/host-api.sock", "{seen}");
    assert_eq!(seen["exists"], true, "{seen}");
    assert_eq!(seen["hits"], serde_json::json!(["/tmp/decoy"]), "{seen}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    for secret in [tokens[0].as_str(), SECRET] {
        assert!(!out.stdout.contains(secret) && !out.stderr.contains(secret));
    }

    // A route outside the profile, sent raw past the client's check: the broker refuses
    // and the API sees nothing.
    f.api.clear_requests();
    let raw = "require('http').get({ socketPath: process.env.HOST_API_SOCKET, path: '/admin' },\n\
               (res) => console.log(res.statusCode)).on('error', (e) => console.log(String(e)));";
    let out = run(d.addr, &f.alice, raw, "inv");
    assert_eq!(out.stdout, "403\n", "{out:?}");
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());

    // Without a grant: no socket, no variable, no client.
    let bare = "const fs = require('fs');\n\
                console.log(fs.existsSync('/run/host-api.sock'), process.env.HOST_API_SOCKET, typeof host);\n\
                host.get('/items/7');";
    let out = run(d.addr, &f.alice, bare, "");
    assert_eq!(out.stdout, "false undefined undefined\n", "{out:?}");
    assert_ne!(out.exit_code, 0, "host.get fails inside the guest: {out:?}");
    assert!(out.stderr.contains("ReferenceError"), "{out:?}");

    // A slow API does not keep the run past its deadline.
    let started = Instant::now();
    let slow = "(async () => { await host.get('/slow'); })();";
    let out = ran(&run_request(&f.alice, slow, "inv", 2_000).send(d.addr));
    assert!(out.timed_out, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );

    // The permission refusal is the same as on wasm.
    let err = refused(d.addr, &f.mallory, "1", "inv");
    assert_eq!(
        err.message,
        "grant_profile \"inv\" is not available to this caller"
    );
}

/// A project Run request naming `profile` ("" = none).
fn project_request(token: &str, steps: &[&str], profile: &str) -> plimsoll_tests::http1::Request {
    let mut body = plimsoll_tests::connect::project(&[("main.mjs", "")], steps);
    if !profile.is_empty() {
        body["project"]["grantProfile"] = serde_json::json!(profile);
    }
    body["timeoutMs"] = serde_json::json!(30_000);
    plimsoll_tests::connect::call_as(token, "Run", &body)
}

/// Each step's stdout (decoded), after checking the project completed.
fn project_stdouts(resp: &plimsoll_tests::http1::Response) -> Vec<String> {
    use base64::Engine as _;
    assert_eq!(resp.status, 200, "expected a result:\n{resp}");
    let v = resp.json();
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    v["project"]["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let b = s["stdout"].as_str().unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect()
}

#[test]
fn docker_projects_get_the_client_in_every_node_step_and_never_the_credential() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let d = docker_daemon(&f);
    let v = plimsoll_tests::connect::call_as(&f.alice, "Describe", &serde_json::json!({}))
        .send(d.addr)
        .json();
    assert_eq!(v["supportsProjectGrants"], true, "{v}");

    // Every node a step starts has the client (preloaded), and the socket is mounted.
    let look = format!(
        "node -e \"{}\"",
        format!(
            "(async () => {{ {LOOK_AROUND} const item = await host.get('/items/7'); \
             console.log(JSON.stringify({{ item, socket: process.env.HOST_API_SOCKET, hits }})); }})()\
             .catch((e) => {{ console.error(String(e)); process.exit(3); }});"
        )
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('$', "\\$")
        .replace('`', "\\`")
    );
    let steps = [look.as_str(), "env | grep -c HOST_API_SOCKET"];
    let out = project_stdouts(&project_request(&f.alice, &steps, "inv").send(d.addr));
    let seen: Value = serde_json::from_str(out[0].trim()).expect("one JSON line");
    assert_eq!(seen["item"]["id"], 7, "{seen}");
    assert_eq!(seen["socket"], "/run/host-api.sock", "{seen}");
    assert_eq!(seen["hits"], serde_json::json!(["/tmp/decoy"]), "{seen}");
    assert_eq!(out[1], "1\n");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    for text in &out {
        assert!(
            !text.contains(&tokens[0]) && !text.contains(SECRET),
            "{text}"
        );
    }

    // Without a grant: no socket, no variable, no client in a step's node.
    f.api.clear_requests();
    let steps = [
        "test ! -e /run/host-api.sock && test -z \"$HOST_API_SOCKET\" && echo bare",
        "node -e 'console.log(typeof host)'",
    ];
    let out = project_stdouts(&project_request(&f.alice, &steps, "").send(d.addr));
    assert_eq!(out, ["bare\n", "undefined\n"]);
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());

    // A foreign caller gets the same permission refusal for a project.
    let resp = project_request(&f.mallory, &["true"], "inv").send(d.addr);
    assert_ne!(resp.status, 200, "{resp}");
    crate::assert_permission(&plimsoll_tests::connect::ConnectError::of(&resp));
}
