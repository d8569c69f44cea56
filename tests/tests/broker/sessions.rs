//! Session sockets: one socket per session, lent to one granted call at a time, 503 between
//! calls, route caps counted for the session's whole life (spec/grants.md §2.2 step 5,
//! providers.md §9.3 "Grants").

use super::*;

/// A JWT profile a session call may use.
fn session_profile(api: &TestApi, allow: &[&str]) -> Value {
    let mut profile = jwt_profile(api, "JWT_SECRET_A", allow);
    profile["allow_in_sessions"] = json!(true);
    profile
}

fn assert_ended(answer: &Answer) {
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.text(), "host api grant has ended\n");
}

async fn refused(client: &Client, run: &OpenRun) -> Refusal {
    client
        .open(run)
        .await
        .unwrap()
        .expect_err("the lend must be refused")
}

#[tokio::test]
async fn a_session_socket_serves_only_the_grant_lent_to_it() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, r#"{"id":"abc"}"#));
    let broker = Broker::start(
        &api,
        &grants(json!({"sess": session_profile(&api, &["GET /items/*"])})),
    )
    .await;
    let client = broker.client();
    let (slot, socket) = broker.open_session(60_000).await;
    let dir = socket.parent().unwrap().to_owned();
    assert!(socket.is_absolute() && crate::unguessable(&socket));
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("crsbx-broker-"),
        "{}",
        dir.display()
    );
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o711
    );
    assert_eq!(
        std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777,
        0o666
    );

    // Nothing lent: 503, and the API never hears of it.
    assert_ended(&call(&socket, "GET", "/items/abc", &[], b"").await.unwrap());
    assert!(api.requests().is_empty());

    let first = lend_request("alice", "sess", &slot);
    let grant = client.open(&first).await.unwrap().unwrap();
    assert_eq!(
        grant.reach,
        Reach::SessionSlot,
        "a lent run is reached at the session's socket"
    );
    let answer = call(&socket, "GET", "/items/abc", &[], b"").await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.text(), r#"{"id":"abc"}"#);
    let seen = api.requests();
    assert_eq!(seen.len(), 1);
    let claims = decode_jwt(seen[0].header("authorization").unwrap(), SECRET_A);
    assert_eq!(claims["sub"], "alice");
    let summary = client.close(&first.run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (1, 0));

    // Taken back: 503 again, counted against nobody.
    assert_ended(&call(&socket, "GET", "/items/abc", &[], b"").await.unwrap());
    assert_eq!(api.requests().len(), 1);

    // A second call lends its own grant on the same path, with its own token.
    let second = lend_request("alice", "sess", &slot);
    let grant = client.open(&second).await.unwrap().unwrap();
    assert_eq!(grant.reach, Reach::SessionSlot);
    assert_eq!(
        call(&socket, "GET", "/items/abc", &[], b"")
            .await
            .unwrap()
            .status,
        200
    );
    let seen = api.requests();
    assert_eq!(seen.len(), 2);
    assert_ne!(
        seen[0].header("authorization"),
        seen[1].header("authorization"),
        "each call is minted its own credential"
    );

    // Closing the session closes the grant still lent and removes the socket.
    client.close_session(&slot).await.unwrap();
    // The socket goes; the directory is the broker's and stays while it lives.
    assert!(!socket.exists() && dir.exists(), "the socket must be gone");
    assert!(call(&socket, "GET", "/items/abc", &[], b"").await.is_none());
    let log = broker.wait_log(r#""end":"session_closed""#).await;
    assert!(log.contains(&second.run), "{log}");
    match client.close(&second.run).await {
        Err(ControlError::Refused(r)) => assert_eq!(r.message, "unknown run"),
        other => panic!("the lent run outlived its session: {other:?}"),
    }
    match client.close_session(&slot).await {
        Err(ControlError::Refused(r)) => {
            assert_eq!(r.reason, RefusalReason::Request);
            assert_eq!(r.message, "unknown session");
        }
        other => panic!("second close_session: {other:?}"),
    }
}

