//! Tokens the broker called live a moment ago. The lookup before the body is read (grants.md
//! §5.5 step 2) only decides whether the guard spends a turn and a decode slot on a body; the
//! broker checks the token again when it makes the call and answers "unknown" for one that
//! died meanwhile. So a live answer may be reused for [`LIVE_FOR`]: a run's calls after the
//! first cost one round trip to the broker instead of two. A token that ended inside that
//! window can make the guard read at most one body per turn before the broker's 401; an
//! "unknown" answer is never kept, and a call the broker refuses as unknown drops the entry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::token::TokenHash;

/// How long a live answer is reused.
pub const LIVE_FOR: Duration = Duration::from_secs(1);
/// At most this many answers are kept; past it, expired ones are dropped and, if none had
/// expired, nothing new is kept (every request then asks the broker, as without this).
pub const MAX_KEPT: usize = 4096;

/// The recent live answers, by token hash.
#[derive(Default)]
pub struct LiveTokens {
    until: Mutex<HashMap<TokenHash, Instant>>,
}

impl LiveTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenHash, Instant>> {
        // Every update leaves a valid map; a poisoned lock is still usable.
        self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the broker called `hash` live less than [`LIVE_FOR`] ago.
    pub fn recently_live(&self, hash: &TokenHash, now: Instant) -> bool {
        self.lock().get(hash).is_some_and(|until| now < *until)
    }

    /// Keeps the broker's live answer for `hash`, given at `now`.
    pub fn remember(&self, hash: TokenHash, now: Instant) {
        let mut until = self.lock();
        if until.len() >= MAX_KEPT && !until.contains_key(&hash) {
            until.retain(|_, expires| now < *expires);
            if until.len() >= MAX_KEPT {
                return;
            }
        }
        until.insert(hash, now + LIVE_FOR);
    }

    /// Drops `hash` (the broker refused a call with it as unknown).
    pub fn forget(&self, hash: &TokenHash) {
        self.lock().remove(hash);
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no answer is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::GuardToken;

    fn hash() -> TokenHash {
        GuardToken::mint().1
    }

    #[test]
    fn a_live_answer_is_reused_only_inside_its_window_and_until_forgotten() {
        let live = LiveTokens::default();
        let (a, b) = (hash(), hash());
        let now = Instant::now();
        assert!(!live.recently_live(&a, now));
        live.remember(a, now);
        assert!(live.recently_live(&a, now + LIVE_FOR / 2));
        assert!(!live.recently_live(&a, now + LIVE_FOR));
        assert!(!live.recently_live(&b, now));
        live.forget(&a);
        assert!(!live.recently_live(&a, now));
    }

    #[test]
    fn the_table_is_bounded_and_makes_room_from_expired_answers() {
        let live = LiveTokens::default();
        let now = Instant::now();
        for _ in 0..MAX_KEPT {
            live.remember(hash(), now);
        }
        let late = hash();
        live.remember(late, now);
        assert_eq!(live.len(), MAX_KEPT);
        assert!(!live.recently_live(&late, now), "kept past the bound");
        let after = now + LIVE_FOR;
        live.remember(late, after);
        assert_eq!(live.len(), 1);
        assert!(live.recently_live(&late, after));
    }
}
