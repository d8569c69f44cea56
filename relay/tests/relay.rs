//! The built relay, driven as plimsolld drives it: the words it prints, the pairing of a
//! guest with a dial, bytes both ways with half-closes, and its end when stdin closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

struct Relay {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: BufReader<ChildStdout>,
    port: u16,
}

impl Relay {
    fn start(socket: &Path) -> Relay {
        // A port the OS just handed out (and took back): free unless another test races.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_plimsoll-relay"))
            .arg(port.to_string())
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the relay starts");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Relay {
            child,
            stdin,
            lines,
            port,
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("a line");
        line
    }

    fn dial(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("the up side accepts");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn guest(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("the down side accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn a_guest_and_a_dial_are_joined_and_bytes_pass_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("host.sock");
    let mut relay = Relay::start(&socket);
    assert_eq!(relay.line(), "ready\n");

    // A guest first: the relay says it needs a dial; the dial then carries its bytes.
    let mut g = guest(&socket);
    assert_eq!(relay.line(), "need\n");
    let mut d = relay.dial();
    g.write_all(b"GET /items/7 HTTP/1.1\r\n\r\n").unwrap();
    g.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    d.read_to_end(&mut got).unwrap();
    assert_eq!(
        got, b"GET /items/7 HTTP/1.1\r\n\r\n",
        "the guest's half-close reached the dial"
    );
    d.write_all(b"HTTP/1.1 200 OK\r\n\r\n{}").unwrap();
    d.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    g.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"HTTP/1.1 200 OK\r\n\r\n{}");

    // A dial first parks; the next guest takes it without a `need`.
    let mut d2 = relay.dial();
    std::thread::sleep(Duration::from_millis(200));
    let mut g2 = guest(&socket);
    g2.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    d2.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"x");

    // A third guest needs again.
    let _g3 = guest(&socket);
    assert_eq!(relay.line(), "need\n");

    // End of stdin ends the relay, and it takes its socket with it.
    drop(relay.stdin.take());
    let status = relay.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists());
}

#[test]
fn an_existing_socket_path_is_never_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("planted");
    std::fs::write(&socket, b"").unwrap();
    let mut relay = Relay::start(&socket);
    let status = relay.child.wait().unwrap();
    assert_eq!(status.code(), Some(relay::protocol::EXIT_CANNOT_LISTEN));
    assert_eq!(relay.line(), "", "nothing printed, no ready");
}

#[test]
fn a_bad_command_line_is_refused_with_the_usage_status() {
    let status = Command::new(env!("CARGO_BIN_EXE_plimsoll-relay"))
        .arg("not-a-port")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(relay::protocol::EXIT_USAGE));
}
