//! Issue 12, part 5: another local user (uid 65534, through `setpriv`) goes after the live
//! run and session sockets of a daemon's broker while the guest uses them.
//!
//! The attacker is handed more than it could find: the exact path of every live socket,
//! read by the test as root. It must not be able to list the broker's directory, and no
//! connection it makes to any of those sockets may get an answer, while the guest's own
//! calls keep working and root (an admitted peer) still gets one from the same socket.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::docker::{docker_ready, runsc, tier};
use serde_json::json;

use crate::{Fixture, borrowed, eventually, guest_sockets, run_request, stdout};

/// The attacker: a host uid that is neither root, the broker's nor the guests'.
const NOBODY: &str = "65534";
/// A docker daemon's proof takes longer than the harness's default wait.
const DOCKER_START: Duration = Duration::from_secs(120);

/// `cmd` run as uid and gid [`NOBODY`] with no supplementary groups: its exit code and
/// stdout.
fn as_nobody(cmd: &[&str]) -> (i32, String) {
    let out = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .args(cmd)
        .output()
        .expect("setpriv (util-linux) runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A `GET /items/7` over the Unix socket `socket` with curl, run as `uid` (`None`: as the
/// test, root): curl's exit code and what it printed (the status, then the body). A
/// connection that gets no answer prints status `000`.
fn curl(uid: Option<&str>, socket: &Path) -> (i32, String) {
    let socket = socket.to_str().expect("UTF-8 socket path");
    let args = [
        "curl",
        "-sS",
        "--max-time",
        "5",
        "--unix-socket",
        socket,
        "-w",
        "%{http_code}\n",
        "http://host-api/items/7",
    ];
    match uid {
        Some(_) => as_nobody(&args),
        None => {
            let out = Command::new(args[0])
                .args(&args[1..])
                .output()
                .expect("curl runs");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    }
}

/// The attack on every live socket under `tmp`: no connection to a socket gets a byte of
/// an answer, no socket's directory can be listed, and no socket's name can be guessed.
/// Returns how many sockets were tried.
fn attack(tmp: &Path) -> usize {
    // The attacker really is that uid (the test must run as root to become it).
    let (code, uid) = as_nobody(&["id", "-u"]);
    assert_eq!(
        (code, uid.trim()),
        (0, NOBODY),
        "setpriv could not become uid {NOBODY}"
    );
    let sockets = guest_sockets(tmp);
    for socket in &sockets {
        let (code, out) = curl(Some(NOBODY), socket);
        assert!(
            code != 0 && out.trim() == "000",
            "uid {NOBODY} got an answer from {} (curl exit {code}): {out:?}",
            socket.display()
        );
        let dir = socket
            .parent()
            .and_then(Path::to_str)
            .expect("UTF-8 directory");
        let (code, listing) = as_nobody(&["ls", "-A", dir]);
        assert!(
            code != 0 && listing.is_empty(),
            "uid {NOBODY} listed the socket directory {dir}: {listing:?}"
        );
        let name = socket.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(
            name.len() == 32 + ".sock".len() && name[..32].bytes().all(|b| b.is_ascii_hexdigit()),
            "a guessable socket name: {}",
            socket.display()
        );
    }
    sockets.len()
}

/// With the wasm provider (the run socket is dialled by plimsolld's host functions), a live
/// run's socket answers nobody but its admitted peers.
///
/// This is a regression test: it fails on main before the fix and passes after. On main
/// (6b3c389) each run socket was `host-api.sock`, mode 0666, in a `crsbx-broker*` directory
/// of its own, and uid 65534's curl got the API's answer (`{"id":7}`, 200), sent with the
/// run's JWT.
#[test]
fn another_uid_gets_no_answer_from_a_live_wasm_run_socket() {
    let f = Fixture::start();
    f.seed_wasm_cache();
    let env = f.env(&[("SANDBOX_PROVIDER", "wasm")]);
    let d = Daemon::start(&borrowed(&env));
    let dir = f.tmp.path().to_owned();
    // The run waits (busy: the guest has no timer) before its own call, while the
    // attacker goes at its socket.
    let code = "const t = Date.now(); while (Date.now() - t < 4000) {}\n\
                console.log((await host.get('/items/7')).id);";
    let addr = d.addr;
    let token = f.alice.clone();
    let guest = std::thread::spawn(move || run_request(&token, code, "inv", "", 20_000).send(addr));
    eventually("the run's socket", Duration::from_secs(10), || {
        !guest_sockets(&dir).is_empty()
    });
    assert_eq!(attack(&dir), 1, "one live run socket");
    let resp = guest.join().expect("the guest's run");
    assert_eq!(stdout(&resp).as_deref(), Some("7\n"), "{resp}");
    // The API saw the guest's call alone.
    assert_eq!(f.api.requests().len(), 1, "{:?}", f.api.requests());
    eventually("the run's socket removed", Duration::from_secs(5), || {
        guest_sockets(&dir).is_empty()
    });
}

/// With docker (runc, or runsc with `PLIMSOLL_TEST_DOCKER_RUNTIME=runsc`), neither a live
/// run's socket nor a session's answers another host uid, while the guests' calls work
/// and root, an admitted peer, gets the session socket's answer.
///
/// This is a regression test: it fails on main before the fix and passes after. On main
/// (6b3c389) run and session sockets were `host-api.sock`, mode 0666, in `crsbx-*`
/// directories of their own, and uid 65534's curl got the session socket's answer (503).
#[test]
fn another_uid_gets_no_answer_from_live_docker_run_and_session_sockets() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let mut extra = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_MAX_SESSIONS", "2"),
    ];
    if runsc() {
        extra.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    let env = f.env(&extra);
    let d = Daemon::start_within(&borrowed(&env), DOCKER_START);
    assert_eq!(d.listening["isolation"], tier(), "{}", d.listening);
    let dir = f.tmp.path().to_owned();

    // A session: its socket lives as long as it does.
    let open = json!({ "protocol": connect::PROTOCOL });
    let resp = connect::call_as(&f.alice, "OpenSession", &open).send(d.addr);
    assert_eq!(resp.status, 200, "open: {resp}");
    let session = resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    eventually("the session's socket", Duration::from_secs(10), || {
        guest_sockets(&dir).len() == 1
    });

    // A granted run that waits before its call, while the attacker goes at both sockets.
    let code = "(async () => {\n\
                await new Promise((r) => setTimeout(r, 5000));\n\
                console.log((await host.get('/items/7')).id);\n\
                })().catch((e) => { console.error(String(e)); process.exit(3); });";
    let addr = d.addr;
    let token = f.alice.clone();
    let guest = std::thread::spawn(move || run_request(&token, code, "inv", "", 30_000).send(addr));
    eventually("the run's socket", Duration::from_secs(30), || {
        guest_sockets(&dir).len() == 2
    });
    assert_eq!(attack(&dir), 2, "one run socket and one session socket");
    let resp = guest.join().expect("the guest's run");
    assert_eq!(stdout(&resp).as_deref(), Some("7\n"), "{resp}");
    assert_eq!(f.api.requests().len(), 1, "{:?}", f.api.requests());

    // The session's socket still answers an admitted peer (nothing is lent: 503), so the
    // attacker's silence is the peer check, not a dead socket.
    let left = guest_sockets(&dir);
    assert_eq!(left.len(), 1, "the run's socket went: {left:?}");
    let (code, out) = curl(None, &left[0]);
    assert!(
        code == 0 && out.trim_end().ends_with("503"),
        "root's call on the session socket: exit {code}, {out:?}"
    );
    let close = json!({ "protocol": connect::PROTOCOL, "sessionId": session });
    let resp = connect::call_as(&f.alice, "CloseSession", &close).send(d.addr);
    assert_eq!(resp.status, 200, "close: {resp}");
    eventually(
        "the session's socket removed",
        Duration::from_secs(10),
        || guest_sockets(&dir).is_empty(),
    );
}
