//! Module runs on docker (providers.md §8, issue 19) at the wire, below what the published
//! client lets a caller send: malformed tables refused before dispatch, the answer on
//! Connect's binary codec (NaN bits canonical, `-0.0` kept), and a daemon without a module
//! image. The models' results against independent values are in tests/interop/test_module.py,
//! through the Python client.

use buffa::Message as _;
use plimsoll::record;
use plimsoll::wire::{ModuleRow, ModuleRun, RunRequest, RunResponse, run_response};
use plimsoll_tests::connect::{REQUEST_ID, SERVICE_PREFIX};
use plimsoll_tests::docker::module_image;
use plimsoll_tests::http1::Request;

use super::*;

/// The daemon the module tests share: the module image on this runtime.
fn modules() -> Arc<Shared> {
    static MODULES: Mutex<Weak<Shared>> = Mutex::new(Weak::new());
    let mut slot = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = slot.upgrade() {
        return d;
    }
    let d = Arc::new(Shared(Daemon::start(&env_with(&[(
        "SANDBOX_DOCKER_MODULE_IMAGE",
        module_image(),
    )]))));
    *slot = Arc::downgrade(&d);
    d
}

macro_rules! require_module_image {
    () => {
        if !plimsoll_tests::docker::module_image_ready() {
            return;
        }
    };
}

fn module(model: &str, rows: Value, end_time: Value, step: Value) -> Value {
    json!({
        "protocol": connect::PROTOCOL,
        "module": { "model": model, "rows": rows, "endTime": end_time, "step": step },
    })
}

/// Malformed module requests, each refused with `invalid_argument` and `NotDispatched{request}`
/// (the daemon's statement that nothing ran), whatever the published client would have let
/// through.
#[test]
fn malformed_tables_are_refused_before_dispatch() {
    require_docker!();
    require_module_image!();
    let d = modules();
    let row = |v: Value| json!({ "values": v });
    let one = json!([row(json!([1.0, 0.1, 1.0, 0.0]))]);
    let cases = [
        (
            "a NaN value",
            module(
                "damped-oscillator",
                json!([row(json!([1.0, "NaN", 1.0, 0.0]))]),
                json!(1.0),
                json!(0.5),
            ),
        ),
        (
            "an infinite value",
            module(
                "damped-oscillator",
                json!([row(json!(["Infinity", 0.1, 1.0, 0.0]))]),
                json!(1.0),
                json!(0.5),
            ),
        ),
        (
            "rows of two widths",
            module(
                "damped-oscillator",
                json!([row(json!([1.0, 0.1, 1.0, 0.0])), row(json!([1.0]))]),
                json!(1.0),
                json!(0.5),
            ),
        ),
        (
            "an empty row",
            module(
                "damped-oscillator",
                json!([row(json!([]))]),
                json!(1.0),
                json!(0.5),
            ),
        ),
        (
            "no rows",
            module("damped-oscillator", json!([]), json!(1.0), json!(0.5)),
        ),
        (
            "a row of 65 values",
            module(
                "damped-oscillator",
                json!([row(json!(vec![1.0; 65]))]),
                json!(1.0),
                json!(0.5),
            ),
        ),
        (
            "a model id with a slash",
            module("../damped-oscillator", one.clone(), json!(1.0), json!(0.5)),
        ),
        (
            "an empty model id",
            module("", one.clone(), json!(1.0), json!(0.5)),
        ),
        (
            "end_time 0",
            module("damped-oscillator", one.clone(), json!(0.0), json!(0.5)),
        ),
        (
            "a negative step",
            module("damped-oscillator", one.clone(), json!(1.0), json!(-0.5)),
        ),
        (
            "an infinite end_time",
            module(
                "damped-oscillator",
                one.clone(),
                json!("Infinity"),
                json!(0.5),
            ),
        ),
        (
            "over a million steps",
            module(
                "damped-oscillator",
                one.clone(),
                json!(1000.0),
                json!(0.0009),
            ),
        ),
        (
            "results over 8 MiB by the wire's own rule",
            module(
                "damped-oscillator",
                json!(vec![row(json!([1.0, 0.1, 1.0, 0.0])); 2]),
                json!(1000.0),
                json!(0.001),
            ),
        ),
    ];
    for (what, body) in cases {
        let req = connect::call("Run", &body);
        let resp = send(d.addr, &req);
        let err = connect::assert_invalid(&resp, &req);
        assert!(!err.message.is_empty(), "{what}: {resp}");
    }
}