#[tokio::test]
async fn bad_lends_and_bad_sessions_are_refused() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(json!({
            "inv": jwt_profile(&api, "JWT_SECRET_A", &["GET /items/*"]),
            "sess": session_profile(&api, &["GET /items/*"]),
        })),
    )
    .await;
    let client = broker.client();
    let (slot, _socket) = broker.open_session(60_000).await;

    let r = refused(&client, &lend_request("alice", "inv", &slot)).await;
    assert_eq!(r.reason, RefusalReason::Permission);
    assert!(r.message.contains("sessions"), "{}", r.message);

    let mut not_a_session_call = lend_request("alice", "sess", &slot);
    not_a_session_call.session = false;
    let r = refused(&client, &not_a_session_call).await;
    assert_eq!(r.reason, RefusalReason::Request, "{}", r.message);

    let r = refused(&client, &lend_request("alice", "sess", &fresh_run_id())).await;
    assert_eq!(
        (r.reason, r.message.as_str()),
        (RefusalReason::Request, "unknown session")
    );

    let lent = lend_request("alice", "sess", &slot);
    client.open(&lent).await.unwrap().unwrap();
    let r = refused(&client, &lend_request("alice", "sess", &slot)).await;
    assert_eq!(
        (r.reason, r.message.as_str()),
        (RefusalReason::Request, "the session's slot is already lent")
    );
    // Once taken back, the slot can be lent again.
    client.close(&lent.run).await.unwrap();
    let again = lend_request("alice", "sess", &slot);
    client.open(&again).await.unwrap().unwrap();

    let open = |session: String, deadline_unix_ms: u64| {
        let client = client.clone();
        async move {
            client
                .open_session(&OpenSession {
                    session,
                    deadline_unix_ms,
                    delivery: Delivery::Socket,
                })
                .await
                .unwrap()
                .expect_err("the session must be refused")
        }
    };
    let r = open("ABCD".repeat(8), now_ms() + 10_000).await;
    assert_eq!(r.reason, RefusalReason::Request, "{}", r.message);
    let r = open(slot.clone(), now_ms() + 10_000).await;
    assert_eq!(
        (r.reason, r.message.as_str()),
        (RefusalReason::Request, "duplicate session id")
    );
    let r = open(fresh_run_id(), now_ms() - 1).await;
    assert_eq!(r.reason, RefusalReason::Capacity, "{}", r.message);
}

