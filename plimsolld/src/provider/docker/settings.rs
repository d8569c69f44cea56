//! What the docker provider enforces on every container, derived once from the configuration
//! (providers.md §5.1): the envelope with its defaults, the tmpfs sizes the disk budget
//! allows, the process limits for each runtime, and the timeouts.

use std::path::PathBuf;
use std::time::Duration;

use super::config::{DockerConfig, DockerRuntime, SeccompSetting};
use crate::config::Resources;

use super::DockerError;

/// Memory per run when `SANDBOX_MEMORY_MB` is 0.
pub const DEFAULT_MEMORY_MB: u32 = 256;
/// CPUs per run when `SANDBOX_CPUS` is 0.
pub const DEFAULT_CPUS: f64 = 1.0;
/// Processes per run when `SANDBOX_PIDS` is 0.
pub const DEFAULT_PIDS: u32 = 256;
/// `/tmp` and `/dev/shm`, each, in MiB.
pub const SMALL_TMPFS_MB: u32 = 16;
/// `/work` when no disk budget is set, in MiB.
pub const DEFAULT_WORK_MB: u32 = 128;
/// A snippet's timeout when the request states none.
pub const SNIPPET_DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest timeout a snippet may ask for.
pub const SNIPPET_MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// Host threads a gVisor sandbox may use per guest process. Measured here (runsc 2022-12,
/// ptrace platform): a guest at its 256-process limit peaked at 2423 host pids, about 9.5
/// per process, and an idle sandbox uses about 40. The host `pids.max` under runsc is this
/// factor times the guest limit, so the host limit is a backstop that never fires first.
pub const RUNSC_HOST_PIDS_PER_GUEST_PROCESS: u32 = 16;
/// Per-stream output cap (defined with the output capping every provider shares).
pub use crate::provider::guest::output::OUTPUT_CAP;

/// The provider's fixed view of its configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The snippet image reference, as configured.
    pub snippet_image: String,
    /// The project image reference, as configured.
    pub project_image: String,
    /// The module image reference, as configured; `None`: modules are unsupported.
    pub module_image: Option<String>,
    /// The OCI runtime.
    pub runtime: DockerRuntime,
    /// The seccomp setting (ignored under runsc).
    pub seccomp: SeccompSetting,
    /// The guest uid and gid.
    pub guest_uid: u32,
    /// The Engine socket.
    pub socket: PathBuf,
    /// Memory and memory+swap, MiB.
    pub memory_mb: u32,
    /// CPUs.
    pub cpus: f64,
    /// Guest processes: the cgroup `pids.max` under runc; `RLIMIT_NPROC` inside the gVisor
    /// kernel under runsc (where it counts only this sandbox's processes).
    pub pids: u32,
    /// `/tmp` and `/dev/shm`, MiB each.
    pub small_tmpfs_mb: u32,
    /// `/work`, MiB.
    pub work_mb: u32,
}

impl Settings {
    /// The settings for `docker` under the envelope `r`; fails when the disk budget cannot
    /// hold the mounts.
    pub fn new(docker: &DockerConfig, r: Resources) -> Result<Settings, DockerError> {
        let work_mb = if r.disk_mb == 0 {
            DEFAULT_WORK_MB
        } else {
            let work = i64::from(r.disk_mb) - 2 * i64::from(SMALL_TMPFS_MB);
            if work < 1 {
                return Err(DockerError::DiskBudget {
                    disk_mb: r.disk_mb,
                    needed_mb: 2 * SMALL_TMPFS_MB + 1,
                });
            }
            u32::try_from(work).unwrap_or(DEFAULT_WORK_MB)
        };
        Ok(Settings {
            snippet_image: docker.image.clone(),
            project_image: docker.project_image.clone(),
            module_image: docker.module_image.clone(),
            runtime: docker.runtime.clone(),
            seccomp: docker.seccomp.clone(),
            guest_uid: docker.guest_uid,
            socket: docker.socket.clone(),
            memory_mb: if r.memory_mb == 0 {
                DEFAULT_MEMORY_MB
            } else {
                r.memory_mb
            },
            cpus: if r.cpus > 0.0 { r.cpus } else { DEFAULT_CPUS },
            pids: if r.pids == 0 { DEFAULT_PIDS } else { r.pids },
            small_tmpfs_mb: SMALL_TMPFS_MB,
            work_mb,
        })
    }

