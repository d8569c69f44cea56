//! envd as the simulator serves it, checked on the wire where E2B's SDK does not look: the
//! Connect envelopes and end frame, exit codes and signals, `Connect-Timeout-Ms` (an error
//! frame, no end event, only the started process killed), keepalives, users, the access
//! token, `/files`, routing, and the envd faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{Run, Sim, envelope, sid};
use serde_json::{Value, json};

const ROOT: (&str, &str) = ("Authorization", "Basic cm9vdDo="); // "root:"

#[tokio::test]
async fn start_streams_start_data_end_then_an_end_frame() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let run = sim
        .run(&sandbox, "echo out; echo err >&2; exit 3", &[])
        .await;
    assert_eq!(run.reply.status, 200);
    assert_eq!(
        run.reply.header("content-type").as_deref(),
        Some("application/connect+json")
    );
    let events = run.events();
    assert!(events[0]["start"]["pid"].as_u64().unwrap() > 0);
    assert_eq!(run.output("stdout"), "out\n");
    assert_eq!(run.output("stderr"), "err\n");
    assert_eq!(
        run.end().unwrap(),
        &json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
    );
    // The last envelope, and only it, carries flag 0x02, with `{}`.
    let (last_flags, last) = run.frames.last().unwrap();
    assert_eq!((*last_flags, last), (0x02, &json!({})));
    assert!(
        run.frames[..run.frames.len() - 1]
            .iter()
            .all(|(f, _)| *f == 0)
    );

    // Exit 0 leaves exitCode out (protojson drops zero values); a signal is -1.
    let ok = sim.run(&sandbox, "true", &[]).await;
    assert_eq!(
        ok.end().unwrap(),
        &json!({"exited": true, "status": "exit status 0"})
    );
    let killed = sim.run(&sandbox, "kill -9 $$", &[]).await;
    assert_eq!(
        killed.end().unwrap(),
        &json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})
    );
}

#[tokio::test]
async fn a_deadline_ends_the_stream_with_an_error_and_kills_only_the_started_process() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let started = Instant::now();
    let run = sim
        .run(
            &sandbox,
            "sleep 60 & echo $! > /tmp/child; echo started; sleep 60",
            &[("Connect-Timeout-Ms", "2000")],
        )
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(20),
        "{took:?}"
    );
    assert_eq!(run.output("stdout"), "started\n");
    assert!(
        run.end().is_none(),
        "no end event after a deadline: {:?}",
        run.frames
    );
    let end = run.end_stream().expect("an end-of-stream frame");
    assert_eq!(end["error"]["code"], "deadline_exceeded");
    let pid = run.pid();
    let check = sim
        .run(
            &sandbox,
            &format!(
                "sleep 1; kill -0 {pid} 2>/dev/null && echo started-alive || echo started-gone; \
                 kill -0 $(cat /tmp/child) && echo child-alive"
            ),
            &[],
        )
        .await;
    assert_eq!(check.output("stdout"), "started-gone\nchild-alive\n");
}

#[tokio::test]
async fn keepalives_come_at_the_asked_interval() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let run = sim
        .run(&sandbox, "sleep 3.5", &[("Keepalive-Ping-Interval", "1")])
        .await;
    let keepalives = run
        .events()
        .iter()
        .filter(|e| e.get("keepalive").is_some())
        .count();
    assert!(
        (2..=4).contains(&keepalives),
        "{keepalives} keepalives in 3.5 s"
    );
    assert!(run.end().is_some());
    let quiet = sim.run(&sandbox, "sleep 1.5", &[]).await;
    assert!(
        quiet.events().iter().all(|e| e.get("keepalive").is_none()),
        "90 s by default"
    );
}

