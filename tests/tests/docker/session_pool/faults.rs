//! Warm pool members that fail (providers.md §9.8): a member that fails its check at claim is
//! ended, never handed out, and counts toward the size until its container is gone.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::super::session::{close_as, open};
use super::super::{docker, docker_ready, instance, stop};
use super::{
    cell_run, container_of, counter, describe_pool, gone, pooled, session_containers, total,
    wait_warm,
};
use plimsoll_tests::Daemon;

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
