#![allow(clippy::unwrap_used)]

use super::*;

const N: &str = "0123456789abcdef0123456789abcdef";
const M: &str = "fedcba9876543210fedcba9876543210";

fn fresh() -> (tempfile::TempDir, Relay) {
    let dir = tempfile::tempdir().unwrap();
    let work = std::fs::canonicalize(dir.path()).unwrap();
    let work = work.to_str().unwrap().to_owned();
    (dir, Relay::new(work))
}

fn line(relay: &mut Relay, text: &str) -> Vec<Effect> {
    let mut effects = Vec::new();
    relay.on_line(text.as_bytes(), &mut effects);
    effects
}

fn prepare(nonce: &str) -> String {
    format!(r#"{{"nonce":"{nonce}","files":[]}}"#)
}

fn run(nonce: &str, out_cap: usize, err_cap: usize) -> String {
    format!(r#"{{"nonce":"{nonce}","code":"x","outCap":{out_cap},"errCap":{err_cap}}}"#)
}

fn marked(nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!("\0plimsoll-cell-start-{nonce}\0").into_bytes();
    bytes.extend_from_slice(body);
    bytes.extend(format!("\0plimsoll-cell-end-{nonce}\0").into_bytes());
    bytes
}

fn sent(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send(line) => Some(line.clone()),
            _ => None,
        })
        .collect()
}

