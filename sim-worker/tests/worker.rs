//! The worker binary end to end on the host: small models written in the WebAssembly text
//! format, precompiled with `sim_worker::precompile` exactly as images/module/build does, then
//! run by the real `sim-worker` executable. Each test states the ABI rule or limit it proves.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sim_format::results::{self, Expect, Results};
use sim_format::{exit, grid, status, table};

/// A model in WAT with the ABI's boilerplate: a 1-page memory, params at 0, outputs at 1024,
/// `PARAMS` and `OUTPUTS` as stated, and the given `init` and `step` bodies.
fn model(params: i32, outputs: i32, init: &str, step: &str, extra: &str) -> String {
    format!(
        r#"(module
  (memory (export "memory") 1)
  (global $n (mut i32) (i32.const 0))
  (func (export "plimsoll_abi") (result i32) (i32.const 1))
  (func (export "plimsoll_params") (result i32) (i32.const {params}))
  (func (export "plimsoll_outputs") (result i32) (i32.const {outputs}))
  (func (export "plimsoll_params_ptr") (result i32) (i32.const 0))
  (func (export "plimsoll_outputs_ptr") (result i32) (i32.const 1024))
  (func (export "plimsoll_init") (result i32) {init})
  (func (export "plimsoll_step") (param $t f64) (param $h f64) (result i32) {step})
  {extra}
)"#
    )
}

/// Output 0 = t + h (the time the step reached), output 1 = param 0 × (t + h); always 0.
const RAMP_STEP: &str = "(f64.store (i32.const 1024) (f64.add (local.get $t) (local.get $h)))
   (f64.store (i32.const 1032) (f64.mul (f64.load (i32.const 0)) (f64.add (local.get $t) (local.get $h))))
   (i32.const 0)";

struct Models {
    dir: tempfile::TempDir,
}

