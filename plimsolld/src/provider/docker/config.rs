//! The docker provider's settings (config.md §2.4, providers.md §5.1–5.3), checked with the
//! rest of the configuration.
//!
//! Everything that needs no outside world is checked here: image reference shapes, pinning,
//! the runtime name, the seccomp setting's shape, the guest uid's range and systemd bands, and
//! the Engine endpoint (`DOCKER_HOST`, resolved once: a later change of the variable cannot
//! redirect runs). What needs the host (the uid in `/etc/passwd`, the seccomp file, the
//! daemon, its runtimes, the images) is the provider's preflight.
//!
//! `SANDBOX_DOCKER_*`, `DOCKER_HOST` and `DOCKER_CONTEXT` are only judged when the provider is
//! `docker`. The provider's hardened-mode rules (config.md §10: runsc for the kernel tier,
//! pinned images and a syscall filter, processes and a memory budget in the envelope) are
//! here too, on [`DockerConfig`]'s [`ProviderSettings`].

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::Docker;
use crate::config::env::*;
use crate::config::value::{self, ScalarError};
use crate::config::{Config, ConfigProblem, Reader, shown, shown_url};
use crate::provider::config::{ProviderSettings, SharedSettings};
use crate::provider::{Provider, ProviderError};

/// systemd's dynamic uid bands: a guest uid (or uid+1) inside one could be a host service's.
pub const SYSTEMD_UID_BANDS: &[(u32, u32)] =
    &[(60_001, 60_513), (60_578, 60_705), (61_184, 65_519)];
/// The largest guest uid: 65533 and up are `nogroup`/`nobody` and the 16-bit overflow ids.
pub const MAX_GUEST_UID: u32 = 65_532;

// === impl DockerRuntime ===

/// The OCI runtime containers start under.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DockerRuntime {
    /// Docker's default runtime (runc); no `--runtime` is sent. Tier `container`.
    #[default]
    Default,
    /// A named, registered runtime. Only `runsc` (gVisor) can earn the `kernel` tier, and only
    /// once preflight has read its registration.
    Named(String),
}

impl DockerRuntime {
    /// Whether this is gVisor's `runsc`.
    pub fn is_runsc(&self) -> bool {
        matches!(self, Self::Named(n) if n == "runsc")
    }

    /// The name sent to docker, or `None` for docker's default.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Default => None,
            Self::Named(n) => Some(n),
        }
    }
}

impl fmt::Display for DockerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("runc (docker's default)"))
    }
}

// === impl SeccompSetting ===

/// `SANDBOX_DOCKER_SECCOMP`. Never applied under runsc, which filters syscalls itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SeccompSetting {
    /// Empty or `default`: docker's built-in profile (no `seccomp=` option is sent).
    #[default]
    DockerDefault,
    /// `unconfined`: no syscall filter at all. Hardened mode refuses it.
    Unconfined,
    /// A profile in Docker's JSON format (the shipped one is `seccomp/profile.json`); preflight
    /// reads and parses it.
    Profile(PathBuf),
}

/// The docker provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerConfig {
    /// `SANDBOX_DOCKER_IMAGE`, exactly as written (never trimmed).
    pub image: String,
    /// `SANDBOX_DOCKER_PROJECT_IMAGE`, exactly as written.
    pub project_image: String,
    /// `SANDBOX_DOCKER_MODULE_IMAGE`, exactly as written; `None` when unset (modules are then
    /// unsupported).
    pub module_image: Option<String>,
    /// `SANDBOX_DOCKER_RUNTIME`.
    pub runtime: DockerRuntime,
    /// `SANDBOX_DOCKER_SECCOMP`.
    pub seccomp: SeccompSetting,
    /// `SANDBOX_GUEST_UID`: the uid and gid of every guest process; uid+1 is reserved as the
    /// checker identity of sessions.
    pub guest_uid: u32,
    /// `SANDBOX_REQUIRE_PINNED_IMAGES`.
    pub require_pinned_images: bool,
    /// The Engine's Unix socket, from `DOCKER_HOST`.
    pub socket: PathBuf,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            image: DEFAULT_DOCKER_IMAGE.to_owned(),
            project_image: DEFAULT_DOCKER_PROJECT_IMAGE.to_owned(),
            module_image: None,
            runtime: DockerRuntime::Default,
            seccomp: SeccompSetting::DockerDefault,
            guest_uid: DEFAULT_GUEST_UID,
            require_pinned_images: false,
            socket: PathBuf::from(DEFAULT_DOCKER_SOCKET),
        }
    }
}

