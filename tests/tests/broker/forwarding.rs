//! What a run's socket forwards and refuses: routes, headers, credentials, budgets, sizes,
//! the breaker (spec/grants.md §2.2–2.3).

use super::*;

#[tokio::test]
async fn an_allowed_route_reaches_the_api_with_a_jwt_bound_to_the_principal() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, r#"{"id":"abc"}"#));
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"])})),
    )
    .await;
    let run = open_request("alice", "inv", 10_000);
    let opened_at = now_ms() / 1000;
    let grant = broker.client().open(&run).await.unwrap().unwrap();
    assert!(socket_of(&grant).is_absolute() && unguessable(&socket_of(&grant)));
    assert_eq!(grant.global, "host");
    assert_eq!(grant.allow.len(), 1);
    assert_eq!(
        (grant.allow[0].m.as_str(), grant.allow[0].p.as_str()),
        ("GET", "/items/*")
    );

    let answer = get(&grant, "/items/abc").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.text(), r#"{"id":"abc"}"#);
    assert_eq!(answer.header("content-type"), Some("application/json"));

    let seen = api.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].target, "/items/abc");
    let claims = decode_jwt(seen[0].header("authorization").unwrap(), SECRET_A);
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["aud"], "inventory");
    assert_eq!(claims["iss"], "plimsoll-test");
    assert_eq!(claims["scope"], "inv:read inv:write");
    let iat = claims["iat"].as_u64().unwrap();
    assert_eq!(claims["nbf"].as_u64(), Some(iat));
    assert!(iat.abs_diff(opened_at) <= 2, "iat {iat} vs {opened_at}");
    let life = claims["exp"].as_u64().unwrap() - iat;
    assert!(
        (14..=15).contains(&life),
        "lifetime {life}: min(ttl 60, budget 10 s + 5 s)"
    );
    let jti = claims["jti"].as_str().unwrap();
    assert!(
        jti.len() == 32 && jti.bytes().all(|b| b.is_ascii_hexdigit()),
        "{jti}"
    );

    // The token is minted once per run: a second call carries the same one.
    get(&grant, "/items/abc").await;
    let seen = api.requests();
    assert_eq!(
        seen[0].header("authorization"),
        seen[1].header("authorization")
    );
    let summary = broker.client().close(&run.run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (2, 0));
    assert_eq!(summary.routes.get("GET /items/*"), Some(&2));
    // The audit line names the caller and profile, never the token.
    let log = broker.wait_log("grant run closed").await;
    assert!(log.contains(r#""caller":"alice""#), "{log}");
    let token = seen[0]
        .header("authorization")
        .unwrap()
        .trim_start_matches("Bearer ");
    assert!(!log.contains(token) && !log.contains(SECRET_A));
}

#[tokio::test]
async fn routes_outside_the_profile_are_refused_and_never_reach_the_api() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(
            json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*", "POST /orders"])}),
        ),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    for (method, target) in [
        ("GET", "/other"),
        ("DELETE", "/items/abc"),
        ("GET", "/items/abc?limit=1"),
        ("GET", "/items/a%2fb"),
        ("GET", "/items/a;b"),
        ("GET", "/items/../orders"),
        ("GET", "/items/a:b"),
        ("GET", "/items/abc/"),
        ("GET", "/items"),
        ("POST", "/orders?x=1"),
        ("GET", "http://evil.example/items/abc"),
    ] {
        let answer = call(&socket_of(&grant), method, target, &[], b"")
            .await
            .unwrap();
        assert_eq!(answer.status, 403, "{method} {target}: {}", answer.text());
        assert_eq!(answer.text(), "forbidden by sandbox capability allowlist\n");
        assert!(
            answer
                .header("content-type")
                .unwrap()
                .starts_with("text/plain")
        );
    }
    assert!(
        api.requests().is_empty(),
        "the API saw {:?}",
        api.requests()
    );
}

