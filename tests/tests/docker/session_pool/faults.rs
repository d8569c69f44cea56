//! Warm pool members that fail, and a docker that does not answer (providers.md §9.8): a
//! member that fails its check at claim is ended, never handed out, and counts toward the size
//! until its container is gone; one whose agent died is ended too; a docker that does not
//! answer the read-back at claim leaves every member in the pool.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plimsoll_tests::http1::Request;
use serde_json::json;

use super::super::session::{close_as, open};
use super::super::session_hostile::kill_agent;
use super::super::{docker, docker_ready, instance, send, stop};
use super::docker_proxy::DockerProxy;
use super::{
    cell_run, container_of, counter, describe_pool, gone, pooled, pooled_with, session_containers,
    total, wait_warm, warm,
};
use plimsoll_tests::{Daemon, connect};

/// Unix seconds now, as `docker events` reads them.
fn unix_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:09}", now.as_secs(), now.subsec_nanos())
}

/// The creations and removals of `d`'s pool members between `since` and now, in docker's
/// order: `(action, container id)`.
fn member_events(d: &Daemon, since: &str) -> Vec<(String, String)> {
    let until = unix_now();
    let instance = format!("label=io.plimsoll.instance=session-{}", instance(d));
    let (ok, out) = docker(&[
        "events",
        "--since",
        since,
        "--until",
        &until,
        "--filter",
        "type=container",
        "--filter",
        "event=create",
        "--filter",
        "event=destroy",
        "--filter",
        &instance,
        "--filter",
        "label=io.plimsoll.pool",
        "--format",
        "{{.Action}} {{.Actor.ID}}",
    ]);
    assert!(ok, "{out}");
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(action, id)| (action.to_owned(), id.to_owned()))
        .collect()
}

fn wait_gone(container: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while !gone(container) {
        assert!(
            Instant::now() < until,
            "the failed member {container} was not removed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `why` of each claim that found a member unfit.
fn failed_checks(d: &Daemon) -> Vec<String> {
    d.log_records()
        .iter()
        .filter(|r| {
            r["msg"] == "a warm pool member failed its verification at claim; it is ended, not handed out"
        })
        .map(|r| r["why"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_member_that_fails_its_verification_is_ended_not_handed_out_and_counts_until_gone() {
    require_docker!();
    let d = pooled("1", "2");
    wait_warm(&d, "one member", |w| total(w) == 1);
    let members = session_containers(&d);
    let member = members.iter().next().expect("one member").clone();
    // Someone else pauses it: it no longer reads back as the container verified.
    let (ok, out) = docker(&["pause", &member]);
    assert!(ok, "{out}");
    let since = unix_now();
    let (id, _) = open(&d, json!({}));
    let run = cell_run(&d, &id, "javascript", "1 + 1");
    assert_ne!(
        container_of(&run),
        member,
        "the paused member was not handed out"
    );
    wait_gone(&member);
    assert_eq!(failed_checks(&d).len(), 1, "{}", d.logs().join("\n"));
    let pool = describe_pool(&d);
    assert!(counter(&pool, "misses") >= 1, "{pool}");
    // The member being checked, then removed, counted toward the size of 1: its replacement
    // was created only once it was gone.
    wait_warm(&d, "a replacement", |w| total(w) == 1);
    let events = member_events(&d, &since);
    let removed = events
        .iter()
        .position(|(action, id)| action == "destroy" && *id == member);
    let created = events.iter().position(|(action, _)| action == "create");
    assert!(
        matches!((removed, created), (Some(r), Some(c)) if r < c),
        "the failed member's removal comes before its replacement's creation: {events:?}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}

#[test]
fn a_member_whose_agent_is_gone_is_ended_not_handed_out() {
    require_docker!();
    let d = pooled("1", "2");
    wait_warm(&d, "one member", |w| total(w) == 1);
    let member = session_containers(&d)
        .into_iter()
        .next()
        .expect("one member");
    // Its relays stay attached and its container reads back as verified: only a round trip
    // to the agent finds it gone.
    kill_agent(&member);
    let (id, _) = open(&d, json!({}));
    let run = cell_run(&d, &id, "javascript", "1 + 1");
    assert_ne!(
        container_of(&run),
        member,
        "the member without an agent was not handed out"
    );
    wait_gone(&member);
    let why = failed_checks(&d);
    assert!(
        why.len() == 1 && why[0].contains("agent"),
        "{why:?}\n{}",
        d.logs().join("\n")
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}

#[test]
fn a_docker_that_does_not_answer_at_claim_leaves_every_member_in_the_pool() {
    require_docker!();
    let proxy = DockerProxy::start();
    let host = proxy.docker_host();
    let d = pooled_with("2", "4", &[("DOCKER_HOST", &host)]);
    wait_warm(&d, "two members", |w| total(w) == 2);
    let members = session_containers(&d);
    assert_eq!(members.len(), 2, "{members:?}");
    let kept = proxy.hiccup();
    let body = json!({ "protocol": connect::PROTOCOL });
    let opened = send(d.addr, &connect::call("OpenSession", &body));
    proxy.restore();
    assert_ne!(
        opened.status, 200,
        "no member is handed out and no container made while docker does not answer: {opened}"
    );
    let records = d.log_records();
    assert!(
        !records
            .iter()
            .any(|r| r["msg"] == "removing a warm pool member"),
        "no member was removed ({kept} exec streams went on):\n{}",
        d.logs().join("\n")
    );
    assert!(
        records.iter().any(|r| r["msg"]
            == "docker did not answer a warm pool member's read-back at claim; it stays in the pool"),
        "{}",
        d.logs().join("\n")
    );
    assert_eq!(total(&warm(&d)), 2, "{:?}", warm(&d));
    // Once docker answers a preflight again, the next open is served by one of the two.
    let until = Instant::now() + Duration::from_secs(30);
    while Request::get("/readyz").send(d.addr).status != 200 {
        assert!(
            Instant::now() < until,
            "the provider never became ready again"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (id, _) = open(&d, json!({}));
    let run = cell_run(&d, &id, "javascript", "1 + 1");
    assert!(
        members.contains(&container_of(&run)),
        "a member made before docker's hiccup served the open: {run}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}
