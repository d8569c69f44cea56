//! One port, three protocols (wire.md §1.1, §1.3, §5.6, §9): Connect JSON and binary,
//! gRPC over prior-knowledge h2c, gRPC-Web over HTTP/1.1.

use plimsoll_tests::connect::{
    self, PROTOCOL, REQUEST_ID, Reason, SERVICE_PREFIX, assert_bound, assert_disabled, rpc_status,
};
use plimsoll_tests::http1::{Connection, Request};
use plimsoll_tests::protobuf;
use plimsoll_tests::{Daemon, h2c};
use serde_json::json;

/// `RunRequest{protocol: 4, javascript: {code}}` in binary protobuf.
fn run_request_proto(code: &str) -> Vec<u8> {
    let mut js = Vec::new();
    protobuf::put_bytes(&mut js, 1, code.as_bytes());
    let mut m = Vec::new();
    protobuf::put_uint(&mut m, 1, u64::from(PROTOCOL));
    protobuf::put_bytes(&mut m, 10, &js);
    m
}

/// Checks a binary `DescribeResponse` states the disabled provider and protocol 4.
fn assert_describes_disabled(message: &[u8]) {
    let f = protobuf::decode(message).expect("DescribeResponse decodes");
    assert_eq!(
        protobuf::string(&f, 1).as_deref(),
        Some("disabled"),
        "{f:?}"
    );
    assert_eq!(protobuf::string(&f, 2).as_deref(), Some("none"), "{f:?}");
    assert_eq!(protobuf::uint(&f, 9), Some(u64::from(PROTOCOL)), "{f:?}");
    assert!(
        !f.iter().any(|(n, _)| *n == 6 || *n == 7),
        "numbers 6 and 7 are reserved: {f:?}"
    );
}

#[test]
fn describe_over_connect_json_states_the_disabled_provider() {
    let d = Daemon::open();
    let req = connect::call("Describe", &json!({}));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(resp.media_type(), "application/json", "{resp}");
    assert!(
        resp.header("Content-Encoding")
            .is_none_or(|e| e == "identity"),
        "{resp}"
    );
    assert_bound(&resp, &req);
    let v = resp.json();
    assert_eq!(v["sandbox"], "disabled", "{v}");
    assert_eq!(v["isolation"], "none", "{v}");
    assert_eq!(v["protocol"], json!(PROTOCOL), "{v}");
    for env in [
        "javascriptEnvironment",
        "projectEnvironment",
        "moduleEnvironment",
        "resources",
    ] {
        assert!(
            v[env].is_object(),
            "Describe always writes {env}, even empty: {v}"
        );
    }
    for reserved in ["supportsMinimumIsolation", "supportsAdvisory"] {
        assert!(v.get(reserved).is_none(), "{reserved} is reserved: {v}");
    }
    assert_ne!(v["supportsSessions"], json!(true), "{v}");
}

#[test]
fn describe_over_connect_binary() {
    let d = Daemon::open();
    let req = Request::post(&format!("{SERVICE_PREFIX}Describe"))
        .header("Content-Type", "application/proto")
        .header("Connect-Protocol-Version", "1")
        .header(REQUEST_ID, &connect::request_id());
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(resp.media_type(), "application/proto", "{resp}");
    assert_bound(&resp, &req);
    assert_describes_disabled(&resp.body);
}

#[test]
fn connect_binary_errors_are_json() {
    let d = Daemon::open();
    let req = Request::post(&format!("{SERVICE_PREFIX}Run"))
        .header("Content-Type", "application/proto")
        .header("Connect-Protocol-Version", "1")
        .header(REQUEST_ID, &connect::request_id())
        .body(run_request_proto("1"));
    let resp = req.send(d.addr);
    assert_eq!(resp.media_type(), "application/json", "{resp}");
    assert_disabled(&resp, &req);
}

#[test]
fn connect_protocol_version_header_is_optional() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &json!({}))
        .without("Connect-Protocol-Version")
        .send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
}

#[test]
fn describe_over_grpc_on_h2c() {
    let d = Daemon::open();
    let id = connect::request_id();
    let resp = h2c::post(
        d.addr,
        &format!("{SERVICE_PREFIX}Describe"),
        &[
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("plimsoll-request-id", &id),
        ],
        protobuf::grpc_frame(&[]),
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.field("grpc-status").as_deref(), Some("0"), "{resp:?}");
    assert_eq!(
        resp.field("plimsoll-request-id").as_deref(),
        Some(id.as_str()),
        "{resp:?}"
    );
    let frames = protobuf::grpc_frames(&resp.body).expect("gRPC frames");
    assert_eq!(frames.len(), 1, "one message: {frames:?}");
    assert_eq!(frames[0].0, 0, "uncompressed");
    assert_describes_disabled(&frames[0].1);
}