    /// The cgroup `pids.max` docker sets on the host. Under runsc the cgroup counts the
    /// sandbox's host threads, not guest processes, so it is scaled (see
    /// [`RUNSC_HOST_PIDS_PER_GUEST_PROCESS`]) and the guest limit is `RLIMIT_NPROC`.
    pub fn host_pids_limit(&self) -> u32 {
        if self.runtime.is_runsc() {
            self.pids.saturating_mul(RUNSC_HOST_PIDS_PER_GUEST_PROCESS)
        } else {
            self.pids
        }
    }

    /// `RLIMIT_NPROC` for the guest, only under runsc: under runc the limit would count every
    /// process of the guest uid on the whole host, so concurrent runs would share it.
    pub fn guest_nproc_limit(&self) -> Option<u32> {
        self.runtime.is_runsc().then_some(self.pids)
    }

    /// Memory in bytes (also the memory+swap limit, so swap is off).
    pub fn memory_bytes(&self) -> i64 {
        i64::from(self.memory_mb) * 1024 * 1024
    }

    /// CPUs in billionths, docker's `NanoCpus`.
    pub fn nano_cpus(&self) -> i64 {
        // Finite and non-negative by config validation; the cast saturates.
        (self.cpus * 1e9) as i64
    }

    /// The `--user` value.
    pub fn user(&self) -> String {
        format!("{0}:{0}", self.guest_uid)
    }

    /// Whether docker's seccomp option is sent at all: never under runsc.
    pub fn seccomp_applies(&self) -> bool {
        !self.runtime.is_runsc() && self.seccomp != SeccompSetting::DockerDefault
    }

    /// The writable mounts a container gets, as (mount point, MiB).
    pub fn writable_mounts(&self, work: bool) -> Vec<(&'static str, u32)> {
        let mut mounts = vec![
            ("/tmp", self.small_tmpfs_mb),
            ("/dev/shm", self.small_tmpfs_mb),
        ];
        if work {
            mounts.push(("/work", self.work_mb));
        }
        mounts
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
impl Settings {
    /// The settings a checked docker configuration gives (tests build them from variables).
    pub(crate) fn from_config(config: &crate::config::Config) -> Result<Settings, DockerError> {
        match &config.provider {
            crate::provider::config::ProviderConfig::Docker(docker) => {
                Settings::new(docker, config.resources)
            }
            other => panic!("a docker configuration, not {other}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, DockerError> {
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.insert("SANDBOX_PROVIDER".into(), "docker".into());
        env.insert("PLIMSOLL_INSECURE".into(), "1".into());
        Settings::from_config(&Config::from_env(&env).unwrap())
    }

    #[test]
    fn zero_means_the_docker_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!((s.memory_mb, s.cpus, s.pids), (256, 1.0, 256));
        assert_eq!(
            s.writable_mounts(true),
            [("/tmp", 16), ("/dev/shm", 16), ("/work", 128)]
        );
        assert_eq!(s.writable_mounts(false).len(), 2);
        assert_eq!(s.memory_bytes(), 256 << 20);
        assert_eq!(s.nano_cpus(), 1_000_000_000);
        assert_eq!(s.user(), "61000:61000");
    }

    #[test]
    fn disk_budget_sizes_work_and_must_hold_every_mount() {
        let s = settings(&[("SANDBOX_DISK_MB", "100")]).unwrap();
        assert_eq!(s.work_mb, 68);
        assert_eq!(settings(&[("SANDBOX_DISK_MB", "33")]).unwrap().work_mb, 1);
        assert!(matches!(
            settings(&[("SANDBOX_DISK_MB", "32")]),
            Err(DockerError::DiskBudget { disk_mb: 32, .. })
        ));
    }

    #[test]
    fn runsc_scales_the_host_pids_limit_and_moves_the_guest_limit_inside() {
        let runc = settings(&[("SANDBOX_PIDS", "100")]).unwrap();
        assert_eq!(runc.host_pids_limit(), 100);
        assert_eq!(runc.guest_nproc_limit(), None);
        let runsc =
            settings(&[("SANDBOX_PIDS", "100"), ("SANDBOX_DOCKER_RUNTIME", "runsc")]).unwrap();
        assert_eq!(runsc.host_pids_limit(), 1600);
        assert_eq!(runsc.guest_nproc_limit(), Some(100));
    }

    #[test]
    fn seccomp_is_never_sent_under_runsc_or_by_default() {
        assert!(!settings(&[]).unwrap().seccomp_applies());
        assert!(
            settings(&[("SANDBOX_DOCKER_SECCOMP", "unconfined")])
                .unwrap()
                .seccomp_applies()
        );
        assert!(
            !settings(&[
                ("SANDBOX_DOCKER_SECCOMP", "/p.json"),
                ("SANDBOX_DOCKER_RUNTIME", "runsc")
            ])
            .unwrap()
            .seccomp_applies()
        );
    }
}
