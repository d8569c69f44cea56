//! The sandbox endpoint's Connect services: Exec, Upload (client stream), Download
//! (server stream), with the management token.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use crate::common::start;

/// grants.md §7.5's wrapper, as plimsoll's provider runs every command.
const WRAPPER: &str = r#"t=$1; c=$2; shift 2
rc=/tmp/.plimsoll-rc.$$
rm -f "$rc"
{ { timeout -s KILL "$t" "$@"; echo "$?" >"$rc"; } 2>&1 1>&3 3>&- | head -c "$c" 1>&2; } 3>&1 | head -c "$c"
if [ -s "$rc" ]; then s=$(cat "$rc"); rm -f "$rc"; exit "$s"; fi
exit 125"#;

/// Exec runs as the sandbox's user in the working directory asked for, and answers the
/// exit code with stdout and stderr apart (base64).
#[tokio::test]
async fn exec_answers_exit_code_and_both_streams() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("e-1").await;
    let (code, out, err) = h
        .exec(&sandbox, &["sh", "-c", "id -u; echo oops >&2; exit 3"])
        .await;
    assert_eq!((code, out.as_str(), err.as_str()), (3, "61000\n", "oops\n"));
    let endpoint = sandbox["core"]["endpoint"]["uri"].as_str().unwrap();
    let answer = h
        .call_as(
            endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.bearer,
            &json!({ "cmd": ["pwd"], "workingDir": "/tmp" }),
        )
        .await;
    assert_eq!(
        STANDARD
            .decode(answer.json()["stdout"].as_str().unwrap())
            .unwrap(),
        b"/tmp\n"
    );
    let answer = h
        .call_as(
            endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.bearer,
            &json!({ "cmd": ["sh", "-c", "echo $GREETING"], "env": { "GREETING": "hi there" } }),
        )
        .await;
    assert_eq!(
        STANDARD
            .decode(answer.json()["stdout"].as_str().unwrap())
            .unwrap(),
        b"hi there\n"
    );
    // The endpoint takes the same exchanged token as management, and only it.
    let refused = h
        .call_as(
            endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.sim.ready.token,
            &json!({ "cmd": ["true"] }),
        )
        .await;
    assert_eq!(refused.status, 401);
}

/// The image serves plimsoll's exec wrapper: busybox `timeout -s KILL` really kills a
/// hung command at the limit (exit 137), and `head -c` caps a flood at exactly the cap.
#[tokio::test]
async fn the_exec_wrapper_kills_at_the_limit_and_caps_output() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("w-1").await;
    let started = Instant::now();
    let (code, _, _) = h
        .exec(
            &sandbox,
            &[
                "sh",
                "-c",
                WRAPPER,
                "plimsoll-exec",
                "1",
                "100",
                "sleep",
                "30",
            ],
        )
        .await;
    let elapsed = started.elapsed();
    assert_eq!(code, 137);
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(15),
        "{elapsed:?}"
    );
    let (code, out, _) = h
        .exec(
            &sandbox,
            &["sh", "-c", WRAPPER, "plimsoll-exec", "10", "65537", "yes"],
        )
        .await;
    assert_eq!(out.len(), 65537);
    assert_ne!(code, 0);
    let (code, out, _) = h
        .exec(
            &sandbox,
            &[
                "sh",
                "-c",
                WRAPPER,
                "plimsoll-exec",
                "10",
                "100",
                "node",
                "-e",
                "console.log(6*7)",
            ],
        )
        .await;
    assert_eq!((code, out.as_str()), (0, "42\n"));
}

