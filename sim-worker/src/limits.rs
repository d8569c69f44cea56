//! What stops a model: a memory and table cap per instance ([`RowLimits`], wasmtime's
//! [`ResourceLimiter`]) and the run's deadline ([`Deadline`], wasmtime's epoch interruption).
//!
//! Both end only the row that hits them, as a trap the worker turns into a status
//! ([`status::MEMORY`](sim_format::status::MEMORY), [`status::DEADLINE`](sim_format::status::DEADLINE));
//! the results file is still written whole. Neither limits the worker's own buffers, which
//! the results budget bounds before any row runs.

use std::time::{Duration, Instant};

use wasmtime::{Engine, ResourceLimiter};

use crate::engine::{MAX_MEMORY_BYTES, MAX_TABLE_ELEMENTS};

/// The error a refused growth traps with, so the row's status can name the limit.
#[derive(Debug, thiserror::Error)]
#[error("the model asked for {desired} bytes of {what}, over its limit of {limit}")]
pub struct OverLimit {
    /// `memory` or `table`.
    pub what: &'static str,
    /// What it asked for (bytes, or table entries).
    pub desired: usize,
    /// The cap.
    pub limit: usize,
}

/// One instance's caps: 16 MiB of linear memory, 10 000 table entries, one memory, one
/// table, one instance.
#[derive(Debug, Default)]
pub struct RowLimits;

impl ResourceLimiter for RowLimits {
    /// Growth past the cap traps at once (an `Err`, not `Ok(false)`): a model that allocates
    /// without bound is stopped at the `memory.grow` that crosses the line rather than left
    /// to handle a failed allocation however it likes. The initial memory is checked here
    /// too; a model whose initial memory is over the cap is refused when it is loaded.
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_MEMORY_BYTES {
            return Err(wasmtime::Error::new(OverLimit {
                what: "memory",
                desired,
                limit: MAX_MEMORY_BYTES,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(wasmtime::Error::new(OverLimit {
                what: "table",
                desired,
                limit: MAX_TABLE_ELEMENTS,
            }));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }
}

// === impl Deadline ===

/// The run's deadline. A thread advances the engine's epoch once, when the deadline passes;
/// every row's store traps at the first epoch change after it started
/// ([`Deadline::arm`]), so a model that loops forever stops within microseconds of the
/// deadline, and rows not yet started do not start.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// A deadline `after` from now, and the thread that enforces it on `engine`'s stores.
    pub fn start(engine: &Engine, after: Duration) -> std::io::Result<Deadline> {
        let at = Instant::now() + after;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("deadline".into())
            .spawn(move || {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                if let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                }
            })?;
        Ok(Deadline { at })
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// Makes `store` trap at the deadline, or says it has already passed.
    ///
    /// The store's epoch deadline is relative to the epoch *now*. The ordering makes the
    /// race harmless: the deadline is set first and the clock read after, so if the thread's
    /// one increment came before the store's deadline was set (too late to trap it), the
    /// clock read afterwards is past the deadline and the row does not start.
    pub fn arm<T>(&self, store: &mut wasmtime::Store<T>) -> Result<(), Passed> {
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        if self.passed() { Err(Passed) } else { Ok(()) }
    }
}

/// The deadline had passed before a row started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_tables_over_the_cap_trap_with_the_limit_named() {
        let mut limits = RowLimits;
        assert!(limits.memory_growing(0, MAX_MEMORY_BYTES, None).unwrap());
        let err = limits
            .memory_growing(0, MAX_MEMORY_BYTES + 1, None)
            .unwrap_err();
        assert_eq!(err.downcast_ref::<OverLimit>().unwrap().what, "memory");
        assert!(limits.table_growing(0, MAX_TABLE_ELEMENTS, None).unwrap());
        assert!(
            limits
                .table_growing(0, MAX_TABLE_ELEMENTS + 1, None)
                .is_err()
        );
    }
}
