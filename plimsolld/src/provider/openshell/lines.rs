//! The relay's stdout, read as untrusted (grants.md §8.7 step 2): at most 64 bytes of an
//! unfinished line are kept, a longer line is dropped whole, and only the exact words
//! `ready` and `need` mean anything. The guest runs as the relay's user and can write to its
//! stdout, so nothing here is believed beyond "dial one more".

use relay::protocol::{MAX_LINE, NEED, READY};

/// A word the relay said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// Both listeners are up.
    Ready,
    /// One more dial is wanted.
    Need,
}

/// Splits the relay's output into words, holding at most [`MAX_LINE`] bytes.
#[derive(Debug, Default)]
pub struct Lines {
    line: Vec<u8>,
    overlong: bool,
}

impl Lines {
    /// Feeds `bytes`; calls `word` for each complete line that is exactly a word.
    pub fn feed(&mut self, bytes: &[u8], mut word: impl FnMut(Word)) {
        for &b in bytes {
            if b == b'\n' {
                if !self.overlong {
                    match self.line.as_slice() {
                        l if l == READY.as_bytes() => word(Word::Ready),
                        l if l == NEED.as_bytes() => word(Word::Need),
                        _ => {}
                    }
                }
                self.line.clear();
                self.overlong = false;
            } else if self.overlong {
                // The rest of a line already too long: dropped.
            } else if self.line.len() == MAX_LINE {
                self.line.clear();
                self.overlong = true;
            } else {
                self.line.push(b);
            }
        }
    }

    /// How many bytes are held for an unfinished line.
    #[allow(dead_code)] // for sessions on openshell (issue 17, item 2)
    pub fn held(&self) -> usize {
        self.line.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(chunks: &[&[u8]]) -> Vec<Word> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for c in chunks {
            lines.feed(c, |w| out.push(w));
            assert!(lines.held() <= MAX_LINE);
        }
        out
    }

    #[test]
    fn exact_words_split_anywhere_are_read() {
        assert_eq!(
            words(&[b"rea", b"dy\nne", b"ed\nneed\n"]),
            [Word::Ready, Word::Need, Word::Need]
        );
    }

    #[test]
    fn anything_else_is_noise_and_overlong_lines_are_dropped_whole() {
        let long = [b'x'; 10_000];
        let mut flood = long.to_vec();
        flood.extend_from_slice(b"need\n");
        assert_eq!(words(&[&flood, b"need\n"]), [Word::Need]);
        assert!(
            words(&[
                b"need \n",
                b" need\n",
                b"NEED\n",
                b"need\r\n",
                b"needneed\n"
            ])
            .is_empty()
        );
        // A line of exactly the limit is still read; one byte more is dropped.
        let mut at_limit = vec![b' '; MAX_LINE];
        at_limit.push(b'\n');
        assert!(words(&[&at_limit, b"ready\n"]) == [Word::Ready]);
    }
}