/// Prepares and runs cell `nonce` up to the code being sent; returns its generation.
fn started(relay: &mut Relay, nonce: &str, out_cap: usize, err_cap: usize) -> u64 {
    let effects = line(relay, &prepare(nonce));
    let [Effect::Connect { generation }] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let generation = *generation;
    let mut effects = Vec::new();
    relay.on_connected(generation, &mut effects);
    assert_eq!(
        sent(&effects),
        [format!(r#"{{"n":"{nonce}","prepared":true}}"#)]
    );
    let effects = line(relay, &run(nonce, out_cap, err_cap));
    let [Effect::WriteCtl(request)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert!(request.starts_with(format!(r#"{{"nonce":"{nonce}","code":"x"}}"#).as_bytes()));
    generation
}

#[test]
fn a_cell_ends_once_the_status_and_both_end_markers_are_in() {
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, 100, 100);
    let mut effects = Vec::new();
    relay.on_output(StreamKey::Out, &marked(N, b"hi"), &mut effects);
    relay.on_ctl_data(generation, b"{\"status\":\"ok\"}\n", &mut effects);
    relay.on_output(StreamKey::Err, &marked(N, b""), &mut effects);
    assert_eq!(
        sent(&effects),
        [
            format!(r#"{{"n":"{N}","o":"aGk="}}"#),
            format!(r#"{{"n":"{N}","done":0,"ot":false,"et":false}}"#),
        ]
    );
    assert!(effects.contains(&Effect::Timer {
        generation,
        after: MARKER_GRACE
    }));
    assert_eq!(effects.last(), Some(&Effect::CloseCtl));
    // The cell's late timer and socket end change nothing; a new cell may begin.
    let mut late = Vec::new();
    relay.on_timer(generation, &mut late);
    relay.on_ctl_gone(generation, &mut late);
    assert!(late.is_empty());
    assert!(matches!(
        line(&mut relay, &prepare(M)).as_slice(),
        [Effect::Connect { .. }]
    ));
}

#[test]
fn an_error_status_is_done_1_and_a_missing_marker_waits_for_the_grace() {
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, 100, 100);
    let mut effects = Vec::new();
    relay.on_ctl_data(generation, b"{\"status\":", &mut effects);
    relay.on_ctl_data(generation, b"\"error\"}\n", &mut effects);
    let mut start_only = format!("\0plimsoll-cell-start-{N}\0").into_bytes();
    start_only.extend(b"partial\0plim");
    relay.on_output(StreamKey::Err, &start_only, &mut effects);
    assert_eq!(
        sent(&effects),
        [format!(r#"{{"n":"{N}","e":"cGFydGlhbA=="}}"#)]
    );
    let mut effects = Vec::new();
    relay.on_timer(generation, &mut effects);
    assert_eq!(
        sent(&effects),
        [
            format!(r#"{{"n":"{N}","e":"AHBsaW0="}}"#),
            format!(r#"{{"n":"{N}","done":1,"ot":false,"et":false}}"#),
        ]
    );
}

#[test]
fn an_interpreter_that_hangs_up_mid_cell_is_done_76_after_the_grace() {
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, 100, 100);
    let mut effects = Vec::new();
    relay.on_ctl_gone(generation, &mut effects);
    assert_eq!(
        effects,
        [Effect::Timer {
            generation,
            after: GONE_GRACE
        }]
    );
    // A status after the hang-up is not read.
    let mut effects = Vec::new();
    relay.on_ctl_data(generation, b"{\"status\":\"ok\"}\n", &mut effects);
    relay.on_timer(generation, &mut effects);
    assert_eq!(
        sent(&effects),
        [format!(r#"{{"n":"{N}","done":76,"ot":false,"et":false}}"#)]
    );
}

#[test]
fn no_listening_interpreter_is_done_75_and_nothing_runs() {
    let (_dir, mut relay) = fresh();
    let effects = line(&mut relay, &prepare(N));
    let [Effect::Connect { generation }] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let mut effects = Vec::new();
    relay.on_ctl_gone(*generation, &mut effects);
    assert_eq!(sent(&effects), [format!(r#"{{"n":"{N}","done":75}}"#)]);
    // The daemon relaunches rather than run; a run now breaks the protocol.
    assert!(matches!(
        line(&mut relay, &run(N, 1, 1)).as_slice(),
        [Effect::Fail(_)]
    ));
}

#[test]
fn a_refused_file_names_its_index_and_errno_and_connects_nothing() {
    let (_dir, mut relay) = fresh();
    let text = format!(
        r#"{{"nonce":"{N}","files":[{{"path":"ok.txt","content":"a"}},{{"path":"../x","content":""}}]}}"#
    );
    assert_eq!(
        line(&mut relay, &text),
        [Effect::Send(format!(
            r#"{{"n":"{N}","done":3,"file":1,"errno":"EPERM"}}"#
        ))]
    );
    // No cell began: the next prepare is accepted.
    assert!(matches!(
        line(&mut relay, &prepare(N)).as_slice(),
        [Effect::Connect { .. }]
    ));
}

#[test]
fn output_is_capped_split_into_pieces_and_flagged() {
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, PIECE * 2 + 5, 3);
    let mut effects = Vec::new();
    let big = vec![b'a'; PIECE * 3];
    relay.on_output(StreamKey::Out, &marked(N, &big), &mut effects);
    relay.on_output(StreamKey::Err, &marked(N, b"abcdef"), &mut effects);
    relay.on_ctl_data(generation, b"{\"status\":\"ok\"}\n", &mut effects);
    let lines = sent(&effects);
    assert_eq!(lines.len(), 5, "three stdout pieces, one stderr, done");
    let sizes: Vec<usize> = lines[..3]
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let text = v["o"].as_str().unwrap();
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, text)
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, [PIECE, PIECE, 5]);
    assert_eq!(lines[3], format!(r#"{{"n":"{N}","e":"YWJj"}}"#));
    assert_eq!(
        lines[4],
        format!(r#"{{"n":"{N}","done":0,"ot":true,"et":true}}"#)
    );
}

#[test]
fn output_between_cells_and_before_the_code_is_dropped() {
    let (_dir, mut relay) = fresh();
    let mut effects = Vec::new();
    relay.on_output(StreamKey::Out, &marked(N, b"early"), &mut effects);
    line(&mut relay, &prepare(N));
    relay.on_output(StreamKey::Out, &marked(N, b"before run"), &mut effects);
    assert!(effects.is_empty());
}

#[test]
fn protocol_breaks_end_the_relay() {
    let (_dir, mut relay) = fresh();
    assert!(matches!(
        line(&mut relay, "not json").as_slice(),
        [Effect::Fail(_)]
    ));
    assert!(matches!(
        line(&mut relay, &run(N, 1, 1)).as_slice(),
        [Effect::Fail(_)]
    ));
    let generation = started(&mut relay, N, 1, 1);
    assert!(matches!(
        line(&mut relay, &prepare(M)).as_slice(),
        [Effect::Fail(_)]
    ));
    assert!(matches!(
        line(&mut relay, &run(N, 1, 1)).as_slice(),
        [Effect::Fail(_)]
    ));
    let _ = generation;
    let (_dir, mut other) = fresh();
    line(&mut other, &prepare(N));
    assert!(matches!(
        line(&mut other, &run(M, 1, 1)).as_slice(),
        [Effect::Fail(_)]
    ));
}

#[test]
fn a_first_reply_line_that_is_not_a_status_is_ignored() {
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, 1, 1);
    let mut effects = Vec::new();
    relay.on_ctl_data(
        generation,
        b"{\"status\":\"maybe\"}\n{\"status\":\"ok\"}\n",
        &mut effects,
    );
    relay.on_output(StreamKey::Out, &marked(N, b""), &mut effects);
    relay.on_output(StreamKey::Err, &marked(N, b""), &mut effects);
    assert!(sent(&effects).is_empty());
    relay.on_ctl_gone(generation, &mut effects);
    relay.on_timer(generation, &mut effects);
    assert_eq!(
        sent(&effects),
        [format!(r#"{{"n":"{N}","done":76,"ot":false,"et":false}}"#)]
    );
}

#[test]
fn markers_that_arrive_after_a_hang_up_settle_the_cell_as_raised() {
    // As the Node relay did: a cell whose interpreter hung up without a status but whose
    // output ended properly is done 1, before the grace runs out.
    let (_dir, mut relay) = fresh();
    let generation = started(&mut relay, N, 10, 10);
    let mut effects = Vec::new();
    relay.on_ctl_gone(generation, &mut effects);
    relay.on_output(StreamKey::Out, &marked(N, b"o"), &mut effects);
    relay.on_output(StreamKey::Err, &marked(N, b""), &mut effects);
    assert_eq!(
        sent(&effects),
        [
            format!(r#"{{"n":"{N}","o":"bw=="}}"#),
            format!(r#"{{"n":"{N}","done":1,"ot":false,"et":false}}"#)
        ]
    );
}