#[tokio::test]
async fn guest_headers_are_never_forwarded() {
    let api = TestApi::start();
    api.respond("POST", "/orders", Reply::json(201, r#"{"ok":true}"#));
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["POST /orders"])})),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    let answer = call(
        &socket_of(&grant),
        "POST",
        "/orders",
        &[
            ("Cookie", "session=guest"),
            ("Authorization", "Bearer guest-forged"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("Content-Type", "text/evil"),
            ("X-Custom", "1"),
        ],
        br#"{"n":1}"#,
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 201, "{}", answer.text());
    let seen = &api.requests()[0];
    assert_eq!(seen.body, br#"{"n":1}"#);
    let names: Vec<&str> = seen.headers.iter().map(|(n, _)| n.as_str()).collect();
    for name in &names {
        assert!(
            [
                "host",
                "accept",
                "content-type",
                "content-length",
                "authorization"
            ]
            .contains(name),
            "unexpected upstream header {name}: {names:?}"
        );
    }
    assert_eq!(seen.header("accept"), Some("application/json"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert!(seen.header("cookie").is_none());
    let claims = decode_jwt(seen.header("authorization").unwrap(), SECRET_A);
    assert_eq!(claims["sub"], "alice");
}

#[tokio::test]
async fn a_static_token_is_sent_as_is() {
    let api = TestApi::start();
    api.respond("GET", "/ping", Reply::json(200, "{}"));
    let profile = json!({
        "base_url": api.base_url(), "allow": ["GET /ping"], "allowed_callers": ["*"],
        "token": {"type": "static", "env": "STATIC_TOKEN"},
    });
    let broker = Broker::start(&api, &grants(json!({"live": profile}))).await;
    let grant = broker.open("anyone", "live").await;
    assert_eq!(get(&grant, "/ping").await.status, 200);
    let expected = format!("Bearer {STATIC_TOKEN}");
    assert_eq!(
        api.requests()[0].header("authorization"),
        Some(expected.as_str())
    );
    // GET with no body: no Content-Type upstream.
    assert!(api.requests()[0].header("content-type").is_none());
}

#[tokio::test]
async fn the_budget_counts_denied_calls_and_then_refuses() {
    let api = TestApi::start();
    api.respond("GET", "/items/a", Reply::json(200, "{}"));
    let mut profile = jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"]);
    profile["max_calls"] = json!(4);
    let broker = Broker::start(&api, &grants(json!({"inv": profile}))).await;
    let run = open_request("alice", "inv", 20_000);
    let grant = broker.client().open(&run).await.unwrap().unwrap();
    assert_eq!(get(&grant, "/nope").await.status, 403);
    // An absolute target names no route: refused, and counted like any other.
    assert_eq!(get(&grant, "http://api.example/items/a").await.status, 403);
    assert_eq!(get(&grant, "/items/a").await.status, 200);
    assert_eq!(get(&grant, "/items/a").await.status, 200);
    let refused = get(&grant, "/items/a").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.text(), "host api call budget exhausted\n");
    assert_eq!(api.requests().len(), 2);
    let summary = broker.client().close(&run.run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (5, 3));
}

#[tokio::test]
async fn an_upstream_429_opens_the_breaker_for_retry_after() {
    let api = TestApi::start();
    api.respond(
        "GET",
        "/items/a",
        Reply::json(429, r#"{"slow":"down"}"#).with_retry_after("2"),
    );
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"])})),
    )
    .await;
    let run = open_request("alice", "inv", 30_000);
    let grant = broker.client().open(&run).await.unwrap().unwrap();
    let first = get(&grant, "/items/a").await;
    assert_eq!(first.status, 429);
    assert_eq!(first.text(), r#"{"slow":"down"}"#);
    let shed = get(&grant, "/items/a").await;
    assert_eq!(shed.status, 503);
    assert!(
        shed.text().starts_with("host api is shedding load"),
        "{}",
        shed.text()
    );
    assert_eq!(
        api.requests().len(),
        1,
        "a shed call must not reach the API"
    );
    api.respond("GET", "/items/a", Reply::json(200, "{}"));
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(get(&grant, "/items/a").await.status, 200);
    let summary = broker.client().close(&run.run).await.unwrap();
    assert_eq!((summary.calls, summary.shed, summary.denied), (3, 1, 0));
}

#[tokio::test]
async fn a_response_over_4_mib_is_refused_502() {
    let api = TestApi::start();
    let mut big = Reply::json(200, "");
    big.body = vec![b'x'; 4 * 1024 * 1024 + 1];
    api.respond("GET", "/big", big);
    let mut fits = Reply::json(200, "");
    fits.body = vec![b'y'; 4 * 1024 * 1024];
    api.respond("GET", "/fits", fits);
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /big", "GET /fits"])})),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    let answer = get(&grant, "/big").await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.text(), "host api unavailable\n");
    let answer = get(&grant, "/fits").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body.len(), 4 * 1024 * 1024);
}

#[tokio::test]
async fn a_request_body_over_1_mib_is_refused_413() {
    let api = TestApi::start();
    api.respond("POST", "/orders", Reply::json(200, "{}"));
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["POST /orders"])})),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    let body = vec![b'1'; 1024 * 1024 + 1];
    let answer = call(&socket_of(&grant), "POST", "/orders", &[], &body).await;
    // The broker may answer before the guest finished sending; either way nothing upstream.
    let answer = answer.expect("an answer");
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn route_caps_are_charged_case_insensitively_and_refuse_past_the_cap() {
    let api = TestApi::start();
    api.respond("POST", "/v2/run", Reply::json(200, "{}"));
    api.respond("GET", "/v2/status", Reply::json(200, "{}"));
    let mut profile = jwt_profile(&api, "JWT_SECRET_A", &["POST /v2/run", "GET /v2/status"]);
    profile["route_max_calls"] = json!({"post /v2/run": 2});
    let broker = Broker::start(&api, &grants(json!({"inv": profile}))).await;
    let run = open_request("alice", "inv", 20_000);
    let grant = broker.client().open(&run).await.unwrap().unwrap();
    for _ in 0..2 {
        let answer = call(&socket_of(&grant), "POST", "/v2/run", &[], b"{}")
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let capped = call(&socket_of(&grant), "POST", "/v2/run", &[], b"{}")
        .await
        .unwrap();
    assert_eq!(capped.status, 429);
    assert_eq!(capped.text(), "host api route call limit reached\n");
    // Other routes still work.
    assert_eq!(get(&grant, "/v2/status").await.status, 200);
    assert_eq!(api.requests().len(), 3);
    let summary = broker.client().close(&run.run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (4, 1));
}

#[tokio::test]
async fn at_most_16_calls_are_in_flight_per_run() {
    let api = TestApi::start();
    api.respond(
        "GET",
        "/slow",
        Reply::json(200, "{}").with_delay(Duration::from_secs(3)),
    );
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /slow"])})),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    let calls: Vec<_> = (0..17)
        .map(|_| {
            let socket = socket_of(&grant).clone();
            tokio::spawn(async move { call(&socket, "GET", "/slow", &[], b"").await.unwrap() })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        let answer = call.await.unwrap();
        if answer.status == 429 {
            assert_eq!(answer.text(), "host api broker is at capacity\n");
        }
        statuses.push(answer.status);
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        16,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        1,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn after_an_upstream_503_a_healthy_probe_closes_the_breaker() {
    let api = TestApi::start();
    api.respond(
        "GET",
        "/items/a",
        Reply::json(503, "{}").with_retry_after("30"),
    );
    api.respond("GET", "/health", Reply::json(200, "{}"));
    let mut profile = jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"]);
    profile["health_check"] = json!("GET /health");
    let broker = Broker::start(&api, &grants(json!({"inv": profile}))).await;
    let run = open_request("alice", "inv", 20_000);
    let grant = broker.client().open(&run).await.unwrap().unwrap();
    assert_eq!(get(&grant, "/items/a").await.status, 503);
    api.respond("GET", "/items/a", Reply::json(200, r#""back""#));
    // The next call is elected to probe; the probe's 2xx closes the breaker at once.
    let answer = get(&grant, "/items/a").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let targets: Vec<String> = api.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(targets, ["/items/a", "/health", "/items/a"]);
    let summary = broker.client().close(&run.run).await.unwrap();
    assert_eq!(
        (summary.calls, summary.shed),
        (2, 0),
        "the probe is not charged"
    );
}

#[tokio::test]
async fn a_refusal_given_before_the_body_arrives_reaches_the_guest_on_a_usable_connection() {
    let api = TestApi::start();
    api.respond("GET", "/items/a", Reply::json(200, r#"{"id":"a"}"#));
    let broker = Broker::start(
        &api,
        &grants(json!({"inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"])})),
    )
    .await;
    let grant = broker.open("alice", "inv").await;
    let mut stream = UnixStream::connect(socket_of(&grant)).await.unwrap();
    // The route is refused from the head alone; the body comes after the broker has decided.
    stream
        .write_all(b"POST /admin HTTP/1.1\r\nhost: api\r\ncontent-length: 5\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stream.write_all(b"hello").await.unwrap();
    let refused = read_one_answer(&mut stream).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        refused.ends_with("forbidden by sandbox capability allowlist\n"),
        "{refused}"
    );
    // The same connection carries the next call.
    stream
        .write_all(b"GET /items/a HTTP/1.1\r\nhost: api\r\n\r\n")
        .await
        .unwrap();
    let allowed = read_one_answer(&mut stream).await;
    assert!(allowed.starts_with("HTTP/1.1 200"), "{allowed}");
    assert!(allowed.ends_with(r#"{"id":"a"}"#), "{allowed}");
    assert_eq!(
        api.requests().len(),
        1,
        "the refused call never reached the API"
    );
}

/// Reads one HTTP/1.1 answer with a `content-length` from a kept-alive connection.
async fn read_one_answer(stream: &mut UnixStream) -> String {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !raw.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed mid-head");
            raw.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("a content-length");
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        raw.extend_from_slice(&body);
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no answer");
    String::from_utf8(raw).unwrap()
}
