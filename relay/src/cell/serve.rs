//! The cell relay's I/O: one thread runs the event loop (the FIFOs, the control socket and
//! the timer), one more only reads stdin, which may be a pipe that cannot be polled.
//! Every event goes through [`Relay`] and its effects are carried out here, in order.

use std::collections::VecDeque;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::identity;
use super::message::{Frame, StreamKey};
use super::relay::{Effect, Relay};
use crate::args::CellArgs;

/// How much one read of a FIFO or the control socket takes.
const READ_SIZE: usize = 64 * 1024;
/// Lines from stdin read ahead of the loop.
const LINES_AHEAD: usize = 4;

/// Why the cell relay ended other than by stdin's end. Each ends it with exit 2.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    #[error("{name}: {source}")]
    Fifo {
        name: &'static str,
        source: io::Error,
    },
    #[error("cannot read its own identity: {0}")]
    Identity(io::Error),
    #[error("cannot write to stdout: {0}")]
    Stdout(io::Error),
    /// The daemon broke the protocol.
    #[error("{0}")]
    Protocol(String),
}

/// The control socket of one cell, read and written apart.
struct Ctl {
    generation: u64,
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    /// Bytes not yet taken by the interpreter (its code can be larger than the socket's
    /// buffer, and the loop must keep draining the FIFOs meanwhile).
    unsent: Vec<u8>,
}

/// One thing that happened.
enum Event {
    Line(Option<Vec<u8>>),
    Output(StreamKey, io::Result<usize>),
    CtlRead(u64, io::Result<usize>),
    CtlWrote(u64, io::Result<usize>),
    Timer(u64),
}

/// Serves until stdin ends (`Ok`) or the relay must end (`Err`: exit 2).
pub async fn serve(args: CellArgs) -> Result<(), CellError> {
    let mut out = open_fifo(&args.kernel_dir, "out")?;
    let mut err = open_fifo(&args.kernel_dir, "err")?;
    let ready = identity::of_self().map_err(CellError::Identity)?;
    send(&Frame::Ready(&ready).line())?;
    let mut lines = read_stdin();
    let socket_path = args.kernel_dir.join("ctl.sock");
    let mut relay = Relay::new(args.work);
    let mut ctl: Option<Ctl> = None;
    let mut timer: Option<(Instant, u64)> = None;
    let mut out_buf = vec![0u8; READ_SIZE];
    let mut err_buf = vec![0u8; READ_SIZE];
    let mut ctl_buf = vec![0u8; READ_SIZE];
    let mut effects = Vec::new();
    loop {
        let event = tokio::select! {
            line = lines.recv() => Event::Line(line),
            read = out.read(&mut out_buf) => Event::Output(StreamKey::Out, read),
            read = err.read(&mut err_buf) => Event::Output(StreamKey::Err, read),
            event = ctl_event(&mut ctl, &mut ctl_buf) => event,
            generation = expire(timer) => Event::Timer(generation),
        };
        match event {
            Event::Line(None) => return Ok(()),
            Event::Line(Some(line)) => relay.on_line(&line, &mut effects),
            Event::Output(key, Ok(0)) => {
                // Never while the relay holds the FIFO open for writing too.
                let name = if key == StreamKey::Out { "out" } else { "err" };
                let source = io::ErrorKind::UnexpectedEof.into();
                return Err(CellError::Fifo { name, source });
            }
            Event::Output(key, Ok(n)) => {
                let buf = if key == StreamKey::Out {
                    &out_buf
                } else {
                    &err_buf
                };
                relay.on_output(key, &buf[..n], &mut effects);
            }
            Event::Output(key, Err(source)) => {
                let name = if key == StreamKey::Out { "out" } else { "err" };
                return Err(CellError::Fifo { name, source });
            }
            Event::CtlRead(generation, Ok(n)) if n > 0 => {
                relay.on_ctl_data(generation, &ctl_buf[..n], &mut effects);
            }
            Event::CtlRead(generation, _) | Event::CtlWrote(generation, Err(_)) => {
                ctl = None;
                relay.on_ctl_gone(generation, &mut effects);
            }
            Event::CtlWrote(_, Ok(n)) => {
                if let Some(c) = ctl.as_mut() {
                    c.unsent.drain(..n.min(c.unsent.len()));
                }
            }
            Event::Timer(generation) => {
                timer = None;
                relay.on_timer(generation, &mut effects);
            }
        }
        apply(&mut effects, &mut relay, &mut ctl, &mut timer, &socket_path).await?;
    }
}