/// Upload does not create parents (the stream ends with `not_found`); with them made,
/// every file is written with its mode (data frames of up to 512 KiB are joined) and
/// `filesWritten` counts them. Download streams header, data and a per-file error frame,
/// then the end of stream.
#[tokio::test]
async fn upload_and_download_stream_files() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("f-1").await;
    let endpoint = sandbox["core"]["endpoint"]["uri"].as_str().unwrap();
    let upload = "/docker.sbx.files.v1.FileService/Upload";
    let big: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
    let frames = vec![
        json!({ "header": { "path": "/tmp/p/dir/small.txt", "mode": 420 } }),
        json!({ "data": STANDARD.encode(b"hello") }),
        json!({ "header": { "path": "/tmp/p/big.bin", "mode": 448 } }),
        json!({ "data": STANDARD.encode(&big[..512 * 1024]) }),
        json!({ "data": STANDARD.encode(&big[512 * 1024..]) }),
    ];
    let (status, answer) = h.stream(endpoint, upload, &frames).await;
    assert_eq!(status, 200);
    let (flags, end) = answer.last().unwrap();
    assert_eq!(*flags, 2);
    assert_eq!(end["error"]["code"], "not_found", "{answer:?}");
    let (code, _, _) = h.exec(&sandbox, &["mkdir", "-p", "--", "/tmp/p/dir"]).await;
    assert_eq!(code, 0);
    let (_, answer) = h.stream(endpoint, upload, &frames).await;
    assert_eq!(answer[0], (0, json!({ "filesWritten": 2 })));
    assert_eq!(answer[1], (2, json!({})));
    let (_, modes, _) = h
        .exec(
            &sandbox,
            &[
                "stat",
                "-c",
                "%a %s",
                "/tmp/p/dir/small.txt",
                "/tmp/p/big.bin",
            ],
        )
        .await;
    assert_eq!(modes, "644 5\n700 614400\n");

    let (status, frames) = h
        .stream(
            endpoint,
            "/docker.sbx.files.v1.FileService/Download",
            &[json!({ "paths": ["/tmp/p/big.bin", "/tmp/p/missing", "/tmp/p/dir/small.txt"] })],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        frames[0].1["header"],
        json!({ "path": "/tmp/p/big.bin", "mode": 448 })
    );
    let mut got = Vec::new();
    let mut rest = frames[1..].iter();
    for (_, frame) in rest.by_ref() {
        match frame.get("data") {
            Some(data) => got.extend(STANDARD.decode(data.as_str().unwrap()).unwrap()),
            None => {
                assert_eq!(frame["error"]["path"], "/tmp/p/missing");
                assert!(
                    frame["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("no such file")
                );
                break;
            }
        }
    }
    assert_eq!(got, big);
    let tail: Vec<_> = rest.collect();
    assert_eq!(tail[0].1["header"]["path"], "/tmp/p/dir/small.txt");
    assert_eq!(tail[1].1["data"], STANDARD.encode(b"hello"));
    assert_eq!(
        *tail.last().unwrap(),
        &(2, json!({})),
        "the end-of-stream frame closes it"
    );
}

/// A deleted sandbox's endpoint serves nothing.
#[tokio::test]
async fn a_deleted_sandboxs_endpoint_refuses() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("x-1").await;
    let endpoint = sandbox["core"]["endpoint"]["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let op = h
        .ok(
            "/docker.sbx.v1.SandboxService/DeleteSandbox",
            json!({ "sandbox": { "name": "x-1" }, "force": true }),
        )
        .await;
    h.wait_done(op).await;
    let answer = h
        .call_as(
            &endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.bearer,
            &json!({ "cmd": ["true"] }),
        )
        .await;
    assert_eq!(answer.json()["code"], "not_found");
}

/// A sandbox whose container dies outside the API (a host failure; here `docker kill`) has
/// failed, as a service's crashed VM would: the exec in flight ends with an error at once
/// (docker alone does not always end an exec when a gVisor container dies), GetSandbox reads
/// FAILED, and a new exec is refused.
#[tokio::test]
async fn a_sandbox_whose_container_dies_fails_and_its_exec_in_flight_errs() {
    let Some(h) = start(&[]).await else { return };
    let sandbox = h.running("k-1").await;
    let id = sandbox["core"]["id"].as_str().unwrap().to_owned();
    let endpoint = sandbox["core"]["endpoint"]["uri"].as_str().unwrap();
    let docker = |args: &[&str]| {
        let out = std::process::Command::new("docker")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    };
    let (_, container) = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=io.plimsoll.simulator.sandbox={id}"),
    ]);
    assert!(!container.is_empty(), "the sandbox's container runs");
    let killer = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !docker(&["exec", &container, "test", "-e", "/tmp/began"]).0 {
            assert!(Instant::now() < deadline, "the command never began");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(docker(&["kill", &container]).0, "docker kill");
        Instant::now()
    };
    let exec = json!({ "cmd": ["sh", "-c", "touch /tmp/began; sleep 60"] });
    let (answer, killed_at) = tokio::join!(
        h.call_as(
            endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.bearer,
            &exec
        ),
        killer
    );
    assert!(
        killed_at.elapsed() < Duration::from_secs(20),
        "the exec outlived its sandbox by {:?}",
        killed_at.elapsed()
    );
    assert_eq!(answer.json()["code"], "unavailable", "{:?}", answer.json());
    let got = h
        .ok(
            "/docker.sbx.v1.SandboxService/GetSandbox",
            json!({ "sandbox": { "name": "k-1" } }),
        )
        .await;
    assert_eq!(got["core"]["status"], "SANDBOX_STATUS_FAILED", "{got}");
    let refused = h
        .call_as(
            endpoint,
            "/docker.sbx.process.v1.ProcessService/Exec",
            &h.bearer,
            &json!({ "cmd": ["true"] }),
        )
        .await;
    assert_eq!(refused.json()["code"], "failed_precondition");
}
