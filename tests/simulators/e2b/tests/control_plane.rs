//! E2B's control plane as the simulator serves it, checked on the wire: status codes, JSON
//! field names, `X-API-Key`, keyset paging with `X-Next-Token`, metadata filters, the
//! sandbox lifecycle, timeouts that kill VMs, and the control-plane faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Sim, sid};
use serde_json::{Value, json};

/// The docker containers of a sandbox, by its label.
fn containers_of(id: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=io.plimsoll.simulator.sandbox={id}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn the_api_key_is_required_and_errors_have_e2bs_shape() {
    let Some(sim) = Sim::start(&[]) else { return };
    for key in [None, Some("e2b_wrong")] {
        let reply = sim.api_as(key, "GET", "/v2/sandboxes", None).await;
        assert_eq!(reply.status, 401);
        let body = reply.json();
        assert_eq!(body["code"], 401);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("Invalid API key")
        );
    }
    let health = sim.api_as(None, "GET", "/health", None).await;
    assert_eq!(health.status, 200);
    let missing = sim
        .api("GET", "/sandboxes/nosuchsandbox0000000", None)
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json(),
        json!({"code": 404, "message": "Sandbox \"nosuchsandbox0000000\" doesn't exist or you don't have access to it"})
    );
    assert_eq!(sim.status("GET", "/sandboxes/Bad-ID").await, 400);
    let bad_template = sim
        .api("POST", "/v2/sandboxes", Some(json!({"templateID": "nope"})))
        .await;
    assert_eq!(bad_template.status, 404);
    let bad_timeout = sim
        .api(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "timeout": 0})),
        )
        .await;
    assert_eq!(bad_timeout.status, 400);
    let domain_without_block_all = sim
        .api(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "network": {"allowOut": ["guard.example.test"]}})),
        )
        .await;
    assert_eq!(domain_without_block_all.status, 400);
    assert!(
        domain_without_block_all.json()["message"]
            .as_str()
            .unwrap()
            .contains("ALL_TRAFFIC")
    );
}

#[tokio::test]
async fn create_answers_201_with_both_tokens_and_get_reads_it_back() {
    let Some(sim) = Sim::start(&["--memory-mb", "256", "--cpu-count", "1"]) else {
        return;
    };
    let created = sim
        .create(json!({
            "templateID": "base",
            "timeout": 120,
            "metadata": {"sdk": "plimsoll", "lease": "abc"},
            "network": {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false},
        }))
        .await;
    let id = sid(&created);
    assert_eq!(id.len(), 20);
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    );
    for field in ["envdAccessToken", "trafficAccessToken"] {
        assert_eq!(created[field].as_str().unwrap().len(), 64, "{field}");
    }
    assert_eq!(created["templateID"], "e2bsimbase0000000001");
    assert_eq!(created["alias"], "base");
    assert_eq!(created["clientID"], "6532622b");
    assert!(created["envdVersion"].is_string());
    assert_eq!(created["domain"], sim.process.domain.as_str());

    let detail = sim.api("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(detail.status, 200);
    let detail = detail.json();
    assert_eq!(detail["memoryMB"], 256);
    assert_eq!(detail["cpuCount"], 1);
    assert!(detail["diskSizeMB"].as_u64().unwrap() > 0);
    assert_eq!(detail["state"], "running");
    assert_eq!(
        detail["metadata"],
        json!({"sdk": "plimsoll", "lease": "abc"})
    );
    assert_eq!(detail["network"]["denyOut"], json!(["0.0.0.0/0"]));
    assert_eq!(detail["envdAccessToken"], created["envdAccessToken"]);
    let started = humantime::parse_rfc3339(detail["startedAt"].as_str().unwrap()).unwrap();
    let ends = humantime::parse_rfc3339(detail["endAt"].as_str().unwrap()).unwrap();
    assert_eq!(ends.duration_since(started).unwrap().as_secs(), 120);
    assert_eq!(containers_of(&id), 1);

    assert_eq!(sim.status("DELETE", &format!("/sandboxes/{id}")).await, 204);
    assert_eq!(sim.status("DELETE", &format!("/sandboxes/{id}")).await, 404);
    assert_eq!(sim.status("GET", &format!("/sandboxes/{id}")).await, 404);
    assert_eq!(containers_of(&id), 0, "the kill removed the VM");
}

