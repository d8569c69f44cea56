//! Unit tests of the daemon's grant handle: how broker refusals map, an open dropped before
//! its answer, and a daemon without a broker.

use super::*;

#[test]
fn broker_refusals_keep_their_reason() {
    let of = |reason| {
        refusal(protocol::Refusal {
            reason,
            message: "m".into(),
        })
        .code_and_reason()
        .1
        .as_str()
    };
    assert_eq!(of(RefusalReason::Permission), "permission");
    assert_eq!(of(RefusalReason::Capacity), "capacity");
    assert_eq!(of(RefusalReason::Request), "request");
}

/// An open whose future is dropped before the broker answered (the caller went away)
/// closes its run: the broker may have opened it, and nothing else would.
#[tokio::test]
async fn an_open_dropped_before_its_answer_closes_its_run() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (seen, mut requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let request: protocol::Request = serde_json::from_str(&line).unwrap();
                    // The open is never answered; the close is, as an unknown run.
                    if matches!(request, protocol::Request::Close { .. }) {
                        let refused = protocol::Response::Refused(protocol::Refusal {
                            reason: RefusalReason::Request,
                            message: "unknown run".into(),
                        });
                        let mut out = serde_json::to_vec(&refused).unwrap();
                        out.push(b'\n');
                        let _ = write.write_all(&out).await;
                    }
                    let _ = seen.send(request);
                }
            });
        }
    });
    let client = Client::new(&path);
    let request = OpenRun {
        run: "r1".into(),
        principal: "alice".into(),
        profile: "inv".into(),
        deadline_unix_ms: 0,
        session: false,
        delivery: Delivery::Socket,
        slot: None,
        kept_from_earlier_calls: 0,
        call_token: false,
    };
    let open = async {
        let _in_flight = OpenInFlight {
            client: &client,
            run: "r1",
            armed: true,
        };
        client.open(&request).await
    };
    let dropped = tokio::time::timeout(Duration::from_millis(300), open).await;
    assert!(dropped.is_err(), "the open was never answered");
    let first = requests.recv().await.unwrap();
    assert!(matches!(first, protocol::Request::Open(_)), "{first:?}");
    let closed = tokio::time::timeout(Duration::from_secs(5), requests.recv())
        .await
        .expect("a close within 5 s")
        .unwrap();
    assert!(
        matches!(&closed, protocol::Request::Close { run } if run == "r1"),
        "{closed:?}"
    );
}

#[tokio::test]
async fn without_a_broker_a_profile_is_unavailable_with_the_same_text() {
    let grants = Grants::off();
    let caller = Principal {
        id: Some("alice".into()),
        scopes: vec!["*".into()],
        paid_seconds_per_day: None,
    };
    let err = grants
        .open("inv", &caller, SystemTime::now(), Delivery::Socket)
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        unavailable("inv").to_string(),
        "the unknown-profile answer"
    );
    let selected = grants.select("inv", &caller, false).unwrap_err();
    assert_eq!(selected.to_string(), unavailable("inv").to_string());
    assert!(grants.ready().is_ok());
    assert_eq!(grants.profiles(), 0);
}
