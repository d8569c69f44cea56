//! Per-run guard tokens (grants.md §5.4): `crg_` and 64 lowercase hex characters (32 random
//! bytes), presented in the `X-Plimsoll-Guard` header and known to the broker only by their
//! SHA-256.
//!
//! The broker mints a token when a run or session opens with guard delivery and keeps only
//! its [`TokenHash`]; the guard hashes what a request presents and asks the broker about the
//! hash. Neither table ever holds a token, and a [`GuardToken`] never prints itself.

use std::fmt;

use sha2::{Digest, Sha256};

/// The header a guard request carries its token in (lower-case, as HTTP/2 sends it).
pub const HEADER: &str = "x-plimsoll-guard";
/// Every token starts with this.
pub const PREFIX: &str = "crg_";
/// Random bytes in a token.
pub const RANDOM_BYTES: usize = 32;
/// A token's length in characters.
pub const TOKEN_LEN: usize = PREFIX.len() + 2 * RANDOM_BYTES;

/// A live guard token. It is a credential: `Debug` and `Display` never show it; only
/// [`GuardToken::expose`] does, for the one place it must go (the guest's client or the
/// vendor's network rule).
#[derive(Clone, PartialEq, Eq)]
pub struct GuardToken(String);

/// The SHA-256 of a token: what the broker's table is keyed by and what the guard sends it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

// === impl GuardToken ===

impl GuardToken {
    /// A fresh token from the operating system's random source, and its hash.
    pub fn mint() -> (GuardToken, TokenHash) {
        let token = GuardToken(format!(
            "{PREFIX}{}",
            hex::encode(rand::random::<[u8; RANDOM_BYTES]>())
        ));
        let hash = TokenHash::of(token.expose().as_bytes());
        (token, hash)
    }

    /// Takes a token received over the control socket; `None` unless it has the shape.
    pub fn from_wire(text: String) -> Option<GuardToken> {
        well_formed(text.as_bytes()).then_some(GuardToken(text))
    }

    /// The token's text.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The token's hash.
    pub fn hash(&self) -> TokenHash {
        TokenHash::of(self.0.as_bytes())
    }
}

impl fmt::Debug for GuardToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GuardToken(crg_…)")
    }
}

// === impl TokenHash ===

impl TokenHash {
    fn of(bytes: &[u8]) -> TokenHash {
        TokenHash(Sha256::digest(bytes).into())
    }

    /// The hash of a presented header value, or `None` when the value is not a token's shape
    /// (such a value can match nothing, so nobody is asked about it).
    pub fn of_presented(value: &[u8]) -> Option<TokenHash> {
        well_formed(value).then(|| TokenHash::of(value))
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Reads [`TokenHash::to_hex`]'s form; `None` for anything else.
    pub fn from_hex(text: &[u8]) -> Option<TokenHash> {
        if text.len() != 64 || !text.iter().all(is_lower_hex) {
            return None;
        }
        let mut bytes = [0; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(TokenHash(bytes))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A hash is no secret, but a short prefix is all a log ever needs.
        write!(f, "TokenHash({}…)", &self.to_hex()[..8])
    }
}

fn is_lower_hex(b: &u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(b)
}

/// Whether `value` is `crg_` and 64 lowercase hex characters.
pub fn well_formed(value: &[u8]) -> bool {
    value.len() == TOKEN_LEN
        && value.starts_with(PREFIX.as_bytes())
        && value[PREFIX.len()..].iter().all(is_lower_hex)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_has_the_shape_and_its_hash_is_its_sha256() {
        let (token, hash) = GuardToken::mint();
        let text = token.expose();
        assert_eq!(text.len(), TOKEN_LEN);
        assert!(text.starts_with("crg_"));
        assert!(well_formed(text.as_bytes()));
        assert_eq!(TokenHash::of_presented(text.as_bytes()), Some(hash));
        assert_eq!(token.hash(), hash);
        let expected: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(hash.to_hex(), hex::encode(expected));
        assert_eq!(TokenHash::from_hex(hash.to_hex().as_bytes()), Some(hash));
        assert_ne!(GuardToken::mint().0, token, "each token is fresh");
    }

    #[test]
    fn a_token_never_prints_itself() {
        let (token, hash) = GuardToken::mint();
        let shown = format!("{token:?} {hash:?}");
        assert!(!shown.contains(&token.expose()[4..]), "{shown}");
    }

    #[test]
    fn anything_but_the_shape_is_no_token() {
        let good = format!("crg_{}", "ab".repeat(32));
        assert!(well_formed(good.as_bytes()));
        for bad in [
            format!("crg_{}", "AB".repeat(32)),
            format!("crg_{}", "ab".repeat(31)),
            format!("crg_{}a", "ab".repeat(32)),
            format!("crx_{}", "ab".repeat(32)),
            format!(" crg_{}", "ab".repeat(32)),
            String::new(),
        ] {
            assert!(!well_formed(bad.as_bytes()), "{bad}");
            assert!(TokenHash::of_presented(bad.as_bytes()).is_none());
        }
        assert!(GuardToken::from_wire("crg_x".into()).is_none());
        assert!(TokenHash::from_hex(b"AB").is_none());
        assert!(TokenHash::from_hex("AB".repeat(32).as_bytes()).is_none());
    }
}