#[tokio::test]
async fn route_caps_count_for_the_whole_session() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let mut capped = session_profile(&api, &["GET /items/*"]);
    capped["route_max_calls"] = json!({"GET /items/*": 2});
    // Another profile capping the same route of the same API (written in another case).
    let mut twin = session_profile(&api, &["GET /items/*"]);
    twin["route_max_calls"] = json!({"get /items/*": 5});
    let broker = Broker::start(&api, &grants(json!({"capped": capped, "twin": twin}))).await;
    let client = broker.client();
    let (slot, socket) = broker.open_session(60_000).await;

    let first = lend_request("alice", "capped", &slot);
    client.open(&first).await.unwrap().unwrap();
    for _ in 0..2 {
        let answer = call(&socket, "GET", "/items/abc", &[], b"").await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    client.close(&first.run).await.unwrap();

    let second = lend_request("alice", "capped", &slot);
    client.open(&second).await.unwrap().unwrap();
    let answer = call(&socket, "GET", "/items/abc", &[], b"").await.unwrap();
    assert_eq!(answer.status, 429, "{}", answer.text());
    assert_eq!(answer.text(), "host api route call limit reached\n");
    let summary = client.close(&second.run).await.unwrap();
    assert_eq!((summary.calls, summary.denied), (1, 1));

    // The twin's own cap is 5, but the count (2) is shared: three more calls, then 429.
    let third = lend_request("alice", "twin", &slot);
    client.open(&third).await.unwrap().unwrap();
    for n in 0..3 {
        let answer = call(&socket, "GET", "/items/abc", &[], b"").await.unwrap();
        assert_eq!(answer.status, 200, "call {n}: {}", answer.text());
    }
    let answer = call(&socket, "GET", "/items/abc", &[], b"").await.unwrap();
    assert_eq!(answer.status, 429, "{}", answer.text());
    client.close(&third.run).await.unwrap();
    assert_eq!(api.requests().len(), 5);

    // A plain run of the same profile still gets fresh counts.
    let plain = open_request("alice", "capped", 20_000);
    let grant = client.open(&plain).await.unwrap().unwrap();
    assert_ne!(socket_of(&grant), socket);
    for _ in 0..2 {
        assert_eq!(get(&grant, "/items/abc").await.status, 200);
    }
    assert_eq!(get(&grant, "/items/abc").await.status, 429);

    // So does another session.
    let (other_slot, other_socket) = broker.open_session(60_000).await;
    let fresh = lend_request("alice", "capped", &other_slot);
    client.open(&fresh).await.unwrap().unwrap();
    let answer = call(&other_socket, "GET", "/items/abc", &[], b"")
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test]
async fn a_session_past_its_deadline_is_removed_by_the_broker() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(json!({"sess": session_profile(&api, &["GET /items/*"])})),
    )
    .await;
    let client = broker.client();
    let opened = Instant::now();
    let (slot, socket) = broker.open_session(1_000).await;
    let dir = socket.parent().unwrap().to_owned();
    // A grant still lent when the session's time is up is revoked with it.
    let lent = lend_request("alice", "sess", &slot);
    client.open(&lent).await.unwrap().unwrap();

    // The deadline (1 s) plus the 5 s grace; the wait is bounded.
    let limit = opened + Duration::from_millis(6_500) + WAIT;
    while socket.exists() {
        assert!(
            Instant::now() < limit,
            "the session socket was never removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone_after = opened.elapsed();
    assert!(
        gone_after >= Duration::from_millis(5_500),
        "removed before the grace ran out: {gone_after:?}"
    );
    assert!(dir.exists(), "the broker's directory stays while it lives");
    assert!(call(&socket, "GET", "/items/abc", &[], b"").await.is_none());
    match client.close_session(&slot).await {
        Err(ControlError::Refused(r)) => assert_eq!(r.message, "unknown session"),
        other => panic!("the session outlived its deadline: {other:?}"),
    }
    match client.close(&lent.run).await {
        Err(ControlError::Refused(r)) => assert_eq!(r.message, "unknown run"),
        other => panic!("the lent run outlived its session: {other:?}"),
    }
}

/// Sends one request on a kept-alive connection and reads one answer (Content-Length framed).
async fn exchange(stream: &mut UnixStream, target: &str) -> Answer {
    let attempt = async {
        let head = format!("GET {target} HTTP/1.1\r\nHost: host-api\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let mut byte = [0; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            raw.push(byte[0]);
        }
        let length: usize = parse_answer(&raw)
            .unwrap()
            .header("content-length")
            .unwrap()
            .parse()
            .unwrap();
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        raw.extend_from_slice(&body);
        parse_answer(&raw).unwrap()
    };
    tokio::time::timeout(WAIT, attempt)
        .await
        .expect("exchange hung")
}

#[tokio::test]
async fn a_kept_alive_connection_follows_the_slot() {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, "{}"));
    let broker = Broker::start(
        &api,
        &grants(json!({"sess": session_profile(&api, &["GET /items/*"])})),
    )
    .await;
    let client = broker.client();
    let (slot, socket) = broker.open_session(60_000).await;
    let mut stream = UnixStream::connect(&socket).await.unwrap();
    assert_ended(&exchange(&mut stream, "/items/abc").await);
    let lent = lend_request("alice", "sess", &slot);
    client.open(&lent).await.unwrap().unwrap();
    assert_eq!(exchange(&mut stream, "/items/abc").await.status, 200);
    client.close(&lent.run).await.unwrap();
    assert_ended(&exchange(&mut stream, "/items/abc").await);
    assert_eq!(api.requests().len(), 1);
}

#[tokio::test]
async fn sigterm_closes_every_session_and_its_lent_run() {
    let api = TestApi::start();
    let broker = Broker::start(
        &api,
        &grants(json!({"sess": session_profile(&api, &["GET /items/*"])})),
    )
    .await;
    let (slot, socket) = broker.open_session(60_000).await;
    let (_, idle_socket) = broker.open_session(60_000).await;
    let lent = lend_request("alice", "sess", &slot);
    broker.client().open(&lent).await.unwrap().unwrap();
    let dirs = [
        socket.parent().unwrap().to_owned(),
        idle_socket.parent().unwrap().to_owned(),
    ];
    let log = broker.log.clone();
    tokio::task::spawn_blocking(move || drop(broker))
        .await
        .unwrap();
    for dir in &dirs {
        assert!(!dir.exists(), "{} outlived the broker", dir.display());
    }
    let log = wait_for_log(&log, r#""end":"shutdown""#).await;
    assert!(log.contains(&lent.run), "{log}");
}