/// Whether `reference` names content rather than a movable tag: `name@sha256:<64 hex>` (a
/// registry's manifest digest, as `images/build` records for its images), or a bare content id
/// `sha256:<64 hex>` (an image built or imported locally has no other pin).
pub fn is_pinned(reference: &str) -> bool {
    let digest = match reference.rsplit_once('@') {
        Some((name, digest)) if !name.is_empty() => digest,
        Some(_) => return false,
        None => reference,
    };
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// Why a guest uid is refused, before the host's account files are read.
pub fn guest_uid_problem(uid: u32) -> Option<String> {
    if !(1..=MAX_GUEST_UID).contains(&uid) {
        return Some(format!("must be between 1 and {MAX_GUEST_UID}"));
    }
    for id in [uid, uid + 1] {
        if let Some((lo, hi)) = SYSTEMD_UID_BANDS
            .iter()
            .find(|(lo, hi)| (*lo..=*hi).contains(&id))
        {
            return Some(format!(
                "{id} lies in systemd's dynamic uid band {lo}-{hi} (the uid and uid+1 must both stay outside 60001-60513, 60578-60705 and 61184-65519)"
            ));
        }
    }
    None
}

/// The Unix socket a `DOCKER_HOST` value names, or why it is refused.
pub fn docker_socket(value: &str) -> Result<PathBuf, &'static str> {
    if value.is_empty() {
        return Ok(PathBuf::from(DEFAULT_DOCKER_SOCKET));
    }
    let path = value.strip_prefix("unix://").unwrap_or(value);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else if value.contains("://") {
        Err("only a local unix:// socket is accepted; a remote docker endpoint is refused")
    } else {
        Err("must be unix:///absolute/path or an absolute socket path")
    }
}

/// Why an image reference is refused as written (and, with `pinned`, when it is not pinned).
pub(crate) fn image_reference_problem(reference: &str, pinned: bool) -> Option<&'static str> {
    if reference.is_empty() {
        Some("must not be empty")
    } else if reference.trim() != reference {
        Some("must not have surrounding whitespace")
    } else if reference.starts_with('-') {
        Some("must not start with '-'")
    } else if reference
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        Some("must not contain whitespace or control characters")
    } else if pinned && !is_pinned(reference) {
        Some(
            "must be pinned (name@sha256:<64 hex> or a sha256:<64 hex> content id) because SANDBOX_REQUIRE_PINNED_IMAGES is on",
        )
    } else {
        None
    }
}

fn runtime_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

// === impl ProviderSettings for DockerConfig ===

