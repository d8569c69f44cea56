//! The wasm provider, run for real: the embedded guest in a real engine, through the
//! `Provider` trait the service calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

/// Serializes preparation, so that on a machine with no cached artifact one test compiles
/// the guest and the others load what it cached instead of all compiling at once.
static PREPARING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(extra: &[(&str, &str)]) -> Config {
    let mut env: HashMap<String, String> =
        [("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_INSECURE", "1")]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    env.insert("PLIMSOLL_METRICS_ADDR".into(), "off".into());
    Config::from_env(&env).expect("a valid wasm configuration")
}

async fn ready_provider(extra: &[(&str, &str)]) -> Wasm {
    let provider = Wasm::new(&config(extra));
    let _one_at_a_time = PREPARING.lock().await;
    provider
        .preflight()
        .await
        .expect("preflight prepares the engine");
    provider
}

async fn run(provider: &Wasm, code: &str, timeout: Duration) -> SnippetOutcome {
    provider
        .run_snippet(SnippetRun {
            code: code.to_owned(),
            timeout,
            hold: Hold::default(),
            grant: None,
        })
        .await
        .expect("a guest's own failure is a result, not an error")
}

#[tokio::test]
async fn describe_states_the_embedded_guest_and_nothing_it_cannot_do() {
    let provider = Wasm::new(&config(&[]));
    let d = provider.describe();
    let hex = hex::encode(Sha256::digest(GUEST));
    assert_eq!(d.sandbox, "wasm");
    assert_eq!(d.javascript.identity, format!("quickjs-wasm:sha256:{hex}"));
    assert_eq!(d.javascript.max_timeout_ms, 30_000);
    // The module is the software too: a rule can name it by the same content address.
    assert_eq!(d.javascript.software_identity, d.javascript.identity);
    assert!(!d.supports_project && !d.supports_module && !d.supports_sessions);
    // Snippets reach a grant through `host_call`; projects do not run here at all.
    assert!(d.supports_javascript_grants && !d.supports_project_grants);
    assert_eq!(d.project, Environment::default());
    assert_eq!(d.javascript.default_timeout_ms, 5_000);
}

#[tokio::test]
async fn tier_is_process_only_once_prepared() {
    let provider = Wasm::new(&config(&[]));
    assert_eq!(provider.current_tier(), IsolationTier::None);
    assert!(provider.ready().await.is_err());
    let err = provider
        .run_snippet(SnippetRun {
            code: "1".into(),
            timeout: Duration::from_secs(1),
            hold: Hold::default(),
            grant: None,
        })
        .await
        .expect_err("nothing runs before preflight");
    // The cause stays typed under the infrastructure error.
    match err {
        ProviderError::Infrastructure(cause) => {
            assert!(
                matches!(cause.downcast_ref(), Some(WasmError::NotPrepared)),
                "{cause}"
            )
        }
        other => panic!("expected an infrastructure error, got {other:?}"),
    }
    let _one_at_a_time = PREPARING.lock().await;
    assert_eq!(
        provider.preflight().await.expect("preflight").tier,
        IsolationTier::Process
    );
    assert_eq!(provider.current_tier(), IsolationTier::Process);
    assert!(provider.ready().await.is_ok());
}

#[tokio::test]
async fn proof_runs_six_times_seven_through_the_run_path() {
    let provider = ready_provider(&[]).await;
    let evidence = provider.prove().await.expect("the proof passes");
    assert_eq!(evidence.tier, IsolationTier::Process);
    let out = run(&provider, "console.log(6*7)", Duration::from_secs(5)).await;
    assert_eq!(out.stdout, b"42\n");
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.environment, provider.identity());
    assert_eq!(out.software_identity, provider.identity());
    assert_eq!(out.instance, "");
}

#[tokio::test]
async fn uncaught_error_is_a_result_with_exit_1_and_the_error_on_stderr() {
    let provider = ready_provider(&[]).await;
    let out = run(
        &provider,
        "console.log('before'); throw 'boom'",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(out.exit_code, 1);
    assert_eq!(out.stdout, b"before\n");
    assert_eq!(out.stderr, b"boom\n");
    // Every console method prints to stdout (providers.md §3.4); only the uncaught error
    // above reached stderr.
    let out = run(
        &provider,
        "console.error('e'); console.warn('w'); console.info('i')",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_slice(), out.stderr.as_slice()),
        (0, b"e\nw\ni\n".as_slice(), b"".as_slice())
    );
}

