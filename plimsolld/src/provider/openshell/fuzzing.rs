//! Entry points for the cargo-fuzz targets in `plimsolld/fuzz` (feature `fuzzing`): the
//! parsers of what an OpenShell sandbox writes back, which the guest controls. Each function
//! must return without panicking, whatever it is given.

use relay::protocol::{MAX_LINE, NEED, READY};

use super::lines::{Lines, Word};

/// The relay's stdout, cut into `chunks` as reads would cut it, split into words. Never more
/// than [`MAX_LINE`] bytes held, and the words are those of the whole stream read at once:
/// each newline-ended line of at most [`MAX_LINE`] bytes that is exactly a word.
pub fn relay_words(chunks: &[&[u8]]) {
    let mut lines = Lines::default();
    let mut heard = Vec::new();
    for chunk in chunks {
        lines.feed(chunk, |word| heard.push(word));
        assert!(lines.held() <= MAX_LINE, "{} bytes held", lines.held());
    }
    let whole = chunks.concat();
    let mut expected = Vec::new();
    let mut ended = whole.split(|&b| b == b'\n').collect::<Vec<_>>();
    // The bytes after the last newline are no line yet.
    ended.pop();
    for line in ended {
        if line.len() > MAX_LINE {
            continue;
        }
        if line == READY.as_bytes() {
            expected.push(Word::Ready);
        } else if line == NEED.as_bytes() {
            expected.push(Word::Need);
        }
    }
    assert_eq!(heard, expected);
}
