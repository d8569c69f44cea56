//! The cell relay's decisions, apart from its I/O: each event (a line from the daemon, a read
//! from a FIFO, the control socket's reply or end, a timer) goes in, and what the relay must
//! do comes out as [`Effect`]s, in order. [`super::serve`] carries them out.
//!
//! A cell goes: prepare (files written, then the control socket connected: `prepared`, or
//! `done 75` when nobody listens), run (the code sent), then `done` once the interpreter's
//! status and both end markers are in (0 ok, 1 error), [`MARKER_GRACE`] after the status when
//! the code made a marker impossible, or [`GONE_GRACE`] after the interpreter hung up without a
//! status (76). Each cell has a generation, so a late event of an earlier cell (its socket's
//! end, its timer) changes nothing.

use std::time::Duration;

use super::files;
use super::message::{self, FileSpec, Frame, Message, PIECE, StreamKey};
use super::stream::{Markers, Stream};

/// After the status, how long to wait for end markers the code may have made impossible.
pub const MARKER_GRACE: Duration = Duration::from_millis(2000);
/// After the interpreter hung up without a status, how long the FIFOs may still deliver.
pub const GONE_GRACE: Duration = Duration::from_millis(200);
/// The most bytes of the interpreter's reply kept while its first line is awaited (the
/// line is `{"status":"ok"}`; more is the session's noise).
const REPLY_CAP: usize = 4096;

/// What the relay must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Print this line (a newline follows).
    Send(String),
    /// Connect to the control socket for cell `generation`, then report
    /// [`Relay::on_connected`] or [`Relay::on_ctl_gone`].
    Connect { generation: u64 },
    /// Write these bytes to the control socket.
    WriteCtl(Vec<u8>),
    /// Close the control socket.
    CloseCtl,
    /// Report [`Relay::on_timer`] for cell `generation` after this long.
    Timer { generation: u64, after: Duration },
    /// End the relay (exit 2): the daemon then treats the interpreter as lost.
    Fail(String),
}

/// What the interpreter said (or did) about the current cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Error,
    Gone,
}

/// The cell in progress.
#[derive(Debug)]
struct Cell {
    generation: u64,
    nonce: String,
    code_sent: bool,
    status: Option<Status>,
    markers: Markers,
    out: Stream,
    err: Stream,
    reply: Vec<u8>,
}

/// The relay's state: at most one cell.
#[derive(Debug)]
pub struct Relay {
    work: String,
    cell: Option<Cell>,
    generations: u64,
}

impl Relay {
    /// A relay whose cells' files land under `work`.
    pub fn new(work: String) -> Relay {
        Relay {
            work,
            cell: None,
            generations: 0,
        }
    }

    /// One line from the daemon (without its newline).
    pub fn on_line(&mut self, line: &[u8], effects: &mut Vec<Effect>) {
        match Message::parse(line) {
            Ok(Message::Prepare { nonce, files }) => self.prepare(nonce, &files, effects),
            Ok(Message::Run {
                nonce,
                code,
                out_cap,
                err_cap,
            }) => self.run(&nonce, &code, out_cap, err_cap, effects),
            Err(e) => effects.push(Effect::Fail(e.to_string())),
        }
    }

    fn prepare(&mut self, nonce: String, files: &[FileSpec], effects: &mut Vec<Effect>) {
        if self.cell.is_some() {
            effects.push(Effect::Fail("prepare during a cell".to_owned()));
            return;
        }
        for (index, file) in files.iter().enumerate() {
            if let Err(errno) = files::write(&self.work, file) {
                let n = &nonce;
                let refused = Frame::FileRefused {
                    n,
                    file: index,
                    errno: &errno,
                };
                effects.push(Effect::Send(refused.line()));
                return;
            }
        }
        self.generations += 1;
        let generation = self.generations;
        self.cell = Some(Cell {
            generation,
            markers: Markers::new(&nonce),
            nonce,
            code_sent: false,
            status: None,
            out: Stream::new(0),
            err: Stream::new(0),
            reply: Vec::new(),
        });
        effects.push(Effect::Connect { generation });
    }

    fn run(
        &mut self,
        nonce: &str,
        code: &str,
        out_cap: usize,
        err_cap: usize,
        effects: &mut Vec<Effect>,
    ) {
        let Some(cell) = self
            .cell
            .as_mut()
            .filter(|c| !c.code_sent && c.nonce == nonce)
        else {
            effects.push(Effect::Fail("run without its prepare".to_owned()));
            return;
        };
        cell.code_sent = true;
        cell.out = Stream::new(out_cap);
        cell.err = Stream::new(err_cap);
        effects.push(Effect::WriteCtl(message::kernel_request(nonce, code)));
    }

