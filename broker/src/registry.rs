//! The loaded profiles: an immutable registry, swapped whole on reload.
//!
//! Readers take a snapshot (`Arc<Registry>`) and keep it as long as they like; a reload
//! builds a fresh registry and swaps the pointer, so no reader ever sees half a file. A run
//! holds its profile's `Arc` for its whole life, so a swap never changes a run in flight.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::env::Environment;
use crate::grants::{self, Callers, GrantsError, Profile};

/// One loaded grants file.
#[derive(Debug, Default)]
pub struct Registry {
    generation: u64,
    profiles: BTreeMap<String, Arc<Profile>>,
}

// === impl Registry ===

impl Registry {
    /// Loads and validates the file, reading the variables its profiles name from `env`.
    pub fn load(path: &Path, env: &dyn Environment, generation: u64) -> Result<Self, GrantsError> {
        let profiles = grants::load(path, env)?
            .into_iter()
            .map(|p| (p.name.clone(), Arc::new(p)))
            .collect();
        Ok(Self {
            generation,
            profiles,
        })
    }

    /// How many loads led to this registry (1 for the first).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of profiles.
    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    /// Whether there are no profiles.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// A profile by name.
    pub fn get(&self, name: &str) -> Option<&Arc<Profile>> {
        self.profiles.get(name)
    }

    /// Names of the profiles every authenticated caller may open (logged as a warning).
    pub fn open_to_everyone(&self) -> impl Iterator<Item = &str> {
        self.profiles
            .values()
            .filter(|p| p.callers == Callers::Any)
            .map(|p| p.name.as_str())
    }
}

/// The current registry, shared by the control server and the reloader.
#[derive(Debug)]
pub struct SharedRegistry(ArcSwap<Registry>);

// === impl SharedRegistry ===

impl SharedRegistry {
    /// Starts with `registry`.
    pub fn new(registry: Registry) -> Self {
        Self(ArcSwap::from_pointee(registry))
    }

    /// A snapshot of the current registry.
    pub fn current(&self) -> Arc<Registry> {
        self.0.load_full()
    }

    /// Swaps in a new registry.
    pub fn replace(&self, registry: Registry) {
        self.0.store(Arc::new(registry));
    }
}