impl ProviderSettings for DockerConfig {
    fn read(r: &mut Reader<'_>, shared: &SharedSettings) -> DockerConfig {
        let mut config = DockerConfig {
            require_pinned_images: shared.require_pinned_images,
            ..DockerConfig::default()
        };
        let uid_text = r.trimmed(ENV_GUEST_UID);
        for (var, slot) in [
            (ENV_DOCKER_IMAGE, &mut config.image),
            (ENV_DOCKER_PROJECT_IMAGE, &mut config.project_image),
        ] {
            // Not trimmed: a reference with stray whitespace is refused, never repaired.
            if let Some(value) = r.env.get(var).filter(|v| !v.is_empty()) {
                *slot = value;
            }
            if let Some(reason) = image_reference_problem(slot, config.require_pinned_images) {
                r.problems.push(ConfigProblem::ProviderSetting {
                    var,
                    value: shown(slot),
                    reason: reason.to_owned(),
                });
            }
        }

        // Optional: unset (or empty) leaves modules unsupported rather than naming a default.
        if let Some(module) = r.env.get(ENV_DOCKER_MODULE_IMAGE).filter(|v| !v.is_empty()) {
            if let Some(reason) = image_reference_problem(&module, config.require_pinned_images) {
                r.problems.push(ConfigProblem::ProviderSetting {
                    var: ENV_DOCKER_MODULE_IMAGE,
                    value: shown(&module),
                    reason: reason.to_owned(),
                });
            }
            config.module_image = Some(module);
        }

        let runtime = r.trimmed(ENV_DOCKER_RUNTIME);
        config.runtime = if runtime.is_empty() {
            DockerRuntime::Default
        } else if runtime_name_ok(&runtime) {
            DockerRuntime::Named(runtime)
        } else {
            r.problems.push(ConfigProblem::ProviderSetting {
                var: ENV_DOCKER_RUNTIME,
                value: shown(&runtime),
                reason: "must be a runtime name such as runsc (letters, digits, '.', '_', '-')"
                    .into(),
            });
            DockerRuntime::Default
        };

        let seccomp = r.trimmed(ENV_DOCKER_SECCOMP);
        config.seccomp = match seccomp.as_str() {
            "" | "default" => SeccompSetting::DockerDefault,
            "unconfined" => SeccompSetting::Unconfined,
            path => SeccompSetting::Profile(PathBuf::from(path)),
        };

        if !uid_text.is_empty() {
            match value::parse_integer(&uid_text, 0, i64::from(u32::MAX)) {
                Ok(n) => {
                    let uid = u32::try_from(n).unwrap_or(0);
                    match guest_uid_problem(uid) {
                        None => config.guest_uid = uid,
                        Some(reason) => r.problems.push(ConfigProblem::ProviderSetting {
                            var: ENV_GUEST_UID,
                            value: shown(&uid_text),
                            reason,
                        }),
                    }
                }
                Err(ScalarError::NotInteger) => r.problems.push(ConfigProblem::NotInteger {
                    var: ENV_GUEST_UID,
                    value: shown(&uid_text),
                    example: "61000",
                }),
                Err(_) => r.problems.push(ConfigProblem::ProviderSetting {
                    var: ENV_GUEST_UID,
                    value: shown(&uid_text),
                    reason: format!("must be between 1 and {MAX_GUEST_UID}"),
                }),
            }
        }

        let host = r.trimmed(ENV_DOCKER_HOST);
        match docker_socket(&host) {
            Ok(socket) => config.socket = socket,
            Err(reason) => r.problems.push(ConfigProblem::ProviderSetting {
                var: ENV_DOCKER_HOST,
                value: shown_url(&host),
                reason: reason.to_owned(),
            }),
        }
        let context = r.trimmed(ENV_DOCKER_CONTEXT);
        if !context.is_empty() && context != "default" {
            r.problems.push(ConfigProblem::ProviderSetting {
                var: ENV_DOCKER_CONTEXT,
                value: shown(&context),
                reason: "docker contexts are not read (one could point at a remote daemon); \
                         unset it and set DOCKER_HOST=unix:///path/to/docker.sock"
                    .into(),
            });
        }
        config
    }

    fn highest_tier(&self) -> IsolationTier {
        // Only gVisor's runsc puts a kernel between guest and host.
        if self.runtime.is_runsc() {
            IsolationTier::Kernel
        } else {
            IsolationTier::Container
        }
    }

    fn tier_hint(&self) -> Option<String> {
        (!self.runtime.is_runsc()).then(|| format!(" (set {ENV_DOCKER_RUNTIME}=runsc for gVisor)"))
    }

    fn enforces_pids(&self) -> bool {
        true
    }

    fn enforces_disk(&self) -> bool {
        true
    }

    fn keeps_sessions(&self) -> bool {
        true
    }

    fn keeps_session_pool(&self) -> bool {
        true
    }

    fn has_guest_uid(&self) -> bool {
        true
    }

    fn guest_uid(&self) -> Option<u32> {
        Some(self.guest_uid)
    }

