//! The guard tokens of open runs and sessions (grants.md §5.4): a token is minted when a run
//! or session opens with guard delivery, and the table keeps only its SHA-256, pointing at
//! what it serves. The guard asks about a hash on the guard socket ([`crate::guard_socket`]);
//! nothing else ever looks a token up.
//!
//! A run's token serves that run until the run ends. A session's token serves whichever run
//! is lent to the session when a request arrives, and nothing between calls. A token leaves
//! the table when its [`Registration`] is revoked or dropped, so a run or session that goes
//! away cannot leave a live token behind; after that the guard answers 401. Because the table
//! lives here, a guard that restarts finds every token as it was.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use guard::token::{GuardToken, TokenHash};

use crate::run::Run;

/// What a token serves: the run a request with it reaches right now, if any.
pub trait Holder: Send + Sync {
    /// The run that answers now; `None` is a 401 at the guard.
    fn run_now(&self) -> Option<Arc<Run>>;
}

/// A run's own token serves the run until it has ended.
struct RunHolder(Weak<Run>);

impl Holder for RunHolder {
    fn run_now(&self) -> Option<Arc<Run>> {
        self.0.upgrade().filter(|run| !run.is_ended())
    }
}

/// The table of live tokens, by hash.
#[derive(Default)]
pub struct GuardTokens {
    table: Mutex<HashMap<TokenHash, Arc<dyn Holder>>>,
}

/// A token in the table. Revoking or dropping it takes the token out.
pub struct Registration {
    tokens: Arc<GuardTokens>,
    hash: TokenHash,
    revoked: bool,
}

// === impl GuardTokens ===

impl GuardTokens {
    fn table(&self) -> MutexGuard<'_, HashMap<TokenHash, Arc<dyn Holder>>> {
        // Every update is one insert or remove: a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mints a token for `run`.
    pub fn register_run(self: &Arc<Self>, run: &Arc<Run>) -> (GuardToken, Registration) {
        self.register(Arc::new(RunHolder(Arc::downgrade(run))))
    }

    /// Mints a token for `holder` (a session's slot).
    pub fn register(self: &Arc<Self>, holder: Arc<dyn Holder>) -> (GuardToken, Registration) {
        let mut table = self.table();
        // 256 random bits do not collide; the loop only makes that a certainty.
        let (token, hash) = loop {
            let (token, hash) = GuardToken::mint();
            if !table.contains_key(&hash) {
                break (token, hash);
            }
        };
        table.insert(hash, holder);
        let registration = Registration {
            tokens: self.clone(),
            hash,
            revoked: false,
        };
        (token, registration)
    }

    /// Makes the token `hash` names serve `holder` from now on (a session points its token
    /// at itself once it exists); a revoked token stays revoked.
    pub fn point(&self, hash: &TokenHash, holder: Arc<dyn Holder>) {
        if let Some(entry) = self.table().get_mut(hash) {
            *entry = holder;
        }
    }

    /// The run a request presenting the token with `hash` reaches now.
    pub fn lookup(&self, hash: &TokenHash) -> Option<Arc<Run>> {
        let holder = self.table().get(hash).cloned()?;
        holder.run_now()
    }

    /// Tokens in the table.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// === impl Registration ===

impl Registration {
    /// The hash the token is kept under.
    pub fn hash(&self) -> TokenHash {
        self.hash
    }

    /// Takes the token out of the table now: the guard answers 401 from here on.
    pub fn revoke(&mut self) {
        if !self.revoked {
            self.revoked = true;
            self.tokens.table().remove(&self.hash);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.revoke();
    }
}
