//! The operator's provider (`SANDBOX_PROVIDER`) with that provider's own settings: one
//! [`ProviderConfig`] variant per provider this build has.
//!
//! Everything the daemon knows about a provider before it exists lives with that provider, on
//! its settings type, behind [`ProviderSettings`]: how its variables are read and checked,
//! the facts the configuration checks use (the strongest tier it could prove, which limits
//! it enforces, whether it keeps sessions), its hardened-mode rules and its constructor.
//! The configuration, hardened mode and startup ask [`ProviderConfig::settings`] and never
//! match on a provider.
//!
//! Adding a provider: a module with its settings type implementing [`ProviderSettings`]
//! (and its variables in `config/env.rs`, the one table of variables), then one line in the
//! list at the end of this file.

use std::fmt;
use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::{Provider, ProviderError, disabled};
use crate::config::{Config, Reader};

/// Settings that several providers read, checked once before any provider's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedSettings {
    /// `SANDBOX_REQUIRE_PINNED_IMAGES`: every image (or template) must be named by content.
    pub require_pinned_images: bool,
}

/// One provider's settings: how they are read, what they allow, and how the provider is
/// built from them. Implemented by each provider's settings type.
pub trait ProviderSettings: fmt::Debug + Send + Sync + 'static {
    /// Reads and checks the provider's own variables, pushing every problem onto `r`
    /// (a usable placeholder is returned either way, so every other variable still gets
    /// checked). Reads nothing outside the environment.
    fn read(r: &mut Reader<'_>, shared: &SharedSettings) -> Self
    where
        Self: Sized;

    /// Whether the provider can run code (all but `disabled`): such a provider needs
    /// authentication unless `PLIMSOLL_INSECURE=1`.
    fn runs_code(&self) -> bool {
        true
    }

    /// The strongest tier these settings could ever prove. Hardened mode judges it before
    /// the startup proof, so a provider that cannot reach `kernel` fails without running
    /// anything.
    fn highest_tier(&self) -> IsolationTier;

    /// How the operator could raise [`highest_tier`](Self::highest_tier), as a clause
    /// hardened mode appends to its isolation violation (e.g. `" (set … for gVisor)"`).
    fn tier_hint(&self) -> Option<String> {
        None
    }

    /// The most `SANDBOX_MEMORY_MB` a run can be given; more is refused at startup (Describe
    /// would state memory no run gets).
    fn max_memory_mb(&self) -> Option<u32> {
        None
    }

    /// Whether the provider enforces `SANDBOX_CPUS`; a value above 0 is refused at startup
    /// otherwise (providers.md §3.2: wasm's CPU is bounded only by the deadline).
    fn enforces_cpus(&self) -> bool {
        true
    }

    /// Whether the provider enforces `SANDBOX_PIDS` (config.md §2.3); a value above 0 is
    /// refused at startup otherwise.
    fn enforces_pids(&self) -> bool;

    /// Whether the provider enforces `SANDBOX_DISK_MB` (config.md §2.3); a value above 0 is
    /// refused at startup otherwise, and hardened mode demands it only where it is enforced.
    fn enforces_disk(&self) -> bool;

    /// Whether the provider bills by the second, so `SANDBOX_PAID_SECONDS_PER_DAY` can bound
    /// it; the variable is refused otherwise.
    fn metered(&self) -> bool {
        false
    }

    /// Whether the provider keeps sessions; `SANDBOX_MAX_SESSIONS` above 0 is refused
    /// otherwise.
    fn keeps_sessions(&self) -> bool {
        false
    }

    /// Whether the provider keeps a warm session pool; `SANDBOX_SESSION_POOL` above 0 is
    /// refused otherwise.
    fn keeps_session_pool(&self) -> bool {
        false
    }

    /// Whether the provider's guests run as the host uid `SANDBOX_GUEST_UID` names; setting
    /// it for any other provider is refused (it would promise an identity nothing enforces).
    fn has_guest_uid(&self) -> bool {
        false
    }

    /// The host uid the provider's guests connect to a grant socket from, if it is one of
    /// their own (docker's `SANDBOX_GUEST_UID`): the supervised broker answers it.
    fn guest_uid(&self) -> Option<u32> {
        None
    }

    /// The guard URL granted sandboxes reach (`E2B_GUARD_URL`), when the provider has one:
    /// `PLIMSOLL_GUARD_ADDR` is then required, and refused otherwise.
    fn guard_url(&self) -> Option<String> {
        None
    }

    /// Hardened mode's rule 4 (immutable surface, config.md §10): one sentence per
    /// violation. None by default.
    fn surface_violations(&self) -> Vec<String> {
        Vec::new()
    }

    /// Hardened mode's rule 5 beyond memory, CPUs and (where enforced) disk: further
    /// variables that must be set above 0, with their values.
    fn required_envelope(&self, config: &Config) -> Vec<(&'static str, f64)> {
        let _ = config;
        Vec::new()
    }

    /// Builds the provider from these settings and the rest of `config`. Only configuration
    /// is read here; nothing is started.
    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError>;
}