#[tokio::test]
async fn listing_pages_with_x_next_token_and_filters_by_metadata_and_state() {
    let Some(sim) = Sim::start(&[]) else { return };
    let mut ids = Vec::new();
    for i in 0..3 {
        let created = sim
            .create(json!({"templateID": "base", "metadata": {"run": "list", "a b": "x&y", "i": i.to_string()}}))
            .await;
        ids.push(sid(&created));
    }
    let other = sid(&sim
        .create(json!({"templateID": "base", "metadata": {"run": "other"}}))
        .await);

    // What E2B's SDK puts on the wire for {"run": "list", "a b": "x&y"}: each key and value
    // quoted, the pairs urlencoded (quoting the quotes), the whole a query parameter.
    let filter = "metadata=run%3Dlist%26a%252520b%3Dx%252526y";
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("/v2/sandboxes?{filter}&limit=2");
        if let Some(token) = &token {
            path.push_str(&format!("&nextToken={}", token.replace('=', "%3D")));
        }
        let reply = sim.api("GET", &path, None).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(reply.header("x-total-running").as_deref(), Some("3"));
        let page = reply.json();
        for item in page.as_array().unwrap() {
            for field in [
                "templateID",
                "sandboxID",
                "clientID",
                "startedAt",
                "endAt",
                "cpuCount",
                "memoryMB",
                "diskSizeMB",
                "state",
                "envdVersion",
                "metadata",
            ] {
                assert!(item.get(field).is_some(), "ListedSandbox.{field}");
            }
            seen.push(item["sandboxID"].as_str().unwrap().to_owned());
        }
        pages += 1;
        token = reply.header("x-next-token");
        if token.is_none() {
            break;
        }
        assert!(pages < 5, "paging does not end");
    }
    assert_eq!(pages, 2, "3 matches at 2 a page");
    // Newest first.
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);
    assert!(!seen.contains(&other));

    let paused = &ids[0];
    assert_eq!(
        sim.status("POST", &format!("/sandboxes/{paused}/pause"))
            .await,
        204
    );
    let reply = sim
        .api("GET", &format!("/v2/sandboxes?{filter}&state=paused"), None)
        .await;
    let only: Vec<Value> = reply.json().as_array().unwrap().clone();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["sandboxID"], paused.as_str());
    assert_eq!(only[0]["state"], "paused");
    assert!(
        reply.header("x-total-running").is_none(),
        "only when running is asked"
    );
    let running = sim
        .api(
            "GET",
            &format!("/v2/sandboxes?{filter}&state=running,paused"),
            None,
        )
        .await;
    assert_eq!(running.json().as_array().unwrap().len(), 3);

    for bad in [
        "limit=0",
        "limit=101",
        "limit=x",
        "state=gone",
        "nextToken=bm9wZQ%3D%3D",
        "metadata=novalue",
    ] {
        let reply = sim.api("GET", &format!("/v2/sandboxes?{bad}"), None).await;
        assert_eq!(reply.status, 400, "{bad}: {:?}", reply.body);
        assert_eq!(reply.json()["code"], 400);
    }
    // The v1 list: running only.
    let v1 = sim.api("GET", "/sandboxes?metadata=run%3Dlist", None).await;
    assert_eq!(v1.status, 200);
    assert_eq!(v1.json().as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn pause_and_connect_answer_e2bs_codes() {
    let Some(sim) = Sim::start(&[]) else { return };
    let sandbox = sim
        .create(json!({"templateID": "base", "timeout": 60}))
        .await;
    let id = sid(&sandbox);
    let connect = |_: ()| format!("/v2/sandboxes/{id}/connect");
    let running = sim
        .api("POST", &connect(()), Some(json!({"timeout": 30})))
        .await;
    assert_eq!(running.status, 200, "connect to a running sandbox");
    assert_eq!(running.json()["sandboxID"], id.as_str());
    assert_eq!(
        sim.status("POST", &format!("/sandboxes/{id}/pause")).await,
        204
    );
    let again = sim
        .api("POST", &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(again.status, 409);
    let detail = sim
        .api("GET", &format!("/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(detail["state"], "paused");
    let paused_envd = sim.envd(&sandbox, "GET", "/health", &[], vec![]).await;
    assert_eq!(
        paused_envd.status, 502,
        "a paused sandbox's envd is not reachable"
    );
    let resumed = sim
        .api("POST", &connect(()), Some(json!({"timeout": 30})))
        .await;
    assert_eq!(resumed.status, 201, "connect resumed it");
    assert_eq!(
        resumed.json()["envdAccessToken"],
        sandbox["envdAccessToken"]
    );
    assert_eq!(
        sim.envd(&sandbox, "GET", "/health", &[], vec![])
            .await
            .status,
        204
    );
    let unknown = sim
        .api(
            "POST",
            "/v2/sandboxes/nosuchsandbox0000000/connect",
            Some(json!({})),
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        sim.status("POST", "/sandboxes/nosuchsandbox0000000/pause")
            .await,
        404
    );
}

#[tokio::test]
async fn a_timeout_kills_the_vm_and_set_timeout_moves_it() {
    let Some(sim) = Sim::start(&[]) else { return };
    let short = sid(&sim
        .create(json!({"templateID": "base", "timeout": 2}))
        .await);
    let kept = sid(&sim
        .create(json!({"templateID": "base", "timeout": 2}))
        .await);
    let moved = sim
        .api(
            "POST",
            &format!("/sandboxes/{kept}/timeout"),
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(moved.status, 204);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(sim.status("GET", &format!("/sandboxes/{short}")).await, 404);
    assert_eq!(containers_of(&short), 0, "the VM is gone at its timeout");
    assert_eq!(sim.status("GET", &format!("/sandboxes/{kept}")).await, 200);
    assert_eq!(containers_of(&kept), 1);
}

#[tokio::test]
async fn network_updates_replace_the_egress_config() {
    let Some(sim) = Sim::start(&[]) else { return };
    let id = sid(&sim
        .create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}))
        .await);
    let rule =
        json!({"guard.example.test": [{"transform": {"headers": {"X-Plimsoll-Guard": "crg_x"}}}]});
    let update =
        json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["guard.example.test"], "rules": rule});
    let put = sim
        .api("PUT", &format!("/sandboxes/{id}/network"), Some(update))
        .await;
    assert_eq!(put.status, 204, "{:?}", put.body);
    let network = sim
        .api("GET", &format!("/sandboxes/{id}"), None)
        .await
        .json()["network"]
        .clone();
    assert_eq!(network["allowOut"], json!(["guard.example.test"]));
    assert_eq!(network["rules"], rule);
    // Omitting a field clears it; allow_internet_access false is denyOut 0.0.0.0/0.
    let plain = json!({"allow_internet_access": false});
    assert_eq!(
        sim.api("PUT", &format!("/sandboxes/{id}/network"), Some(plain))
            .await
            .status,
        204
    );
    let detail = sim
        .api("GET", &format!("/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(detail["network"], json!({"denyOut": ["0.0.0.0/0"]}));
    assert_eq!(detail["allowInternetAccess"], false);
    let bad = sim
        .api(
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(json!({"denyOut": ["example.com"]})),
        )
        .await;
    assert_eq!(bad.status, 400);
    let gone = sim
        .api(
            "PUT",
            "/sandboxes/nosuchsandbox0000000/network",
            Some(json!({})),
        )
        .await;
    assert_eq!(gone.status, 404);
}

#[tokio::test]
async fn faults_drop_tokens_and_ids_and_fail_deletes() {
    let Some(sim) = Sim::start(&["--fault", "create-without-envd-token"]) else {
        return;
    };
    let created = sim
        .create(json!({"templateID": "base", "metadata": {"lease": "t1"}}))
        .await;
    assert!(created.get("envdAccessToken").is_none());
    let id = sid(&created);
    // The VM runs all the same, and its envd still wants the token nobody was given.
    let unauthorized = sim.run(&created, "true", &[]).await;
    assert_eq!(unauthorized.reply.status, 401);

    sim.process
        .set_faults(&json!({"createWithoutSandboxId": true, "deleteErrors": 2}))
        .unwrap();
    let lost = sim
        .create(json!({"templateID": "base", "metadata": {"lease": "t2"}}))
        .await;
    assert!(lost.get("sandboxID").is_none(), "{lost}");
    assert!(lost["envdAccessToken"].is_string());
    // The lost VM exists: listing by its metadata finds it.
    let listed = sim
        .api("GET", "/v2/sandboxes?metadata=lease%3Dt2", None)
        .await
        .json();
    let lost_id = listed[0]["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(containers_of(&lost_id), 1);

    for _ in 0..2 {
        let failed = sim
            .api("DELETE", &format!("/sandboxes/{lost_id}"), None)
            .await;
        assert_eq!(failed.status, 500);
        assert_eq!(failed.json()["code"], 500);
    }
    assert_eq!(containers_of(&lost_id), 1, "a failed delete kills nothing");
    assert_eq!(
        sim.status("DELETE", &format!("/sandboxes/{lost_id}")).await,
        204
    );
    assert_eq!(sim.status("DELETE", &format!("/sandboxes/{id}")).await, 204);
    assert_eq!(containers_of(&lost_id) + containers_of(&id), 0);
    assert_eq!(
        sim.process.admin("GET", "/faults", None).unwrap()["deleteErrors"],
        0
    );
}

#[tokio::test]
async fn stopping_the_simulator_removes_its_vms() {
    let Some(mut sim) = Sim::start(&[]) else {
        return;
    };
    let id = sid(&sim.create(json!({"templateID": "base"})).await);
    assert_eq!(containers_of(&id), 1);
    sim.process.stop();
    assert_eq!(containers_of(&id), 0);
}

#[tokio::test]
async fn capacity_answers_429_and_v1_create_secures_envd_only_when_asked() {
    let Some(sim) = Sim::start(&["--max-sandboxes", "2"]) else {
        return;
    };
    let open = sim
        .api("POST", "/sandboxes", Some(json!({"templateID": "base"})))
        .await;
    assert_eq!(open.status, 201);
    let open = open.json();
    assert!(
        open.get("envdAccessToken").is_none(),
        "v1 without secure: no token"
    );
    let run = sim.run(&open, "echo open", &[]).await;
    assert_eq!(
        run.output("stdout"),
        "open\n",
        "an unsecured envd takes no token"
    );
    let secure = sim
        .api(
            "POST",
            "/sandboxes",
            Some(json!({"templateID": "base", "secure": true})),
        )
        .await;
    assert_eq!(secure.status, 201);
    assert!(secure.json()["envdAccessToken"].is_string());
    let full = sim
        .api("POST", "/v2/sandboxes", Some(json!({"templateID": "base"})))
        .await;
    assert_eq!(full.status, 429);
    assert_eq!(full.json()["code"], 429);
}

/// The library starts the same simulator in-process (the binary is still the VMs' agent).
#[tokio::test]
async fn an_in_process_simulator_serves_and_cleans_up() {
    if Sim::start(&[]).is_none() {
        return;
    }
    let mut config = e2b_simulator::Config::new(env!("CARGO_BIN_EXE_e2b-simulator").into());
    config.runtime = common::runtime().parse().unwrap();
    let sim = e2b_simulator::Simulator::start(config).await.unwrap();
    assert_eq!(sim.runtime().name(), common::runtime());
    let headers = [
        ("X-API-Key".to_owned(), sim.api_key().to_owned()),
        ("Content-Type".to_owned(), "application/json".to_owned()),
    ];
    let body = json!({"templateID": "base"}).to_string().into_bytes();
    let created = common::request(&sim.api_url, "POST", "/v2/sandboxes", &headers, body).await;
    assert_eq!(created.status, 201);
    let id = sid(&created.json());
    assert_eq!(containers_of(&id), 1);
    sim.shutdown().await;
    assert_eq!(containers_of(&id), 0);
}