/// The answer on Connect's binary codec keeps every double's bits but NaN's: the model's
/// overflow yields infinities and NaNs (x86 makes a negative NaN), which the daemon rewrites
/// to the canonical quiet NaN before hashing, and the smallest negative subnormal, which the
/// oscillator keeps as it is (its change underflows to zero), comes back exactly. The record
/// verifies.
#[test]
fn outputs_on_the_binary_wire_keep_their_bits_and_nan_is_canonical() {
    require_docker!();
    require_module_image!();
    let d = modules();
    let rows = [
        vec![1.0, 0.0, 1e308, 1e308],
        // x stays -5e-324: every change to it underflows to zero.
        vec![1.0, 0.0, -5e-324, 0.0],
    ];
    let req = RunRequest {
        protocol: connect::PROTOCOL,
        payload: Some(
            ModuleRun {
                model: "damped-oscillator".into(),
                rows: rows
                    .iter()
                    .map(|values| ModuleRow {
                        values: values.clone(),
                        ..Default::default()
                    })
                    .collect(),
                end_time: 1.0,
                step: 0.5,
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    let http = Request::post(&format!("{SERVICE_PREFIX}Run"))
        .header("Content-Type", "application/proto")
        .header("Connect-Protocol-Version", "1")
        .header(REQUEST_ID, &connect::request_id())
        .body(req.encode_to_vec());
    let resp = send(d.addr, &http);
    assert_eq!(resp.status, 200, "{resp}");
    let answer = RunResponse::decode_from_slice(&resp.body).expect("a RunResponse");
    record::check_single(&record::request_digest(&req), None, &answer)
        .unwrap_or_else(|e| panic!("record does not verify: {e}"));
    let Some(run_response::Result::Module(m)) = &answer.result else {
        panic!("not a module answer: {answer:?}");
    };
    assert_eq!((m.width, m.runs.len()), (2, 2), "{m:?}");
    let overflowed = &m.runs[0].outputs;
    assert!(overflowed.iter().any(|v| v.is_nan()), "{overflowed:?}");
    for v in overflowed.iter().filter(|v| v.is_nan()) {
        assert_eq!(v.to_bits(), record::CANONICAL_NAN_BITS);
    }
    let still = &m.runs[1].outputs;
    assert_eq!(still.len(), 4);
    assert_eq!(still[2].to_bits(), (-5e-324f64).to_bits(), "{still:?}");
    assert_eq!(answer.environment, image_id(module_image()));
    assert_eq!(answer.isolation, tier());
}

/// Without `SANDBOX_DOCKER_MODULE_IMAGE` a docker daemon states no module support and
/// refuses a module as unsupported, before dispatch.
#[test]
fn without_a_module_image_modules_are_unsupported() {
    require_docker!();
    let d = shared();
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_ne!(v["supportsModule"], true, "{v}");
    assert_eq!(v["moduleEnvironment"], json!({}), "{v}");
    let body = module(
        "damped-oscillator",
        json!([{ "values": [1.0, 0.1, 1.0, 0.0] }]),
        json!(1.0),
        json!(0.5),
    );
    let req = connect::call("Run", &body);
    let resp = send(d.addr, &req);
    connect::assert_refused(&resp, &req, "unimplemented", connect::Reason::Unsupported);
}

/// A configured module image that docker does not have stops the daemon at startup.
#[test]
fn a_missing_module_image_fails_startup() {
    require_docker!();
    let out = plimsoll_tests::finish(
        "plimsolld",
        &[],
        &env_with(&[
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
            (
                "SANDBOX_DOCKER_MODULE_IMAGE",
                "plimsoll/no-such-module-image:never",
            ),
        ]),
        b"",
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        out.stderr.contains("plimsoll/no-such-module-image:never"),
        "{}",
        out.stderr
    );
}
