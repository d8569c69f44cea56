//! Ending a simulator without leaving a container behind. A request that makes a container
//! can still be in flight when the simulator is told to stop (its connection task outlives
//! the listener), and a container it makes after the shutdown sweep listed the others would
//! outlive the simulator. So container-making work registers with [`Makers`], which refuses
//! new work once closing and lets the shutdown wait for what is in flight; then
//! [`crate::docker::Engine::remove_every`] sweeps by label until a listing comes back empty.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Container-making work in flight, and whether the simulator is closing.
#[derive(Debug, Default)]
pub struct Makers {
    closing: AtomicBool,
    in_flight: AtomicUsize,
}

/// One piece of container-making work; dropping it (also when its task is cancelled) says it
/// is over.
#[derive(Debug)]
pub struct Making<'a>(&'a Makers);

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Makers {
    /// Counts a piece of work in; `None` once the simulator is closing. The count goes up
    /// before `closing` is read, so [`Makers::close`] never misses work that was let in.
    pub fn begin(&self) -> Option<Making<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let making = Making(self);
        (!self.closing.load(Ordering::SeqCst)).then_some(making)
    }

    /// Whether [`Makers::close`] has been called.
    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Refuses new work and waits (at most `budget`) for the work in flight to end; answers
    /// how many pieces were still running when the budget ran out.
    pub async fn close(&self, budget: Duration) -> usize {
        self.closing.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let left = self.in_flight.load(Ordering::SeqCst);
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closing_waits_for_work_in_flight_and_refuses_new_work() {
        let makers = std::sync::Arc::new(Makers::default());
        let making = makers.begin();
        assert!(making.is_some());
        let closer = {
            let makers = makers.clone();
            tokio::spawn(async move { makers.close(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!closer.is_finished(), "close returned with work in flight");
        assert!(makers.begin().is_none(), "work was let in while closing");
        drop(making);
        assert_eq!(closer.await.ok(), Some(0));
    }

    #[tokio::test]
    async fn a_close_budget_bounds_the_wait() {
        let makers = Makers::default();
        let _stuck = makers.begin();
        assert_eq!(makers.close(Duration::from_millis(100)).await, 1);
        assert!(makers.closing());
    }
}