#[tokio::test]
async fn basic_auth_picks_the_user_and_the_user_cannot_become_root() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim
        .create(json!({"templateID": "base", "envVars": {"FROM_CREATE": "yes"}}))
        .await;
    let script = "echo $(id -u):$(id -un):$HOME:$USER:$(pwd):$E2B_SANDBOX:$FROM_CREATE";
    let user = sim.run(&sandbox, script, &[]).await;
    assert_eq!(
        user.output("stdout"),
        "1000:user:/home/user:user:/home/user:true:yes\n"
    );
    let root = sim.run(&sandbox, script, &[ROOT]).await;
    assert_eq!(
        root.output("stdout"),
        "0:root:/root:root:/home/user:true:yes\n"
    );
    let unknown = sim
        .run(&sandbox, "true", &[("Authorization", "Basic bm9ib2R5Og==")])
        .await;
    assert_eq!(unknown.reply.status, 200);
    assert!(unknown.events().is_empty());
    assert_eq!(
        unknown.end_stream().unwrap()["error"]["code"],
        "unauthenticated"
    );

    let escalate = sim
        .run(
            &sandbox,
            "grep CapEff /proc/self/status; find / -xdev -perm -4000 -type f 2>/dev/null | head -1; \
             touch /etc/x 2>/dev/null && echo wrote-etc; echo done",
            &[],
        )
        .await;
    assert_eq!(
        escalate.output("stdout"),
        "CapEff:\t0000000000000000\ndone\n"
    );
}

#[tokio::test]
async fn the_access_token_is_required_but_not_for_health() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    for token in ["", "wrong"] {
        let run = sim
            .run(&sandbox, "true", &[("X-Access-Token", token)])
            .await;
        assert_eq!(run.reply.status, 401);
        assert_eq!(run.reply.json()["code"], 401);
    }
    let health = sim
        .envd(
            &sandbox,
            "GET",
            "/health",
            &[("X-Access-Token", "")],
            vec![],
        )
        .await;
    assert_eq!(health.status, 204);
    let files = sim
        .envd(
            &sandbox,
            "GET",
            "/files?path=/etc/hostname",
            &[("X-Access-Token", "")],
            vec![],
        )
        .await;
    assert_eq!(files.status, 401);
    assert_eq!(files.json()["message"], "missing signature query parameter");
}

fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "simboundary7d3a";
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[tokio::test]
async fn files_upload_makes_parents_and_download_reads_back() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let (ct, body) = multipart(&[
        ("/home/user/project/src/a.js", b"console.log(1)\n"),
        ("/tmp/plimsoll-step-0.sh", b"echo step\n"),
        ("rel/b.txt", b"relative"),
    ]);
    let up = sim
        .envd(
            &sandbox,
            "POST",
            "/files?username=user",
            &[("Content-Type", &ct)],
            body,
        )
        .await;
    assert_eq!(up.status, 200, "{:?}", up.body);
    assert_eq!(
        up.json(),
        json!([
            {"name": "a.js", "path": "/home/user/project/src/a.js", "type": "file"},
            {"name": "plimsoll-step-0.sh", "path": "/tmp/plimsoll-step-0.sh", "type": "file"},
            {"name": "b.txt", "path": "/home/user/rel/b.txt", "type": "file"}
        ])
    );
    let owners = sim
        .run(
            &sandbox,
            "stat -c %U /home/user/project /home/user/project/src/a.js; sh /tmp/plimsoll-step-0.sh",
            &[],
        )
        .await;
    assert_eq!(owners.output("stdout"), "user\nuser\nstep\n");

    let down = sim
        .envd(
            &sandbox,
            "GET",
            "/files?path=%2Fhome%2Fuser%2Frel%2Fb.txt&username=user",
            &[],
            vec![],
        )
        .await;
    assert_eq!(down.status, 200);
    assert_eq!(down.text(), "relative");
    assert_eq!(down.header("content-length").as_deref(), Some("8"));
    let absent = sim
        .envd(
            &sandbox,
            "GET",
            "/files?path=/nope&username=user",
            &[],
            vec![],
        )
        .await;
    assert_eq!(absent.status, 404);
    assert_eq!(
        absent.json(),
        json!({"code": 404, "message": "path '/nope' does not exist"})
    );
    let dir = sim
        .envd(&sandbox, "GET", "/files?path=/tmp", &[], vec![])
        .await;
    assert_eq!(dir.status, 400);

    // One file with path=; octet-stream; a user envd does not know.
    let (ct, body) = multipart(&[("ignored", b"by path")]);
    let one = sim
        .envd(
            &sandbox,
            "POST",
            "/files?path=/tmp/one.txt",
            &[("Content-Type", &ct)],
            body,
        )
        .await;
    assert_eq!(one.json()[0]["path"], "/tmp/one.txt");
    let raw = sim
        .envd(
            &sandbox,
            "POST",
            "/files?path=/tmp/raw.bin",
            &[("Content-Type", "application/octet-stream")],
            vec![0, 1, 2],
        )
        .await;
    assert_eq!(raw.status, 200);
    let read = sim
        .envd(&sandbox, "GET", "/files?path=/tmp/raw.bin", &[], vec![])
        .await;
    assert_eq!(&read.body.unwrap()[..], &[0, 1, 2]);
    let (ct, body) = multipart(&[("/tmp/x", b"x")]);
    let nobody = sim
        .envd(
            &sandbox,
            "POST",
            "/files?username=nobody",
            &[("Content-Type", &ct)],
            body,
        )
        .await;
    assert_eq!(nobody.status, 401);
    let (ct, body) = multipart(&[("/tmp/dup", b"1"), ("/tmp/dup", b"2")]);
    let dup = sim
        .envd(&sandbox, "POST", "/files", &[("Content-Type", &ct)], body)
        .await;
    assert_eq!(dup.status, 400);
}

