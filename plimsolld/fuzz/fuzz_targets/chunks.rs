//! A byte stream cut as reads would cut it, for the targets that take a stream in pieces.
//! Not a target itself: the targets include it with `mod chunks;`.

use arbitrary::Arbitrary;

/// `stream`, to be cut into pieces of `lengths` bytes (as far as it reaches), the rest last.
#[derive(Arbitrary, Debug)]
pub struct Chunked<'a> {
    pub lengths: Vec<u8>,
    pub stream: &'a [u8],
}

impl<'a> Chunked<'a> {
    /// The pieces, in order; empty ones included (a read may bring nothing new).
    pub fn chunks(&self) -> Vec<&'a [u8]> {
        let mut rest = self.stream;
        let mut chunks = Vec::with_capacity(self.lengths.len() + 1);
        for &n in &self.lengths {
            let (chunk, after) = rest.split_at(usize::from(n).min(rest.len()));
            chunks.push(chunk);
            rest = after;
        }
        chunks.push(rest);
        chunks
    }
}