/// The globals of providers.md §3.4: `scriptArgs`, and an en-US `Intl.NumberFormat` behind
/// `toLocaleString` (QuickJS has no Intl).
#[tokio::test]
async fn intl_number_format_and_script_args_are_there() {
    let provider = ready_provider(&[]).await;
    let code = "const usd = new Intl.NumberFormat('en-US', { style: 'currency', currency: 'USD' });\n\
                console.log(usd.format(1234.5), usd.format(-0.5));\n\
                console.log((1234567.891).toLocaleString(), (0.256).toLocaleString('en-US', { style: 'percent' }));\n\
                console.log(new Intl.NumberFormat('en-US', { style: 'currency', currency: 'JPY' }).format(1234.5));\n\
                console.log((1234.5).toLocaleString('en-US', { minimumFractionDigits: 2 }), JSON.stringify(scriptArgs));\n\
                console.log((1.005).toLocaleString('en-US', { maximumFractionDigits: 2 }), (-0).toLocaleString(), (1e21).toLocaleString());\n\
                console.log([1234, 0.5].map(usd.format).join(' '), (9.995).toLocaleString('en-US', { maximumFractionDigits: 2.7 }));";
    let out = run(&provider, code, Duration::from_secs(5)).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "$1,234.50 -$0.50\n1,234,567.891 26%\n¥1,235\n1,234.50 []\n\
         1.01 -0 1,000,000,000,000,000,000,000\n$1,234.00 $0.50 10\n",
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn infinite_loop_ends_at_the_deadline_never_before_it() {
    let provider = ready_provider(&[]).await;
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let out = run(&provider, "console.log('spinning'); for (;;) {}", timeout).await;
    let took = started.elapsed();
    assert_eq!(out.exit_code, 124);
    assert!(out.timed_out);
    assert_eq!(
        out.stdout, b"spinning\n",
        "output before the deadline is kept"
    );
    assert!(
        out.duration >= timeout,
        "ended after {:?}, before its deadline",
        out.duration
    );
    assert!(took < timeout + Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn a_far_timer_does_not_outlive_the_deadline() {
    let provider = ready_provider(&[]).await;
    let out = run(
        &provider,
        "setTimeout(() => console.log('late'), 60000)",
        Duration::from_millis(200),
    )
    .await;
    assert_eq!((out.exit_code, out.timed_out), (124, true));
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn memory_past_the_cap_fails_inside_the_guest_and_the_next_run_is_fresh() {
    let provider = ready_provider(&[("SANDBOX_MEMORY_MB", "32")]).await;
    let bomb = "const keep = []; for (;;) keep.push(new Array(1 << 20).fill(7));";
    let out = run(&provider, bomb, Duration::from_secs(20)).await;
    assert_ne!(out.exit_code, 0);
    assert!(!out.timed_out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("out of memory"), "stderr: {stderr}");
    let out = run(
        &provider,
        "console.log(new Array(1000).fill(1).length)",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_slice()),
        (0, b"1000\n".as_slice())
    );
}

#[tokio::test]
async fn output_past_64_kib_is_dropped_and_flagged_per_stream() {
    let provider = ready_provider(&[]).await;
    let code = "const line = 'x'.repeat(1023); for (let i = 0; i < 200; i++) console.log(line); \
                throw 'e'";
    let out = run(&provider, code, Duration::from_secs(10)).await;
    assert_eq!(out.exit_code, 1);
    assert_eq!(out.stdout.len(), output::OUTPUT_CAP);
    assert!(
        out.stdout.iter().all(|b| *b == b'x' || *b == b'\n'),
        "nothing but the guest's bytes"
    );
    assert!(out.stdout_truncated);
    assert_eq!(out.stderr, b"e\n");
    assert!(!out.stderr_truncated);
}

#[tokio::test]
async fn deep_recursion_ends_as_a_trap_and_the_engine_keeps_serving() {
    let provider = ready_provider(&[]).await;
    let out = run(
        &provider,
        "function f(n) { return f(n + 1) + 1 } f(0)",
        Duration::from_secs(10),
    )
    .await;
    assert_ne!(out.exit_code, 0);
    assert!(!out.timed_out);
    assert!(!out.stderr.is_empty());
    let out = run(&provider, "console.log('fine')", Duration::from_secs(5)).await;
    assert_eq!(out.stdout, b"fine\n");
}

#[tokio::test]
async fn the_guest_has_no_host_modules_or_environment() {
    let provider = ready_provider(&[]).await;
    let code = "console.log([typeof require, typeof process, typeof fetch, typeof std, typeof os].join(','))";
    let out = run(&provider, code, Duration::from_secs(5)).await;
    assert_eq!(
        out.stdout,
        b"undefined,undefined,undefined,undefined,undefined\n"
    );
    let out = run(
        &provider,
        "await import('/etc/passwd')",
        Duration::from_secs(5),
    )
    .await;
    assert_ne!(
        out.exit_code, 0,
        "no module can be loaded from the host's files"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_does_not_hold_up_a_short_one() {
    let provider = std::sync::Arc::new(ready_provider(&[]).await);
    let long = {
        let provider = provider.clone();
        tokio::spawn(async move { run(&provider, "for (;;) {}", Duration::from_secs(3)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let quick = run(&provider, "console.log('quick')", Duration::from_secs(5)).await;
    assert_eq!(quick.stdout, b"quick\n");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the quick run waited for the long one"
    );
    assert!(!long.is_finished(), "the long run is still running");
    assert!(long.await.expect("long run").timed_out);
}

// === host_call ===

/// A stand-in for the run's broker socket: answers by path and records each request head
/// and body. (The broker itself is tested in its crate and end to end in `tests/`; this
/// checks only the ABI's relay.)
struct SocketServer {
    dir: tempfile::TempDir,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl SocketServer {
    fn start() -> SocketServer {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::UnixListener::bind(dir.path().join("host-api.sock")).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = stream.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    let target = text.split(' ').nth(1).unwrap_or_default().to_owned();
                    log.lock().unwrap().push(text);
                    let body: Vec<u8> = match target.as_str() {
                        "/big" => vec![b'x'; 5 * 1024 * 1024],
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(20)).await;
                            b"late".to_vec()
                        }
                        _ => br#"{"ok":1}"#.to_vec(),
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                });
            }
        });
        SocketServer { dir, seen }
    }

    fn grant(&self) -> std::sync::Arc<crate::grant::GuestGrant> {
        std::sync::Arc::new(crate::grant::GuestGrant::new(
            crate::grant::GuestAccess::Socket(self.dir.path().join("host-api.sock")),
            "api".into(),
            vec![
                crate::grant::Route {
                    m: "GET".into(),
                    p: "/items/*".into(),
                },
                crate::grant::Route {
                    m: "GET".into(),
                    p: "/big".into(),
                },
                crate::grant::Route {
                    m: "GET".into(),
                    p: "/slow".into(),
                },
                crate::grant::Route {
                    m: "POST".into(),
                    p: "/items".into(),
                },
            ],
            "globalThis.preambleRan = true;".into(),
        ))
    }
}

async fn run_granted(
    provider: &Wasm,
    code: &str,
    timeout: Duration,
    grant: Option<std::sync::Arc<crate::grant::GuestGrant>>,
) -> SnippetOutcome {
    provider
        .run_snippet(SnippetRun {
            code: code.to_owned(),
            timeout,
            hold: Hold::default(),
            grant,
        })
        .await
        .expect("a guest's own failure is a result, not an error")
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_grant_host_call_answers_an_error_and_no_client_exists() {
    let provider = ready_provider(&[]).await;
    let out = run(
        &provider,
        "const r = __coderunner_host_call(JSON.stringify({method: 'GET', path: '/x'}));\n\
         console.log(r.status, typeof host);",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(out.stdout, b"403 undefined\n", "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_guest_reaches_only_the_socket_through_its_client() {
    let provider = ready_provider(&[]).await;
    let server = SocketServer::start();
    let code = "console.log(preambleRan, JSON.stringify(await api.get('/items/7')));\n\
                console.log(JSON.stringify(await api.post('/items', {a: [1]})));\n\
                try { await api.get('/other'); } catch (e) { console.log(e.message); }\n\
                try { await api.get('/big'); } catch (e) { console.log(e.message); }";
    let out = run_granted(
        &provider,
        code,
        Duration::from_secs(10),
        Some(server.grant()),
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "true {\"ok\":1}\n{\"ok\":1}\n\
         host api call not permitted by sandbox capability: GET /other\n\
         host api 500: \n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        3,
        "the refused route never left the guest: {seen:?}"
    );
    assert!(seen[0].starts_with("GET /items/7 HTTP/1.1\r\n"), "{seen:?}");
    assert!(seen[1].starts_with("POST /items HTTP/1.1\r\n"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_call_does_not_keep_the_run_past_its_deadline() {
    let provider = ready_provider(&[]).await;
    let server = SocketServer::start();
    let started = Instant::now();
    let out = run_granted(
        &provider,
        "await api.get('/slow');",
        Duration::from_millis(1500),
        Some(server.grant()),
    )
    .await;
    assert!(out.timed_out, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "ended after {:?}",
        started.elapsed()
    );
}