#[tokio::test]
async fn routing_by_host_name_and_the_proxys_answers() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let id = sid(&sandbox);
    let host = format!("49983-{id}.{}", sim.process.domain);
    let by_host = sim
        .envd(
            &sandbox,
            "GET",
            "/health",
            &[
                ("Host", &host),
                ("E2b-Sandbox-Id", ""),
                ("E2b-Sandbox-Port", ""),
            ],
            vec![],
        )
        .await;
    assert_eq!(by_host.status, 204);
    let unknown = sim
        .envd(
            &json!({"sandboxID": "nosuchsandbox0000000"}),
            "GET",
            "/health",
            &[],
            vec![],
        )
        .await;
    assert_eq!(unknown.status, 502);
    assert_eq!(
        unknown.json(),
        json!({"sandboxId": "nosuchsandbox0000000", "message": "The sandbox was not found", "code": 502})
    );
    let port = sim
        .envd(
            &sandbox,
            "GET",
            "/health",
            &[("E2b-Sandbox-Port", "8080")],
            vec![],
        )
        .await;
    assert_eq!(port.status, 502);
    let bad = sim
        .envd(
            &json!({"sandboxID": "Bad_Id"}),
            "GET",
            "/health",
            &[],
            vec![],
        )
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn list_signal_and_stdin_reach_a_running_process() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sim = std::sync::Arc::new(sim);
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let (s2, b2) = (std::sync::Arc::clone(&sim), sandbox.clone());
    let message = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "read line; echo got:$line; exec sleep 60"]}, "stdin": true});
    let running = tokio::spawn(async move {
        let headers = [("Content-Type", "application/connect+json")];
        Run::from(
            s2.envd(
                &b2,
                "POST",
                "/process.Process/Start",
                &headers,
                envelope(0, &message),
            )
            .await,
        )
    });
    let unary = |method: &str, body: Value| {
        let (sim, sandbox, method) = (
            std::sync::Arc::clone(&sim),
            sandbox.clone(),
            method.to_owned(),
        );
        async move {
            sim.envd(
                &sandbox,
                "POST",
                &format!("/process.Process/{method}"),
                &[("Content-Type", "application/json")],
                body.to_string().into_bytes(),
            )
            .await
        }
    };
    let mut pid = None;
    for _ in 0..100 {
        let list = unary("List", json!({})).await.json();
        if let Some(found) = list["processes"][0]["pid"].as_u64() {
            assert_eq!(list["processes"][0]["config"]["cmd"], "/bin/sh");
            pid = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = pid.expect("the process is listed");
    let line = base64::engine::general_purpose::STANDARD.encode("hello\n");
    let sent = unary(
        "SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": line}}),
    )
    .await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signal = unary(
        "SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(signal.status, 200);
    let run = running.await.unwrap();
    assert_eq!(run.output("stdout"), "got:hello\n");
    assert_eq!(run.end().unwrap()["status"], "signal: killed");
    let gone = unary(
        "SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(gone.status, 404);
    assert_eq!(gone.json()["code"], "not_found");
    assert_eq!(unary("List", json!({})).await.json(), json!({}));
}

#[tokio::test]
async fn envd_faults_slow_it_drop_frames_and_kill_the_vm() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;

    sim.process
        .set_faults(&json!({"envdDelayMs": 1500}))
        .unwrap();
    let started = Instant::now();
    assert_eq!(
        sim.envd(&sandbox, "GET", "/health", &[], vec![])
            .await
            .status,
        204
    );
    assert!(started.elapsed() >= Duration::from_millis(1500));

    sim.process
        .set_faults(&json!({"dropEndFrame": true}))
        .unwrap();
    let no_frame = sim.run(&sandbox, "echo x", &[]).await;
    assert!(no_frame.end().is_some());
    assert!(
        no_frame.end_stream().is_none(),
        "the end-of-stream frame is lost"
    );

    sim.process
        .set_faults(&json!({"dropEndEvent": true}))
        .unwrap();
    let no_event = sim.run(&sandbox, "echo x", &[]).await;
    assert!(no_event.end().is_none());
    assert_eq!(no_event.end_stream(), Some(&json!({})));

    sim.process
        .set_faults(&json!({"vmDiesAfterMs": 1000}))
        .unwrap();
    let died = sim.run(&sandbox, "echo before; sleep 30", &[]).await;
    assert!(
        died.reply.body.is_err(),
        "the stream drops: {:?}",
        died.reply.body
    );
    let id = sid(&sandbox);
    assert_eq!(sim.status("GET", &format!("/sandboxes/{id}")).await, 404);
    assert_eq!(
        sim.envd(&sandbox, "GET", "/health", &[], vec![])
            .await
            .status,
        502
    );
}