/// A provider this build has: its id and how its settings are read.
#[derive(Clone, Copy)]
pub struct KnownProvider {
    /// The name `SANDBOX_PROVIDER` takes.
    pub name: &'static str,
    /// Reads the provider's settings.
    pub read: fn(&mut Reader<'_>, &SharedSettings) -> ProviderConfig,
}

impl fmt::Debug for KnownProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl KnownProvider {
    /// Looks up a trimmed, lower-cased name among [`KNOWN_PROVIDERS`].
    pub fn find(name: &str) -> Option<&'static KnownProvider> {
        KNOWN_PROVIDERS.iter().find(|p| p.name == name)
    }
}

// === impl ProviderConfig ===

impl ProviderConfig {
    /// Builds the provider (nothing is started).
    pub fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        self.settings().build(config)
    }
}

impl Default for ProviderConfig {
    /// `disabled`, the provider of an empty environment.
    fn default() -> ProviderConfig {
        ProviderConfig::Disabled(disabled::DisabledConfig)
    }
}

impl fmt::Display for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Makes [`ProviderConfig`] (a variant per provider), its dispatch to the variant's
/// [`ProviderSettings`] and [`KNOWN_PROVIDERS`] from one list: a provider is one line there.
macro_rules! providers {
    ($( $(#[$cfg:meta])* $variant:ident($settings:ty) = $id:expr, )*) => {
        /// The operator's provider with its settings, checked: one variant per provider this
        /// build has.
        #[derive(Debug, Clone, PartialEq)]
        pub enum ProviderConfig {
            $( $(#[$cfg])* #[doc = concat!("`", stringify!($variant), "`'s settings.")] $variant($settings), )*
        }

        impl ProviderConfig {
            /// The provider's id (`disabled`, `wasm`, `docker`, …).
            pub fn name(&self) -> &'static str {
                match self {
                    $( $(#[$cfg])* Self::$variant(_) => $id, )*
                }
            }

            /// The provider's settings: its facts, rules and constructor.
            pub fn settings(&self) -> &dyn ProviderSettings {
                match self {
                    $( $(#[$cfg])* Self::$variant(settings) => settings, )*
                }
            }
        }

        /// Every provider this build has, in help-text order.
        pub const KNOWN_PROVIDERS: &[KnownProvider] = &[
            $( $(#[$cfg])* KnownProvider {
                name: $id,
                read: |r, shared| {
                    ProviderConfig::$variant(<$settings as ProviderSettings>::read(r, shared))
                },
            }, )*
        ];
    };
}

// The providers this build has, in help-text order, one line each: the variant, the
// provider's settings type, and its id (the name `SANDBOX_PROVIDER` takes and the `sandbox`
// that `Describe` and every record state).
providers! {
    Disabled(disabled::DisabledConfig) = disabled::ID,
    #[cfg(feature = "wasm")]
    Wasm(super::wasm::WasmConfig) = super::wasm::ID,
    #[cfg(feature = "docker")]
    Docker(super::docker::config::DockerConfig) = super::docker::ID,
    #[cfg(feature = "openshell")]
    OpenShell(super::openshell::config::OpenShellConfig) = super::openshell::ID,
    #[cfg(feature = "e2b")]
    E2b(super::e2b::config::E2bConfig) = super::e2b::ID,
    #[cfg(feature = "dockercloud")]
    DockerCloud(super::dockercloud::config::DockerCloudConfig) = super::dockercloud::ID,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Providers whose settings have no default: an empty environment is a problem for them
    /// (each about their own variables only).
    const REQUIRED_SETTINGS: &[&str] = &["openshell", "e2b", "dockercloud"];

    #[test]
    fn every_known_provider_reads_settings_under_its_own_name() {
        let env = HashMap::new();
        for known in KNOWN_PROVIDERS {
            let mut r = Reader::new(&env);
            let config = (known.read)(&mut r, &SharedSettings::default());
            assert_eq!(config.name(), known.name);
            if REQUIRED_SETTINGS.contains(&known.name) {
                let prefix = format!("SANDBOX_{}_", known.name.to_uppercase());
                let own = format!("{}_", known.name.to_uppercase());
                // Docker's own names for its credentials.
                let docker = "DOCKER_SBX_";
                assert!(
                    r.problems.iter().all(|p| p.variable().starts_with(&prefix)
                        || p.variable().starts_with(&own)
                        || (known.name == "dockercloud" && p.variable().starts_with(docker))),
                    "{known:?}: {:?}",
                    r.problems
                );
            } else {
                assert!(r.problems.is_empty(), "{known:?}: {:?}", r.problems);
            }
            assert_eq!(
                KnownProvider::find(known.name).map(|k| k.name),
                Some(known.name)
            );
        }
        assert!(KnownProvider::find("firecracker").is_none());
    }

    #[test]
    fn only_disabled_runs_nothing() {
        for known in KNOWN_PROVIDERS {
            let config = (known.read)(
                &mut Reader::new(&HashMap::new()),
                &SharedSettings::default(),
            );
            assert_eq!(
                config.settings().runs_code(),
                known.name != "disabled",
                "{known:?}"
            );
        }
        assert_eq!(ProviderConfig::default().name(), "disabled");
    }
}