    /// Images pinned, and a syscall filter kept.
    fn surface_violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        if !self.require_pinned_images {
            violations.push(format!(
                "immutable surface: {ENV_REQUIRE_PINNED_IMAGES}=1 is required with the docker provider"
            ));
        }
        if self.seccomp == SeccompSetting::Unconfined {
            violations.push(format!(
                "immutable surface: {ENV_DOCKER_SECCOMP}=unconfined is not accepted"
            ));
        }
        violations
    }

    /// A process limit and a host memory budget: every container is a host cgroup.
    fn required_envelope(&self, config: &Config) -> Vec<(&'static str, f64)> {
        vec![
            (ENV_PIDS, f64::from(config.resources.pids)),
            (
                ENV_TOTAL_MEMORY_MB,
                f64::from(config.limits.total_memory_mb),
            ),
        ]
    }

    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(Docker::new(self, config)?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::hardened::hardened_violations;
    use crate::provider::config::ProviderConfig;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn pinned_means_a_digest_or_a_content_id() {
        assert!(is_pinned(&format!("plimsoll/sandbox@sha256:{HEX}")));
        assert!(is_pinned(&format!("sha256:{HEX}")));
        assert!(!is_pinned("plimsoll/sandbox:latest"));
        assert!(!is_pinned(&format!("@sha256:{HEX}")));
        assert!(!is_pinned(&format!("x@sha256:{}", &HEX[1..])));
        assert!(!is_pinned(&format!("x@sha256:{}", HEX.to_uppercase())));
    }

    #[test]
    fn guest_uid_rules_cover_range_and_both_ids_in_systemd_bands() {
        assert_eq!(guest_uid_problem(61_000), None);
        assert_eq!(guest_uid_problem(1), None);
        assert!(guest_uid_problem(0).is_some());
        assert!(guest_uid_problem(65_533).is_some());
        assert!(guest_uid_problem(60_001).is_some());
        // uid+1 enters a band.
        assert!(guest_uid_problem(60_000).unwrap().contains("60001"));
        assert!(guest_uid_problem(61_183).unwrap().contains("61184"));
        assert_eq!(guest_uid_problem(60_514), None);
    }

    #[test]
    fn docker_host_accepts_only_local_unix_sockets() {
        assert_eq!(
            docker_socket("").unwrap(),
            PathBuf::from("/var/run/docker.sock")
        );
        assert_eq!(
            docker_socket("unix:///run/d.sock").unwrap(),
            PathBuf::from("/run/d.sock")
        );
        assert_eq!(
            docker_socket("/run/d.sock").unwrap(),
            PathBuf::from("/run/d.sock")
        );
        for bad in [
            "tcp://10.0.0.1:2375",
            "ssh://host",
            "npipe:////./pipe/x",
            "d.sock",
            "unix://rel",
        ] {
            assert!(docker_socket(bad).is_err(), "{bad}");
        }
        assert!(
            docker_socket("tcp://127.0.0.1:2375")
                .unwrap_err()
                .contains("remote")
        );
    }

    #[test]
    fn image_references_are_checked_as_written() {
        assert_eq!(image_reference_problem("node:18", false), None);
        assert!(image_reference_problem("", false).is_some());
        assert!(image_reference_problem(" node", false).is_some());
        assert!(image_reference_problem("-v", false).is_some());
        assert!(image_reference_problem("a b", false).is_some());
        assert!(image_reference_problem("node:18", true).is_some());
        assert_eq!(
            image_reference_problem(&format!("sha256:{HEX}"), true),
            None
        );
    }

    fn docker_of(config: &Config) -> &DockerConfig {
        match &config.provider {
            ProviderConfig::Docker(docker) => docker,
            other => panic!("a docker configuration, not {other}"),
        }
    }

    fn from(pairs: &[(&str, &str)]) -> Result<crate::config::Config, Vec<String>> {
        let mut env: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.entry("PLIMSOLL_INSECURE".into()).or_insert("1".into());
        crate::config::Config::from_env(&env)
            .map_err(|e| e.problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn docker_defaults_are_the_locally_built_images_runc_and_uid_61000() {
        let config = from(&[("SANDBOX_PROVIDER", "docker")]).unwrap();
        let docker = docker_of(&config);
        assert_eq!(docker, &DockerConfig::default());
        assert_eq!(docker.image, "plimsoll/sandbox-node:latest");
        assert_eq!(docker.guest_uid, 61_000);
        assert_eq!(docker.socket, PathBuf::from("/var/run/docker.sock"));
    }

    #[test]
    fn docker_settings_are_read_when_the_provider_is_docker() {
        let config = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_RUNTIME", " runsc "),
            ("SANDBOX_DOCKER_SECCOMP", "/etc/plimsoll/seccomp.json"),
            ("SANDBOX_GUEST_UID", "50000"),
            ("SANDBOX_DOCKER_IMAGE", "mine:1"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
            ("DOCKER_CONTEXT", "default"),
        ])
        .unwrap();
        assert!(docker_of(&config).runtime.is_runsc());
        assert_eq!(
            docker_of(&config).seccomp,
            SeccompSetting::Profile("/etc/plimsoll/seccomp.json".into())
        );
        assert_eq!(docker_of(&config).guest_uid, 50_000);
        assert_eq!(docker_of(&config).image, "mine:1");
        assert_eq!(docker_of(&config).socket, PathBuf::from("/run/docker.sock"));
        let unconfined = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_SECCOMP", "unconfined"),
        ])
        .unwrap();
        assert_eq!(docker_of(&unconfined).seccomp, SeccompSetting::Unconfined);
    }

    #[test]
    fn every_bad_docker_setting_is_reported_together() {
        let problems = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", " node"),
            ("SANDBOX_DOCKER_RUNTIME", "a/b"),
            ("SANDBOX_GUEST_UID", "60001"),
            ("DOCKER_HOST", "tcp://127.0.0.1:2375"),
            ("DOCKER_CONTEXT", "remote"),
        ])
        .unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        for var in [
            "SANDBOX_DOCKER_IMAGE",
            "SANDBOX_DOCKER_RUNTIME",
            "SANDBOX_GUEST_UID",
            "DOCKER_HOST",
            "DOCKER_CONTEXT",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(var)),
                "{var}: {problems:?}"
            );
        }
    }

    #[test]
    fn the_module_image_is_optional_and_checked_like_the_others_when_set() {
        let unset = from(&[("SANDBOX_PROVIDER", "docker")]).unwrap();
        assert_eq!(docker_of(&unset).module_image, None);
        let empty = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_MODULE_IMAGE", ""),
        ]);
        assert_eq!(docker_of(&empty.unwrap()).module_image, None);
        let set = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            (
                "SANDBOX_DOCKER_MODULE_IMAGE",
                "plimsoll/sandbox-module:latest",
            ),
        ]);
        assert_eq!(
            docker_of(&set.unwrap()).module_image.as_deref(),
            Some("plimsoll/sandbox-module:latest")
        );
        for bad in [" x:1", "-x", "a b"] {
            let problems = from(&[
                ("SANDBOX_PROVIDER", "docker"),
                ("SANDBOX_DOCKER_MODULE_IMAGE", bad),
            ])
            .unwrap_err();
            assert!(
                problems[0].starts_with("SANDBOX_DOCKER_MODULE_IMAGE"),
                "{problems:?}"
            );
        }
        let pinned = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_REQUIRE_PINNED_IMAGES", "1"),
            ("SANDBOX_DOCKER_IMAGE", &format!("sha256:{HEX}")),
            ("SANDBOX_DOCKER_PROJECT_IMAGE", &format!("sha256:{HEX}")),
            (
                "SANDBOX_DOCKER_MODULE_IMAGE",
                "plimsoll/sandbox-module:latest",
            ),
        ])
        .unwrap_err();
        assert_eq!(pinned.len(), 1, "{pinned:?}");
    }

    #[test]
    fn pinning_refuses_tags_at_startup() {
        let problems = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_REQUIRE_PINNED_IMAGES", "1"),
        ])
        .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        let ok = from(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_REQUIRE_PINNED_IMAGES", "true"),
            ("SANDBOX_DOCKER_IMAGE", &format!("sha256:{HEX}")),
            (
                "SANDBOX_DOCKER_PROJECT_IMAGE",
                &format!("plimsoll/sandbox@sha256:{HEX}"),
            ),
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        assert!(from(&[("SANDBOX_REQUIRE_PINNED_IMAGES", "yes")]).is_err());
    }

    #[test]
    fn guest_uid_for_another_provider_is_refused_and_docker_host_is_ignored() {
        let problems =
            from(&[("SANDBOX_PROVIDER", "wasm"), ("SANDBOX_GUEST_UID", "61000")]).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("the wasm provider runs no guest under a host uid"),
            "{problems:?}"
        );
        // Another provider never judges the docker endpoint.
        assert!(from(&[("SANDBOX_PROVIDER", "wasm"), ("DOCKER_HOST", "tcp://x:1")]).is_ok());
    }

    #[test]
    fn runtime_names_are_plain_words() {
        assert!(runtime_name_ok("runsc"));
        assert!(runtime_name_ok("io.containerd.runc.v2"));
        assert!(!runtime_name_ok("run sc"));
        assert!(!runtime_name_ok(&"r".repeat(65)));
        assert!(!runtime_name_ok("a/b"));
    }

    // === hardened mode (config.md §10) ===

    /// Docker's settings that pass every hardened rule: runsc, pinned images.
    fn hardened_docker() -> DockerConfig {
        DockerConfig {
            runtime: DockerRuntime::Named("runsc".into()),
            require_pinned_images: true,
            ..DockerConfig::default()
        }
    }

    /// A configuration with `docker` that passes every other rule once `kernel` is proven.
    fn hardened_with(docker: DockerConfig) -> Config {
        let mut config = crate::config::hardened::passing();
        config.provider = ProviderConfig::Docker(docker);
        config.resources.pids = 256;
        config.limits.total_memory_mb = 4096;
        config
    }

    fn violations(config: &Config) -> Vec<String> {
        hardened_violations(config, Some(plimsoll::tier::IsolationTier::Kernel))
    }

    #[test]
    fn docker_under_runsc_with_pins_and_full_envelope_passes() {
        let config = hardened_with(hardened_docker());
        assert_eq!(violations(&config), Vec::<String>::new());
        assert!(hardened_violations(&config, None).is_empty());
    }

    #[test]
    fn sessions_on_without_a_per_caller_cap_are_a_violation() {
        let mut config = hardened_with(hardened_docker());
        config.sessions.max_sessions = 4;
        let found = hardened_violations(&config, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("SANDBOX_MAX_SESSIONS_PER_CALLER"),
            "{found:?}"
        );
        config.sessions.per_caller = 1;
        assert!(hardened_violations(&config, None).is_empty());
    }

    #[test]
    fn docker_under_runc_fails_isolation_before_any_proof() {
        let config = hardened_with(DockerConfig {
            runtime: DockerRuntime::Default,
            ..hardened_docker()
        });
        let found = hardened_violations(&config, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("can reach at most tier container"),
            "{found:?}"
        );
        assert!(
            found[0].contains("SANDBOX_DOCKER_RUNTIME=runsc"),
            "{found:?}"
        );
        let found = hardened_violations(&config, Some(plimsoll::tier::IsolationTier::Container));
        assert!(found[0].starts_with("isolation:"), "{found:?}");
    }

    #[test]
    fn docker_needs_pinned_images_and_a_syscall_filter() {
        let config = hardened_with(DockerConfig {
            require_pinned_images: false,
            seccomp: SeccompSetting::Unconfined,
            ..hardened_docker()
        });
        let found = violations(&config);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("SANDBOX_REQUIRE_PINNED_IMAGES=1"));
        assert!(found[1].contains("SANDBOX_DOCKER_SECCOMP=unconfined"));
        let config = hardened_with(DockerConfig {
            seccomp: SeccompSetting::Profile("seccomp/profile.json".into()),
            ..hardened_docker()
        });
        assert!(violations(&config).is_empty());
    }

    #[test]
    fn docker_envelope_also_needs_pids_and_a_memory_budget() {
        let mut config = hardened_with(hardened_docker());
        config.resources.pids = 0;
        config.limits.total_memory_mb = 0;
        let found = violations(&config);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|v| v.contains("SANDBOX_PIDS")));
        assert!(found.iter().any(|v| v.contains("SANDBOX_TOTAL_MEMORY_MB")));
    }
}
