//! The names of remote sandboxes this daemon is responsible for: tracked before the create
//! is sent and released only once the vendor says the sandbox is gone, so a crash between
//! the two cannot lose one, the orphan sweep can tell ours from strays, and the drain can
//! wait for every delete. Shared by the providers whose sandboxes live on someone else's
//! machine.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// A set of tracked names (leases, sandbox names) and a signal when one is released.
#[derive(Default)]
pub struct Tracked {
    names: Mutex<HashSet<String>>,
    changed: Notify,
}

impl Tracked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A panic while holding this lock leaves a valid set; keep using it.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tracks `name` (before its create is sent).
    pub fn track(&self, name: &str) {
        self.lock().insert(name.to_owned());
    }

    /// Stops tracking `name` (its sandbox is gone, or was never made).
    pub fn release(&self, name: &str) {
        self.lock().remove(name);
        self.changed.notify_waiters();
    }

    /// Whether a run (or its delete) still tracks `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().contains(name)
    }

    /// Waits until nothing is tracked or `budget` passes; answers how many are left.
    pub async fn settle(&self, budget: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let notified = self.changed.notified();
            let left = self.lock().len();
            if left == 0 || tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.lock().len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settle_returns_once_the_last_name_is_released() {
        let tracked = std::sync::Arc::new(Tracked::default());
        tracked.track("a");
        tracked.track("b");
        assert!(tracked.contains("a"));
        assert_eq!(tracked.settle(Duration::from_millis(20)).await, 2);
        let releaser = {
            let tracked = tracked.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                tracked.release("a");
                tracked.release("b");
            })
        };
        assert_eq!(tracked.settle(Duration::from_secs(10)).await, 0);
        assert!(!tracked.contains("a"));
        releaser.await.ok();
    }
}