/// A VM whose container dies outside the API (a host failure; here `docker kill`) is gone as
/// E2B's would be: the stream of the process in flight drops at once (docker alone does not
/// always end an exec when a gVisor container dies) and the sandbox answers 404.
#[tokio::test]
async fn a_vm_whose_container_dies_drops_its_streams_and_is_gone() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim.create(json!({"templateID": "base"})).await;
    let id = sid(&sandbox);
    let container = sim
        .process
        .sandboxes()
        .unwrap()
        .as_array()
        .and_then(|all| all.iter().find(|s| s["sandboxID"] == id.as_str()))
        .and_then(|s| s["container"].as_str())
        .expect("the sandbox's container")
        .to_owned();
    let killer = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let began = || {
            std::process::Command::new("docker")
                .args(["exec", &container, "test", "-e", "/tmp/began"])
                .status()
                .is_ok_and(|s| s.success())
        };
        while !began() {
            assert!(Instant::now() < deadline, "the process never began");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let killed = std::process::Command::new("docker")
            .args(["kill", &container])
            .status()
            .unwrap();
        assert!(killed.success());
        Instant::now()
    };
    let (died, killed_at) =
        tokio::join!(sim.run(&sandbox, "touch /tmp/began; sleep 60", &[]), killer);
    assert!(
        killed_at.elapsed() < Duration::from_secs(20),
        "the stream outlived its VM by {:?}",
        killed_at.elapsed()
    );
    assert!(
        died.reply.body.is_err() || died.end().is_none(),
        "the stream drops without an end event: {:?}",
        died.reply.body
    );
    // The stream may drop before the simulator sees the container gone: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.status("GET", &format!("/sandboxes/{id}")).await != 404 {
        assert!(
            Instant::now() < deadline,
            "the dead VM's sandbox was not killed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