impl Models {
    fn new() -> Models {
        Models {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn add(&self, id: &str, wat: &str) -> Result<(), String> {
        let wasm = self.dir.path().join(format!("{id}.wasm"));
        std::fs::write(&wasm, wat::parse_str(wat).map_err(|e| e.to_string())?).unwrap();
        sim_worker::precompile::precompile(&wasm, &self.dir.path().join("models"), id)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn models(&self) -> PathBuf {
        self.dir.path().join("models")
    }

    /// Runs `sim-worker --table` on `rows`; returns the process output and the results file.
    fn run(
        &self,
        id: &str,
        rows: &[&[f64]],
        end_time: f64,
        step: f64,
        deadline_ms: u64,
    ) -> (Output, Option<Vec<u8>>) {
        let params = self.dir.path().join("params.txt");
        let results = self.dir.path().join("results.bin");
        let _ = std::fs::remove_file(&results);
        std::fs::write(&params, table::write(rows.iter().copied())).unwrap();
        let out = worker(&[
            "--table",
            id,
            params.to_str().unwrap(),
            results.to_str().unwrap(),
            &format!("{end_time:e}"),
            &format!("{step:e}"),
            &sim_format::MAX_RESULT_BYTES.to_string(),
            &deadline_ms.to_string(),
            "--models",
            self.models().to_str().unwrap(),
        ]);
        (out, std::fs::read(&results).ok())
    }
}

fn worker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sim-worker"))
        .args(args)
        .output()
        .unwrap()
}

fn decode(bytes: &[u8], rows: usize, params: u32, end_time: f64, step: f64) -> Results {
    let expect = Expect {
        rows: rows as u32,
        params,
        max_steps: grid::step_count(end_time, step),
    };
    results::decode(bytes, expect).unwrap()
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(exit::OK),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_row_steps_on_the_grid_and_outputs_come_back_bit_for_bit() {
    let m = Models::new();
    m.add("ramp", &model(1, 2, "(i32.const 0)", RAMP_STEP, ""))
        .unwrap();
    let rows: &[&[f64]] = &[&[2.0], &[-0.0], &[f64::MAX]];
    let (out, file) = m.run("ramp", rows, 0.3, 0.1, 10_000);
    ok(&out);
    let results = decode(&file.unwrap(), 3, 1, 0.3, 0.1);
    assert_eq!(results.width, 2);
    let g = grid::Grid::new(0.3, 0.1);
    for (row, params) in results.rows.iter().zip(rows) {
        assert_eq!(row.status, 3);
        for k in 0..3 {
            let t = g.time_after(k);
            assert_eq!(row.outputs[2 * k as usize], t);
            let product = params[0] * t;
            assert_eq!(row.outputs[2 * k as usize + 1].to_bits(), product.to_bits());
        }
    }
    // The last step ends exactly at end_time, and -0.0 × t stays negative zero.
    assert_eq!(results.rows[0].outputs[4], 0.3);
    assert!(results.rows[1].outputs[1].is_sign_negative());
}

#[test]
fn a_model_error_fails_only_its_row_and_a_finished_model_stops_early() {
    let m = Models::new();
    // init refuses a negative parameter with the model's code -7; step 3 says "finished".
    let init = "(if (f64.lt (f64.load (i32.const 0)) (f64.const 0)) (then (return (i32.const -7)))) (i32.const 0)";
    let step = "(global.set $n (i32.add (global.get $n) (i32.const 1)))
       (f64.store (i32.const 1024) (local.get $t))
       (if (result i32) (i32.eq (global.get $n) (i32.const 3)) (then (i32.const 1)) (else (i32.const 0)))";
    m.add("short", &model(1, 1, init, step, "")).unwrap();
    let (out, file) = m.run("short", &[&[1.0], &[-1.0], &[2.0]], 10.0, 1.0, 10_000);
    ok(&out);
    let results = decode(&file.unwrap(), 3, 1, 10.0, 1.0);
    let statuses: Vec<i32> = results.rows.iter().map(|r| r.status).collect();
    // Each row is a fresh instance: the step counter starts again at 0 for row 3.
    assert_eq!(statuses, [3, -7, 3]);
    assert_eq!(results.rows[0].outputs, [0.0, 1.0, 2.0]);
    assert!(results.rows[1].outputs.is_empty());
}

#[test]
fn abi_violations_and_traps_get_the_workers_codes() {
    let m = Models::new();
    m.add(
        "bad-status",
        &model(1, 1, "(i32.const 0)", "(i32.const 5)", ""),
    )
    .unwrap();
    m.add(
        "too-negative",
        &model(1, 1, "(i32.const -1000)", "(i32.const 0)", ""),
    )
    .unwrap();
    m.add("panics", &model(1, 1, "(i32.const 0)", "(unreachable)", ""))
        .unwrap();
    let far = model(1, 1, "(i32.const 0)", "(i32.const 0)", "").replace(
        "(i32.const 1024))\n  (func (export \"plimsoll_init\")",
        "(i32.const 65535))\n  (func (export \"plimsoll_init\")",
    );
    m.add("outputs-outside", &far).unwrap();
    for (id, want) in [
        ("bad-status", status::ABI_VIOLATION),
        ("too-negative", status::ABI_VIOLATION),
        ("panics", status::TRAP),
        ("outputs-outside", status::ABI_VIOLATION),
    ] {
        let (out, file) = m.run(id, &[&[1.0]], 1.0, 1.0, 10_000);
        ok(&out);
        assert_eq!(
            decode(&file.unwrap(), 1, 1, 1.0, 1.0).rows[0].status,
            want,
            "{id}"
        );
    }
}

/// The deadline is wasmtime's epoch interruption: a model that never returns is stopped at
/// the run's deadline, the rows after it do not start, and the file is still written whole.
#[test]
fn a_model_that_loops_forever_ends_at_the_deadline() {
    let m = Models::new();
    m.add(
        "spin",
        &model(1, 1, "(i32.const 0)", "(loop $l (br $l)) (i32.const 0)", ""),
    )
    .unwrap();
    let started = Instant::now();
    let (out, file) = m.run("spin", &[&[1.0], &[2.0], &[3.0]], 1.0, 0.5, 400);
    let took = started.elapsed();
    ok(&out);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let results = decode(&file.unwrap(), 3, 1, 1.0, 0.5);
    assert!(results.rows.iter().all(|r| r.status == status::DEADLINE));
}

/// The memory cap is wasmtime's resource limiter: a model that grows its memory without bound
/// is stopped at the growth that crosses 16 MiB; the next row starts fresh.
#[test]
fn a_model_that_allocates_without_bound_is_stopped_by_the_memory_limit() {
    let m = Models::new();
    let step =
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) (i32.const -9)";
    m.add("grow", &model(1, 1, "(i32.const 0)", step, ""))
        .unwrap();
    let (out, file) = m.run("grow", &[&[1.0], &[1.0]], 1.0, 1.0, 10_000);
    ok(&out);
    let results = decode(&file.unwrap(), 2, 1, 1.0, 1.0);
    // Never -9: the growth past the cap trapped instead of returning -1 to the model.
    assert!(results.rows.iter().all(|r| r.status == status::MEMORY));
}

#[test]
fn refusals_before_any_row_have_their_exit_codes_and_write_no_file() {
    let m = Models::new();
    m.add("ramp", &model(1, 2, "(i32.const 0)", RAMP_STEP, ""))
        .unwrap();
    let (out, file) = m.run("nope", &[&[1.0]], 1.0, 1.0, 1000);
    assert_eq!(
        (out.status.code(), file.is_none()),
        (Some(exit::LOAD_FAILED), true)
    );
    let (out, file) = m.run("ramp", &[&[1.0, 2.0]], 1.0, 1.0, 1000);
    assert_eq!(
        (out.status.code(), file.is_none()),
        (Some(exit::MALFORMED_TABLE), true)
    );
    // 2 outputs × 1 000 001 steps × 8 bytes per row is over 8 MiB for a single row.
    let (out, file) = m.run("ramp", &[&[1.0]], 1000.0, 0.001, 1000);
    assert_eq!(
        (out.status.code(), file.is_none()),
        (Some(exit::OVER_BUDGET), true)
    );
    let out = worker(&["--table", "ramp"]);
    assert_eq!(out.status.code(), Some(exit::USAGE));
}

#[test]
fn list_names_every_model_with_its_shape() {
    let m = Models::new();
    m.add("ramp", &model(1, 2, "(i32.const 0)", RAMP_STEP, ""))
        .unwrap();
    m.add(
        "b-other",
        &model(3, 1, "(i32.const 0)", "(i32.const 0)", ""),
    )
    .unwrap();
    let out = worker(&["--list", "--models", m.models().to_str().unwrap()]);
    ok(&out);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "b-other params=3 outputs=1\nramp params=1 outputs=2\n"
    );
}

#[test]
fn modules_that_break_the_abi_are_refused_at_precompile() {
    let m = Models::new();
    let cases = [
        (
            "imports",
            model(1, 1, "(i32.const 0)", "(i32.const 0)", "")
                .replace("(module", "(module (import \"env\" \"f\" (func))"),
            "imports env::f",
        ),
        (
            "no-step",
            model(1, 1, "(i32.const 0)", "(i32.const 0)", "")
                .replace("(export \"plimsoll_step\")", ""),
            "plimsoll_step",
        ),
        (
            "abi-2",
            model(1, 1, "(i32.const 0)", "(i32.const 0)", "")
                .replace("(result i32) (i32.const 1))", "(result i32) (i32.const 2))"),
            "ABI version 2",
        ),
        (
            "wide",
            model(65, 1, "(i32.const 0)", "(i32.const 0)", ""),
            "65 parameters",
        ),
        (
            "big-memory",
            model(1, 1, "(i32.const 0)", "(i32.const 0)", "").replace(
                "(memory (export \"memory\") 1)",
                "(memory (export \"memory\") 300)",
            ),
            "initial memory",
        ),
    ];
    for (id, wat, needle) in cases {
        let err = m.add(id, &wat).unwrap_err();
        assert!(err.contains(needle), "{id}: {err}");
        assert!(!m.models().join(id).join("model.cwasm").exists(), "{id}");
    }
}

#[test]
fn an_artifact_that_is_not_a_precompiled_model_does_not_load() {
    let m = Models::new();
    m.add("ramp", &model(1, 2, "(i32.const 0)", RAMP_STEP, ""))
        .unwrap();
    let artifact = m.models().join("ramp").join("model.cwasm");
    std::fs::write(&artifact, b"\0asm\x01\0\0\0").unwrap();
    let (out, _) = m.run("ramp", &[&[1.0]], 1.0, 1.0, 1000);
    assert_eq!(out.status.code(), Some(exit::LOAD_FAILED));
    assert!(Path::new(&artifact).exists());
}
