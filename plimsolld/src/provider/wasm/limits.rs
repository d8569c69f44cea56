//! The two limits a wasm run has: linear memory, enforced by wasmtime through a
//! [`ResourceLimiter`], and wall-clock time, enforced by epoch interruption driven by one
//! [`EpochTicker`] thread per engine.
//!
//! Memory is the only per-run resource control (providers.md §3.2); CPU is bounded only by
//! the deadline. The limiter covers the guest's linear memory and tables, not the host's
//! own buffers, which are capped where they are made (see `output.rs`).

use std::time::Duration;

use wasmtime::{EngineWeak, ResourceLimiter};

/// Bytes in one WebAssembly page.
const PAGE: u64 = 64 * 1024;
/// The default memory cap: 4096 pages (providers.md §3.2).
pub const DEFAULT_MEMORY_PAGES: u64 = 4096;
/// The largest cap: 65 536 pages, all that a 32-bit memory can address.
pub const MAX_MEMORY_PAGES: u64 = 65_536;
/// A table never needs more entries than this; QuickJS's function table is far smaller.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// The memory cap in pages for `SANDBOX_MEMORY_MB` (0 = the default), clamped to what a
/// 32-bit memory can address.
pub fn memory_pages(memory_mb: u32) -> u64 {
    if memory_mb == 0 {
        DEFAULT_MEMORY_PAGES
    } else {
        (u64::from(memory_mb) * 16).min(MAX_MEMORY_PAGES)
    }
}

/// One run's memory cap. It refuses growth past the cap (the guest sees `memory.grow`
/// fail, which QuickJS turns into an out-of-memory exception) and remembers that it did.
#[derive(Debug)]
pub struct MemoryCap {
    max_bytes: usize,
    /// Whether any growth was refused.
    pub refused: bool,
}

// === impl MemoryCap ===

impl MemoryCap {
    /// A cap of `pages` WebAssembly pages.
    pub fn new(pages: u64) -> MemoryCap {
        MemoryCap {
            max_bytes: usize::try_from(pages.saturating_mul(PAGE)).unwrap_or(usize::MAX),
            refused: false,
        }
    }
}

impl ResourceLimiter for MemoryCap {
    /// `Ok(false)` refuses the growth without a trap: `memory.grow` returns -1 to the
    /// guest. The initial memory goes through here too, so a module whose initial memory
    /// is above the cap fails to instantiate.
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.max_bytes;
        if !allowed {
            self.refused = true;
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
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

/// Advances an engine's epoch every `tick` on a thread of its own, until the engine is
/// dropped. A run's epoch callback runs once per tick while guest code runs and compares
/// the wall clock with the run's deadline, so a run ends no earlier than its deadline and
/// at most about one tick after it.
#[derive(Debug)]
pub struct EpochTicker;

// === impl EpochTicker ===

impl EpochTicker {
    /// Starts the thread. It holds only a weak reference, so it ends within one tick of
    /// the engine's last owner going away.
    pub fn start(engine: EngineWeak, tick: Duration) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(tick);
                    match engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => return,
                    }
                }
            })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_cap_defaults_to_256_mib_and_clamps_at_4_gib() {
        assert_eq!(memory_pages(0), 4096);
        assert_eq!(memory_pages(64), 1024);
        assert_eq!(memory_pages(1_000_000), MAX_MEMORY_PAGES);
    }

    #[test]
    fn growth_past_the_cap_is_refused_and_remembered() {
        let mut cap = MemoryCap::new(2);
        assert!(cap.memory_growing(0, 2 * 65536, None).expect("no trap"));
        assert!(!cap.refused);
        assert!(
            !cap.memory_growing(2 * 65536, 3 * 65536, None)
                .expect("no trap")
        );
        assert!(cap.refused);
    }
}
