//! Random identifiers.

use rand::RngCore;

/// `bytes` random bytes as lower-case hex.
pub fn hex_id(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}