/// Carries out `effects` in order, and those they lead to after them.
async fn apply(
    effects: &mut Vec<Effect>,
    relay: &mut Relay,
    ctl: &mut Option<Ctl>,
    timer: &mut Option<(Instant, u64)>,
    socket_path: &Path,
) -> Result<(), CellError> {
    let mut queue: VecDeque<Effect> = effects.drain(..).collect();
    while let Some(effect) = queue.pop_front() {
        match effect {
            Effect::Send(line) => send(&line)?,
            Effect::Fail(why) => return Err(CellError::Protocol(why)),
            Effect::Connect { generation } => {
                // A Unix socket connects at once or not at all: nothing is left waiting.
                match UnixStream::connect(socket_path).await {
                    Ok(stream) => {
                        let (read, write) = stream.into_split();
                        *ctl = Some(Ctl {
                            generation,
                            read,
                            write,
                            unsent: Vec::new(),
                        });
                        relay.on_connected(generation, effects);
                    }
                    Err(_) => relay.on_ctl_gone(generation, effects),
                }
                queue.extend(effects.drain(..));
            }
            Effect::WriteCtl(bytes) => {
                if let Some(c) = ctl.as_mut() {
                    c.unsent.extend_from_slice(&bytes);
                }
            }
            Effect::CloseCtl => *ctl = None,
            Effect::Timer { generation, after } => {
                *timer = Some((Instant::now() + after, generation));
            }
        }
    }
    Ok(())
}

/// Opens a kernel FIFO read-write: the open never blocks and the read never sees end-of-file
/// between interpreters.
fn open_fifo(dir: &Path, name: &'static str) -> Result<pipe::Receiver, CellError> {
    let path: PathBuf = dir.join(name);
    pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
        .map_err(|source| CellError::Fifo { name, source })
}

/// The control socket's next read, or its next write while bytes wait to go out.
async fn ctl_event(ctl: &mut Option<Ctl>, buf: &mut [u8]) -> Event {
    let Some(c) = ctl else {
        return std::future::pending().await;
    };
    let generation = c.generation;
    if c.unsent.is_empty() {
        return Event::CtlRead(generation, c.read.read(buf).await);
    }
    tokio::select! {
        read = c.read.read(buf) => Event::CtlRead(generation, read),
        wrote = c.write.write(&c.unsent) => Event::CtlWrote(generation, wrote),
    }
}

async fn expire(timer: Option<(Instant, u64)>) -> u64 {
    match timer {
        Some((at, generation)) => {
            tokio::time::sleep_until(at).await;
            generation
        }
        None => std::future::pending().await,
    }
}

/// Prints one frame line. A blocking write, as Node's to a pipe was: while the daemon does
/// not read, the relay waits (and the interpreter with it, once its FIFO is full).
fn send(line: &str) -> Result<(), CellError> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    let mut stdout = io::stdout().lock();
    let mut rest: &[u8] = &bytes;
    while !rest.is_empty() {
        match stdout.write(rest) {
            Ok(0) => return Err(CellError::Stdout(io::ErrorKind::WriteZero.into())),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // An exec agent may hand over a non-blocking pipe.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(CellError::Stdout(e)),
        }
    }
    stdout.flush().map_err(CellError::Stdout)
}

/// Reads stdin's lines on their own thread; the channel closes at its end (a last line
/// without a newline is dropped, as the Node relay dropped it).
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(LINES_AHEAD);
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        // Kept across a would-block: what was read before it belongs to the line.
        let mut line = Vec::new();
        loop {
            match stdin.read_until(b'\n', &mut line) {
                Ok(_) if line.last() == Some(&b'\n') => {
                    line.pop();
                    if tx.blocking_send(std::mem::take(&mut line)).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                // The end (or a broken stdin): the daemon is done with this relay.
                _ => return,
            }
        }
    });
    rx
}
