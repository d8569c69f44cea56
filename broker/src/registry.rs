//! The loaded profiles: an immutable registry, swapped whole on reload.
//!
//! Readers take a snapshot (`Arc<Registry>`) and keep it as long as they like; a reload
//! builds a fresh registry and swaps the pointer, so no reader ever sees half a file. A run
//! holds its profile's `Arc` for its whole life, so a swap never changes a run in flight.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use crate::control::protocol::{Catalogue, CatalogueEntry};
use crate::env::Environment;
use crate::grants::{self, Callers, GrantsError, Profile};

/// One loaded grants file.
#[derive(Debug, Default)]
pub struct Registry {
    generation: u64,
    profiles: BTreeMap<String, Arc<Profile>>,
    catalogue: Arc<Catalogue>,
}

// === impl Registry ===

impl Registry {
    /// Loads and validates the file, reading the variables its profiles name from `env`.
    pub fn load(path: &Path, env: &dyn Environment, generation: u64) -> Result<Self, GrantsError> {
        let profiles = grants::load(path, env)?
            .into_iter()
            .map(|p| (p.name.clone(), Arc::new(p)))
            .collect();
        Ok(Self::of(profiles, generation))
    }

    fn of(profiles: BTreeMap<String, Arc<Profile>>, generation: u64) -> Self {
        let catalogue = Arc::new(catalogue(&profiles));
        Self {
            generation,
            profiles,
            catalogue,
        }
    }

    /// The credential-free catalogue plimsolld checks requests against.
    pub fn catalogue(&self) -> Arc<Catalogue> {
        self.catalogue.clone()
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

/// The catalogue of `profiles`, its fingerprint a SHA-256 of the entries' JSON.
fn catalogue(profiles: &BTreeMap<String, Arc<Profile>>) -> Catalogue {
    let entries: Vec<CatalogueEntry> = profiles
        .values()
        .map(|p| CatalogueEntry {
            name: p.name.clone(),
            allowed_callers: match &p.callers {
                Callers::Any => vec!["*".to_owned()],
                Callers::Only(ids) => ids.iter().cloned().collect(),
            },
            allow_in_sessions: p.allow_in_sessions,
        })
        .collect();
    let text = serde_json::to_vec(&entries).unwrap_or_default();
    Catalogue {
        fingerprint: hex::encode(Sha256::digest(&text)),
        profiles: entries,
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