#[test]
fn grpc_refusal_carries_not_dispatched_in_status_details() {
    let d = Daemon::open();
    let id = connect::request_id();
    let resp = h2c::post(
        d.addr,
        &format!("{SERVICE_PREFIX}Run"),
        &[
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("plimsoll-request-id", &id),
        ],
        protobuf::grpc_frame(&run_request_proto("1")),
    );
    assert_eq!(resp.status, 200, "gRPC errors travel in trailers: {resp:?}");
    assert_eq!(
        resp.field("grpc-status").as_deref(),
        Some("9"),
        "FAILED_PRECONDITION: {resp:?}"
    );
    assert_eq!(
        resp.field("plimsoll-request-id").as_deref(),
        Some(id.as_str()),
        "{resp:?}"
    );
    let details = resp
        .field("grpc-status-details-bin")
        .expect("grpc-status-details-bin");
    let raw = connect::decode_base64(&details).expect("details are base64");
    let (code, _, anys) = rpc_status(&raw);
    assert_eq!(code, 9, "{anys:?}");
    assert!(
        anys.iter().any(
            |(t, v)| t.rsplit('/').next() == Some("plimsoll.v1.NotDispatched")
                && *v == Reason::Unsupported.detail_bytes()
        ),
        "NotDispatched{{unsupported}} among {anys:?}"
    );
}

#[test]
fn describe_over_grpc_web_on_http1() {
    let d = Daemon::open();
    let req = Request::post(&format!("{SERVICE_PREFIX}Describe"))
        .header("Content-Type", "application/grpc-web+proto")
        .header("X-Grpc-Web", "1")
        .header(REQUEST_ID, &connect::request_id())
        .body(protobuf::grpc_frame(&[]));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_bound(&resp, &req);
    let frames = protobuf::grpc_frames(&resp.body).expect("gRPC-Web frames");
    let message = frames
        .iter()
        .find(|(flags, _)| flags & 0x80 == 0)
        .expect("a message frame");
    assert_describes_disabled(&message.1);
    let trailer = frames
        .iter()
        .find(|(flags, _)| flags & 0x80 != 0)
        .expect("a trailer frame");
    let text = String::from_utf8_lossy(&trailer.1).to_ascii_lowercase();
    assert!(
        text.contains("grpc-status:0") || text.contains("grpc-status: 0"),
        "{text}"
    );
}

#[test]
fn http1_upgrade_to_h2c_is_not_honoured() {
    let d = Daemon::open();
    let resp = Request::get("/healthz")
        .header("Connection", "Upgrade, HTTP2-Settings")
        .header("Upgrade", "h2c")
        .header("HTTP2-Settings", "AAMAAABkAAQAAP__")
        .send(d.addr);
    assert_ne!(resp.status, 101, "{resp}");
    assert_eq!(
        (resp.status, resp.body.as_slice()),
        (200, &b"ok\n"[..]),
        "{resp}"
    );
    let resp = connect::call("Describe", &json!({}))
        .header("Connection", "Upgrade, HTTP2-Settings")
        .header("Upgrade", "h2c")
        .header("HTTP2-Settings", "AAMAAABkAAQAAP__")
        .send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
}

#[test]
fn options_star_reaches_the_handler_and_gets_a_client_error() {
    let d = Daemon::open();
    let resp = Request::new("OPTIONS", "*").send(d.addr);
    assert!((400..500).contains(&resp.status), "{resp}");
}

#[test]
fn a_fully_read_body_keeps_the_connection() {
    let d = Daemon::open();
    let mut conn = Connection::open(d.addr);
    let refused = connect::call("Run", &connect::javascript("1"));
    conn.send(&refused.to_bytes(d.addr)).unwrap();
    let resp = conn.read_response(false).unwrap();
    assert_disabled(&resp, &refused);
    assert!(!resp.closes(), "{resp}");
    for _ in 0..2 {
        let req = connect::call("Describe", &json!({}));
        conn.send(&req.to_bytes(d.addr)).unwrap();
        let resp = conn
            .read_response(false)
            .expect("the connection stays open");
        assert_eq!(resp.status, 200, "{resp}");
        assert_bound(&resp, &req);
    }
}
