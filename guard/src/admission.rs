//! The guard's admission (grants.md §5.5 steps 4 and 5): per token, at most
//! [`PER_TOKEN`] requests inside the handler and [`TURNS`] of them decoding at once (a turn
//! is waited for up to [`TURN_WAIT`]); across every token, a pool of decode slots that sheds
//! at once when empty.
//!
//! Every hold is a value that gives itself back when dropped ([`Inside`], [`Turn`],
//! [`DecodeSlot`]), so no way out of the handler can leak one. A token's entry lives only
//! while one of its requests is inside: the table never grows with tokens that are not in
//! use, whatever a client presents.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::token::TokenHash;

/// Requests of one token inside the handler at once.
pub const PER_TOKEN: usize = 16;
/// Requests of one token reading or decoding a body at once.
pub const TURNS: usize = 2;
/// How long a request waits for its token's turn.
pub const TURN_WAIT: Duration = Duration::from_secs(10);

/// One token's counts.
struct Gate {
    inside: usize,
    turns: Arc<Semaphore>,
}

/// The guard's admission state.
pub struct Admission {
    gates: Mutex<HashMap<TokenHash, Gate>>,
    decode: Arc<Semaphore>,
    decode_slots: usize,
}

/// A request of one token inside the handler. Dropping it lets another in.
pub struct Inside {
    admission: Arc<Admission>,
    hash: TokenHash,
    turns: Arc<Semaphore>,
}

/// One of a token's turns to read and decode a body.
pub struct Turn(#[allow(dead_code)] OwnedSemaphorePermit);

/// One of the shared decode slots.
pub struct DecodeSlot(#[allow(dead_code)] OwnedSemaphorePermit);

/// What admission holds right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Tokens with a request inside.
    pub tokens: usize,
    /// Requests inside, over every token.
    pub inside: usize,
    /// Turns held, over every token.
    pub turns: usize,
    /// Decode slots held.
    pub decoding: usize,
}

// === impl Admission ===

impl Admission {
    /// Admission with `decode_slots` shared decode slots.
    pub fn new(decode_slots: usize) -> Arc<Admission> {
        Arc::new(Admission {
            gates: Mutex::new(HashMap::new()),
            decode: Arc::new(Semaphore::new(decode_slots)),
            decode_slots,
        })
    }

    fn gates(&self) -> MutexGuard<'_, HashMap<TokenHash, Gate>> {
        // Every update is one increment, decrement, insert or remove: still consistent.
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets a request of `hash` in, or `None` when [`PER_TOKEN`] are inside already.
    pub fn enter(self: &Arc<Self>, hash: TokenHash) -> Option<Inside> {
        let mut gates = self.gates();
        let gate = gates.entry(hash).or_insert_with(|| Gate {
            inside: 0,
            turns: Arc::new(Semaphore::new(TURNS)),
        });
        if gate.inside >= PER_TOKEN {
            return None;
        }
        gate.inside += 1;
        Some(Inside {
            admission: self.clone(),
            hash,
            turns: gate.turns.clone(),
        })
    }

    /// A decode slot now, or `None` when every one is held (shed, never queue).
    pub fn decode_slot(&self) -> Option<DecodeSlot> {
        self.decode.clone().try_acquire_owned().ok().map(DecodeSlot)
    }

    /// What is held right now.
    pub fn counts(&self) -> Counts {
        let gates = self.gates();
        Counts {
            tokens: gates.len(),
            inside: gates.values().map(|g| g.inside).sum(),
            turns: gates
                .values()
                .map(|g| TURNS - g.turns.available_permits())
                .sum(),
            decoding: self.decode_slots - self.decode.available_permits(),
        }
    }
}

// === impl Inside ===

impl Inside {
    /// Waits up to `wait` for one of the token's turns; `None` when none came.
    pub async fn turn(&self, wait: Duration) -> Option<Turn> {
        let turn = tokio::time::timeout(wait, self.turns.clone().acquire_owned()).await;
        turn.ok()?.ok().map(Turn)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut gates = self.admission.gates();
        if let Some(gate) = gates.get_mut(&self.hash) {
            gate.inside = gate.inside.saturating_sub(1);
            if gate.inside == 0 {
                gates.remove(&self.hash);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::token::GuardToken;

    #[test]
    fn sixteen_requests_of_a_token_get_in_and_the_seventeenth_does_not() {
        let admission = Admission::new(4);
        let (_, a) = GuardToken::mint();
        let (_, b) = GuardToken::mint();
        let inside: Vec<Inside> = (0..PER_TOKEN)
            .map(|_| admission.enter(a).unwrap())
            .collect();
        assert!(admission.enter(a).is_none());
        let other = admission.enter(b).expect("another token has its own count");
        assert_eq!(admission.counts().inside, PER_TOKEN + 1);
        drop(inside);
        drop(other);
        assert_eq!(
            admission.counts(),
            Counts::default(),
            "no entry outlives its requests"
        );
        assert!(admission.enter(a).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_third_request_waits_for_a_turn_and_gives_up_after_ten_seconds() {
        let admission = Admission::new(4);
        let (_, a) = GuardToken::mint();
        let (one, two, three) = (
            admission.enter(a).unwrap(),
            admission.enter(a).unwrap(),
            admission.enter(a).unwrap(),
        );
        let _t1 = one.turn(TURN_WAIT).await.unwrap();
        let t2 = two.turn(TURN_WAIT).await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(three.turn(TURN_WAIT).await.is_none());
        assert_eq!(started.elapsed(), TURN_WAIT);
        let waiting = tokio::spawn(async move { three.turn(TURN_WAIT).await.is_some() });
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(t2);
        assert!(waiting.await.unwrap(), "a freed turn goes to the waiter");
    }

    #[test]
    fn decode_slots_shed_at_once_when_empty() {
        let admission = Admission::new(2);
        let held = (
            admission.decode_slot().unwrap(),
            admission.decode_slot().unwrap(),
        );
        assert!(admission.decode_slot().is_none());
        assert_eq!(admission.counts().decoding, 2);
        drop(held);
        assert_eq!(admission.counts().decoding, 0);
    }
}