    /// The control socket of cell `generation` connected.
    pub fn on_connected(&mut self, generation: u64, effects: &mut Vec<Effect>) {
        if let Some(cell) = self.current(generation) {
            let n = &cell.nonce;
            effects.push(Effect::Send(Frame::Prepared { n }.line()));
        }
    }

    /// Bytes from cell `generation`'s control socket.
    pub fn on_ctl_data(&mut self, generation: u64, bytes: &[u8], effects: &mut Vec<Effect>) {
        let Some(cell) = self.current_mut(generation) else {
            return;
        };
        if cell.status.is_some() {
            return;
        }
        let room = REPLY_CAP.saturating_sub(cell.reply.len());
        cell.reply
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        let Some(newline) = cell.reply.iter().position(|b| *b == b'\n') else {
            return;
        };
        let status = match message::kernel_status(&cell.reply[..newline]) {
            Some(true) => Status::Ok,
            Some(false) => Status::Error,
            // Anything else on the first line: wait for the socket's end or the deadline.
            None => return,
        };
        cell.status = Some(status);
        effects.push(Effect::Timer {
            generation,
            after: MARKER_GRACE,
        });
        self.settle(effects);
    }

    /// Cell `generation`'s control socket ended (refused, closed or broken).
    pub fn on_ctl_gone(&mut self, generation: u64, effects: &mut Vec<Effect>) {
        let Some(cell) = self.current_mut(generation) else {
            return;
        };
        if !cell.code_sent {
            let nonce = cell.nonce.clone();
            self.cell = None;
            let n = &nonce;
            effects.push(Effect::Send(Frame::NoInterpreter { n }.line()));
            effects.push(Effect::CloseCtl);
        } else if cell.status.is_none() {
            cell.status = Some(Status::Gone);
            effects.push(Effect::Timer {
                generation,
                after: GONE_GRACE,
            });
        }
    }

    /// Cell `generation`'s timer fired.
    pub fn on_timer(&mut self, generation: u64, effects: &mut Vec<Effect>) {
        let Some(cell) = self.current(generation) else {
            return;
        };
        let done = match cell.status {
            Some(Status::Ok) => 0,
            Some(Status::Gone) => 76,
            Some(Status::Error) | None => 1,
        };
        self.finish(done, effects);
    }

    /// Bytes read from one of the interpreter's FIFOs.
    pub fn on_output(&mut self, key: StreamKey, bytes: &[u8], effects: &mut Vec<Effect>) {
        // Between cells, and before the code is sent, output is drained and dropped.
        let Some(cell) = self.cell.as_mut().filter(|c| c.code_sent) else {
            return;
        };
        let stream = match key {
            StreamKey::Out => &mut cell.out,
            StreamKey::Err => &mut cell.err,
        };
        let fed = stream.feed(&cell.markers, bytes);
        pieces(&cell.nonce, key, &fed.forward, effects);
        if fed.ended {
            self.settle(effects);
        }
    }

    /// Ends the cell once its status and both end markers are in.
    fn settle(&mut self, effects: &mut Vec<Effect>) {
        let Some(cell) = &self.cell else { return };
        let Some(status) = cell.status else { return };
        if cell.out.ended() && cell.err.ended() {
            self.finish(if status == Status::Ok { 0 } else { 1 }, effects);
        }
    }

    fn finish(&mut self, done: u8, effects: &mut Vec<Effect>) {
        let Some(mut cell) = self.cell.take() else {
            return;
        };
        let out = cell.out.flush();
        pieces(&cell.nonce, StreamKey::Out, &out, effects);
        let err = cell.err.flush();
        pieces(&cell.nonce, StreamKey::Err, &err, effects);
        let frame = Frame::Done {
            n: &cell.nonce,
            done,
            ot: cell.out.truncated(),
            et: cell.err.truncated(),
        };
        effects.push(Effect::Send(frame.line()));
        effects.push(Effect::CloseCtl);
    }

    fn current(&self, generation: u64) -> Option<&Cell> {
        self.cell.as_ref().filter(|c| c.generation == generation)
    }

    fn current_mut(&mut self, generation: u64) -> Option<&mut Cell> {
        self.cell.as_mut().filter(|c| c.generation == generation)
    }
}

/// `bytes` as output frames of at most [`PIECE`] bytes each.
fn pieces(n: &str, key: StreamKey, bytes: &[u8], effects: &mut Vec<Effect>) {
    for piece in bytes.chunks(PIECE) {
        effects.push(Effect::Send(
            Frame::Piece {
                n,
                key,
                bytes: piece,
            }
            .line(),
        ));
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
