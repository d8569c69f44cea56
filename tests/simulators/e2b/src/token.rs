//! Random identifiers and secrets, shaped like E2B's.

use rand::Rng;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz1234567890";

/// A sandbox id: 20 characters of `[a-z0-9]`, as E2B makes them.
pub fn sandbox_id() -> String {
    let mut rng = rand::rng();
    (0..20)
        .map(|_| char::from(ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())]))
        .collect()
}

/// `bytes` random bytes as lowercase hex (E2B's access tokens are 64 hex characters).
pub fn hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::rng().fill(&mut raw[..]);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_match_e2bs_shape() {
        let id = super::sandbox_id();
        assert_eq!(id.len(), 20);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_eq!(super::hex(32).len(), 64);
    }
}
