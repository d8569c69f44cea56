//! The wasm provider's settings. It has no variables of its own: its envelope is the
//! daemon's (`SANDBOX_MEMORY_MB` caps the guest's linear memory), and it refuses the limits
//! it cannot enforce (`SANDBOX_PIDS`, `SANDBOX_DISK_MB`).

use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::Wasm;
use crate::config::{Config, Reader};
use crate::provider::config::{ProviderSettings, SharedSettings};
use crate::provider::{Provider, ProviderError};

/// The wasm provider's settings: none beyond the daemon's envelope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WasmConfig;

impl ProviderSettings for WasmConfig {
    fn read(_r: &mut Reader<'_>, _shared: &SharedSettings) -> WasmConfig {
        WasmConfig
    }

    fn highest_tier(&self) -> IsolationTier {
        IsolationTier::Process
    }

    fn max_memory_mb(&self) -> Option<u32> {
        // What a 32-bit linear memory can address.
        Some(4096)
    }

    // One process in plimsolld, no file system: neither limit means anything to the guest.
    fn enforces_cpus(&self) -> bool {
        // Only the deadline bounds a run's CPU.
        false
    }

    fn enforces_pids(&self) -> bool {
        false
    }

    fn enforces_disk(&self) -> bool {
        false
    }

    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(Wasm::new(config)))
    }
}
