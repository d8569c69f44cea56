//! Deadlines: the time a run or session has left, and the timer that ends it when nobody
//! else does.
//!
//! plimsolld closes every run and session it opens; the broker does not rely on it. Each gets
//! a timer at open ([`expire_at`]) that closes it [`DEADLINE_GRACE`] after its deadline, so a
//! run plimsolld forgets (or a plimsolld that dies) still ends.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A run or session is closed this long after its deadline even if never closed.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// Time left until `deadline_unix_ms` as seen at `now`; `None` once it has passed.
pub fn time_left(deadline_unix_ms: u64, now: SystemTime) -> Option<Duration> {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    deadline_unix_ms
        .checked_sub(now_ms)
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Runs `expire` at `deadline` unless `ended` resolves first (the run or session was closed
/// in time). The timer is its own task: it needs nobody to wait for it.
pub fn expire_at<E, X>(deadline: Instant, ended: E, expire: X)
where
    E: Future<Output = ()> + Send + 'static,
    X: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => expire.await,
            () = ended => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn time_left_is_none_once_the_deadline_has_passed() {
        let now = UNIX_EPOCH + Duration::from_millis(10_000);
        assert_eq!(time_left(12_500, now), Some(Duration::from_millis(2_500)));
        assert_eq!(time_left(10_000, now), None);
        assert_eq!(time_left(9_000, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_expires_at_its_deadline_unless_ended_first() {
        let expired = Arc::new(AtomicBool::new(false));
        let flag = expired.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        expire_at(deadline, std::future::pending(), async move {
            flag.store(true, Ordering::SeqCst);
        });
        tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
        assert!(!expired.load(Ordering::SeqCst), "not before the deadline");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(expired.load(Ordering::SeqCst), "at the deadline");

        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        expire_at(
            Instant::now() + Duration::from_secs(30),
            async {},
            async move {
                flag.store(true, Ordering::SeqCst);
            },
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !ended.load(Ordering::SeqCst),
            "a run closed in time is left alone"
        );
    }
}
