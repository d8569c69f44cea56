//! The built cell relay, driven as plimsolld drives it: its ready line, cells through the
//! project's real Python kernel (launched the way the launcher does: its own session, its
//! output on two FIFOs), a kernel that hangs up or never listens, refused files, protocol
//! breaks, and the process made non-dumpable before anything else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

const N: &str = "0123456789abcdef0123456789abcdef";
const M: &str = "fedcba9876543210fedcba9876543210";

/// A kernel directory with its two FIFOs, and a work directory.
struct Dirs {
    _root: tempfile::TempDir,
    kernel: PathBuf,
    work: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(root.path()).unwrap();
    let kernel = base.join("kernel");
    let work = base.join("work");
    std::fs::create_dir(&kernel).unwrap();
    std::fs::create_dir(&work).unwrap();
    for fifo in ["out", "err"] {
        let made = Command::new("mkfifo")
            .arg(kernel.join(fifo))
            .status()
            .unwrap();
        assert!(made.success());
    }
    Dirs {
        _root: root,
        kernel,
        work,
    }
}

struct Relay {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: BufReader<ChildStdout>,
}

impl Relay {
    fn start(dirs: &Dirs) -> Relay {
        Relay::start_as(dirs, None)
    }

    fn start_as(dirs: &Dirs, uid: Option<u32>) -> Relay {
        let mut command = Command::new(env!("CARGO_BIN_EXE_plimsoll-relay"));
        command
            .arg("cell")
            .arg(&dirs.kernel)
            .arg(&dirs.work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(uid) = uid {
            command.uid(uid);
        }
        let mut child = command.spawn().expect("the relay starts");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Relay {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{message}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn frame(&mut self) -> Value {
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not a frame: {line:?}"))
    }

    /// Reads a cell's frames to its `done`: stdout, stderr and the done frame.
    fn cell(&mut self, nonce: &str) -> (Vec<u8>, Vec<u8>, Value) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            let frame = self.frame();
            assert_eq!(frame["n"], nonce, "{frame}");
            let b64 = |v: &Value| {
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap()
            };
            if let Some(o) = frame.get("o") {
                out.extend(b64(o));
            } else if let Some(e) = frame.get("e") {
                err.extend(b64(e));
            } else {
                return (out, err, frame);
            }
        }
    }

    fn wait(&mut self) -> Option<i32> {
        drop(self.stdin.take());
        self.child.wait().unwrap().code()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The project's Python kernel in `dirs`, started as the launcher starts it.
struct Kernel(Child);

impl Kernel {
    fn start(dirs: &Dirs) -> Kernel {
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../plimsolld/src/provider/guest/cell/kernel.py");
        let kernel = std::fs::read_to_string(source).unwrap();
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dirs.kernel.join(name))
                .unwrap()
        };
        let child = Command::new("setsid")
            .args(["python3", "-I", "-c", &kernel])
            .arg(&dirs.kernel)
            .current_dir(&dirs.work)
            .stdin(Stdio::null())
            .stdout(open("out"))
            .stderr(open("err"))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !dirs.kernel.join("ready").exists() {
            assert!(Instant::now() < deadline, "the kernel did not get ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        Kernel(child)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn prepare(nonce: &str, files: Value) -> Value {
    json!({ "nonce": nonce, "files": files })
}

fn run(nonce: &str, code: &str, out_cap: usize, err_cap: usize) -> Value {
    json!({ "nonce": nonce, "code": code, "outCap": out_cap, "errCap": err_cap })
}

#[test]
fn the_relay_reports_its_own_identity_first() {
    let dirs = dirs();
    let mut relay = Relay::start(&dirs);
    let ready = relay.frame();
    let id = ready["ready"].as_str().unwrap().to_owned();
    let parts: Vec<&str> = id.splitn(3, ':').collect();
    assert_eq!(parts[0], relay.child.id().to_string());
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", parts[0])).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    assert_eq!(parts[1], fields[19]);
    let argv = [
        env!("CARGO_BIN_EXE_plimsoll-relay"),
        "cell",
        dirs.kernel.to_str().unwrap(),
        dirs.work.to_str().unwrap(),
    ];
    assert_eq!(parts[2], hex(argv.join("\0").as_bytes()));
    assert_eq!(relay.wait(), Some(0), "stdin's end ends it cleanly");
}

#[test]
fn cells_run_through_the_real_python_kernel_with_state_caps_and_errors() {
    let dirs = dirs();
    let _kernel = Kernel::start(&dirs);
    let mut relay = Relay::start(&dirs);
    relay.frame();

    relay.send(&prepare(
        N,
        json!([{ "path": "pkg/data.txt", "content": "from a file" }]),
    ));
    assert_eq!(relay.frame(), json!({ "n": N, "prepared": true }));
    let code =
        "x = 41\nprint(open('pkg/data.txt').read())\nimport sys; _w = sys.stderr.write('warn\\n')";
    relay.send(&run(N, code, 1000, 1000));
    let (out, err, done) = relay.cell(N);
    assert_eq!(String::from_utf8_lossy(&out), "from a file\n");
    assert_eq!(String::from_utf8_lossy(&err), "warn\n");
    assert_eq!(done, json!({ "n": N, "done": 0, "ot": false, "et": false }));

    // State carries over; output past the cap is cut and flagged, in 48 KiB pieces.
    relay.send(&prepare(M, json!([])));
    assert_eq!(relay.frame()["prepared"], true);
    relay.send(&run(M, "print('y' * 200000, end=''); x + 1", 100_000, 1000));
    let (out, _, done) = relay.cell(M);
    assert_eq!(out.len(), 100_000);
    assert!(out.iter().all(|b| *b == b'y'));
    assert_eq!(done["ot"], true);

    relay.send(&prepare(N, json!([])));
    relay.frame();
    relay.send(&run(N, "x + 1", 1000, 1000));
    let (out, _, done) = relay.cell(N);
    assert_eq!(String::from_utf8_lossy(&out), "42\n");
    assert_eq!(done["done"], 0);

    relay.send(&prepare(M, json!([])));
    relay.frame();
    relay.send(&run(M, "raise ValueError('boom')", 1000, 1000));
    let (_, err, done) = relay.cell(M);
    assert!(String::from_utf8_lossy(&err).contains("ValueError: boom"));
    assert_eq!(done["done"], 1);
    assert_eq!(relay.wait(), Some(0));
}

#[test]
fn a_kernel_that_dies_mid_cell_is_done_76_and_none_listening_is_done_75() {
    let dirs = dirs();
    let kernel = Kernel::start(&dirs);
    let mut relay = Relay::start(&dirs);
    relay.frame();
    relay.send(&prepare(N, json!([])));
    relay.frame();
    relay.send(&run(N, "import os; os._exit(9)", 1000, 1000));
    let (_, _, done) = relay.cell(N);
    assert_eq!(
        done,
        json!({ "n": N, "done": 76, "ot": false, "et": false })
    );
    drop(kernel);
    relay.send(&prepare(M, json!([])));
    assert_eq!(relay.frame(), json!({ "n": M, "done": 75 }));
    assert_eq!(relay.wait(), Some(0));
}

#[test]
fn a_planted_link_refuses_the_file_by_name_and_nothing_runs() {
    let dirs = dirs();
    std::os::unix::fs::symlink("/etc", dirs.work.join("etc")).unwrap();
    let mut relay = Relay::start(&dirs);
    relay.frame();
    let files = json!([
        { "path": "fine.txt", "content": "ok" },
        { "path": "etc/passwd", "content": "owned" },
    ]);
    relay.send(&prepare(N, files));
    assert_eq!(
        relay.frame(),
        json!({ "n": N, "done": 3, "file": 1, "errno": "ELOOP" })
    );
    assert_eq!(
        std::fs::read_to_string(dirs.work.join("fine.txt")).unwrap(),
        "ok"
    );
    assert_eq!(relay.wait(), Some(0));
}

#[test]
fn a_message_it_cannot_accept_ends_it_with_2() {
    for bad in [
        "not json".to_owned(),
        json!({ "nonce": "short", "files": [] }).to_string(),
        run(N, "1", 1, 1).to_string(),
        json!({ "hello": 1 }).to_string(),
    ] {
        let dirs = dirs();
        let mut relay = Relay::start(&dirs);
        relay.frame();
        let stdin = relay.stdin.as_mut().unwrap();
        stdin.write_all(format!("{bad}\n").as_bytes()).unwrap();
        let status = relay.child.wait().unwrap();
        assert_eq!(status.code(), Some(2), "{bad}");
    }
}

#[test]
fn the_relay_is_non_dumpable_from_its_first_line() {
    // The kernel shows a non-dumpable process's /proc files as root's. Run by root, the relay
    // runs as another uid so that the owner tells.
    let root_runs = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"));
    let dirs = dirs();
    let base = dirs.kernel.parent().unwrap();
    let opened = Command::new("chmod")
        .arg("-R")
        .arg("a+rwx")
        .arg(base)
        .status()
        .unwrap();
    assert!(opened.success());
    let mut relay = Relay::start_as(&dirs, root_runs.then_some(65534));
    relay.frame();
    let pid = relay.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        !status.lines().any(|l| l.starts_with("Uid:\t0\t")),
        "{status}"
    );
    let meta = std::fs::metadata(format!("/proc/{pid}/fd")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0, "{status}");
    assert_eq!(relay.wait(), Some(0));
}
