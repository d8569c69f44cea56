//! The byte framing between the simulator and its in-guest agent.
//!
//! A docker exec carries only stdin, stdout and stderr, so the agent writes everything the
//! simulator must tell apart (a pid, output of either stream, an exit status, a refusal) on
//! its stdout as frames: one tag byte, a 4-byte big-endian length, then the payload. Its
//! stderr is for diagnostics only.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The largest payload either side accepts (a data frame carries at most 32 KiB; file reads
/// and results stay far below this).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// A started process's pid, 4 bytes big-endian.
    Pid,
    /// Bytes the process wrote to stdout.
    Stdout,
    /// Bytes the process wrote to stderr.
    Stderr,
    /// JSON: how the process ended ([`crate::guest::End`]).
    End,
    /// JSON: why the operation was refused (`{"status"|"code", "message"}`).
    Failed,
    /// JSON: an operation's result.
    Result,
    /// Raw file bytes.
    Data,
}

impl Tag {
    fn byte(self) -> u8 {
        match self {
            Tag::Pid => b'P',
            Tag::Stdout => b'O',
            Tag::Stderr => b'E',
            Tag::End => b'X',
            Tag::Failed => b'F',
            Tag::Result => b'R',
            Tag::Data => b'D',
        }
    }

    fn from_byte(byte: u8) -> Option<Tag> {
        Some(match byte {
            b'P' => Tag::Pid,
            b'O' => Tag::Stdout,
            b'E' => Tag::Stderr,
            b'X' => Tag::End,
            b'F' => Tag::Failed,
            b'R' => Tag::Result,
            b'D' => Tag::Data,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub tag: Tag,
    pub payload: Bytes,
}

/// A frame stream that does not follow this format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The tag and the first bytes from it on (escaped), to tell a stray writer.
    #[error("unknown frame tag 0x{0:02x} (from it: {1})")]
    UnknownTag(u8, String),
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
}

/// Encodes one frame.
pub fn encode(tag: Tag, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(tag.byte());
    // Payloads are bounded by MAX_PAYLOAD (1 MiB) by every writer, so this fits.
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// Collects bytes as they arrive and yields whole frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: BytesMut,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let Some(tag) = Tag::from_byte(self.buffer[0]) else {
            let preview = &self.buffer[..self.buffer.len().min(48)];
            return Err(FrameError::UnknownTag(
                self.buffer[0],
                preview.escape_ascii().to_string(),
            ));
        };
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        self.buffer.advance(5);
        let payload = self.buffer.split_to(len).freeze();
        Ok(Some(Frame { tag, payload }))
    }

    /// Bytes received that do not make a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode(Tag::Pid, &7u32.to_be_bytes()));
        wire.extend_from_slice(&encode(Tag::Stdout, b"hello"));
        wire.extend_from_slice(&encode(Tag::End, b"{}"));
        for split in 0..wire.len() {
            let mut decoder = Decoder::default();
            let mut frames = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                decoder.push(part);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            let tags: Vec<Tag> = frames.iter().map(|f| f.tag).collect();
            assert_eq!(tags, [Tag::Pid, Tag::Stdout, Tag::End], "split at {split}");
            assert_eq!(&frames[1].payload[..], b"hello");
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn unknown_tags_and_huge_lengths_are_refused() {
        let mut decoder = Decoder::default();
        decoder.push(b"Z\0\0\0\0");
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::UnknownTag(
                b'Z',
                "Z\\x00\\x00\\x00\\x00".to_owned()
            ))
        );
        let mut decoder = Decoder::default();
        decoder.push(&[b'O', 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(decoder.next_frame(), Err(FrameError::TooLarge(_))));
    }
}
