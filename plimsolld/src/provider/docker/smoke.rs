//! The startup proof's container checks (providers.md §5.12, steps 2–4, 7 and 8).
//!
//! One throwaway container per image, shaped exactly like a run (the same create body, the
//! same run path), with a throwaway host Unix socket mounted where a run mounts its broker
//! socket. The probe inside (`smoke_probe.js`) reports what it sees; [`judge`] decides. Any
//! failed check refuses the start, naming the check.
//!
//! The snippet proof itself (step 6) is not here: it runs through `Provider::run_snippet`,
//! the path every caller's snippet takes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

use super::DockerError;
use super::container::{self, Context, Request};
use super::lockdown::Identity;
use super::preflight::VerifiedImage;
use super::settings::{OUTPUT_CAP, Settings};

/// The probe script, run with `node -`.
const PROBE: &str = include_str!("smoke_probe.js");
/// Each probe container's budget.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// The prefix of the throwaway socket's directory (the orphan sweep reaps stale ones).
pub const SOCKET_DIR_PREFIX: &str = "crsbx-smoke-sock-";
/// What the throwaway socket answers.
const PONG: &str = "pong";

/// What the probe reported.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeReport {
    /// `ok` when writing `/plimsoll-smoke` worked, else the error code.
    pub root_write: String,
    /// `/proc/mounts`, raw.
    pub mounts: String,
    /// Mount points that accepted a real write.
    pub writable: Vec<String>,
    /// The cgroup's `pids.max` as the guest reads it, if any.
    pub pids_max: Option<String>,
    /// `ulimit -u`: the process limit (`unlimited` under runc, where the cgroup holds it).
    pub nproc: Option<String>,
    /// `ulimit -c`: core dump size.
    pub core: Option<String>,
    /// `ulimit -n`: open files.
    pub nofile: Option<String>,
    /// Uid, Gid and Groups lines of `/proc/self/status`.
    pub status: ProbeIdentity,
    /// Interface names.
    pub interfaces: Vec<String>,
    /// What the host socket answered (`pong`), or why not.
    pub socket: String,
}

/// The identity lines of `/proc/self/status`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProbeIdentity {
    /// Real, effective, saved and fs uids.
    pub uid: Vec<String>,
    /// Real, effective, saved and fs gids.
    pub gid: Vec<String>,
    /// Supplementary groups.
    pub groups: Vec<String>,
}

// === impl HostSocket ===

/// A throwaway host Unix socket that answers every connection with `pong\n`, in a private
/// directory removed on drop.
pub struct HostSocket {
    dir: PathBuf,
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl HostSocket {
    /// Binds the socket (mode 0666: the guest uid connects to it).
    pub fn bind() -> Result<HostSocket, DockerError> {
        let dir =
            std::env::temp_dir().join(format!("{SOCKET_DIR_PREFIX}{}", container::random_hex()));
        let io = |source| DockerError::HostFile {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir(&dir).map_err(io)?;
        let path = dir.join("host-api.sock");
        let listener = UnixListener::bind(&path).map_err(io)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = stream.write_all(format!("{PONG}\n").as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(HostSocket { dir, path, task })
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the probe in a container of `image` (with `/work` when `work`) and judges it.
pub async fn probe_image(
    ctx: &Context<'_>,
    image: &VerifiedImage,
    work: bool,
    socket: &HostSocket,
) -> Result<ProbeReport, DockerError> {
    let smoke = |detail: String| DockerError::Smoke {
        check: "probe container",
        detail: format!("{}: {detail}", image.reference),
    };
    let finished = container::run(
        ctx,
        Request {
            image,
            argv: vec!["node".to_owned(), "-".to_owned()],
            run_env: Vec::new(),
            image_env: true,
            stdin: PROBE.as_bytes().to_vec(),
            timeout: PROBE_TIMEOUT,
            work,
            socket: Some(socket.path()),
            identity: Identity::Guest,
            role: "smoke",
            stdout_cap: OUTPUT_CAP,
            started: None,
        },
    )
    .await?;
    if finished.timed_out || finished.exit_code != 0 {
        return Err(smoke(format!(
            "the probe exited {} (timed out: {}): {}",
            finished.exit_code,
            finished.timed_out,
            String::from_utf8_lossy(&finished.stderr.0)
        )));
    }
    let report: ProbeReport = serde_json::from_slice(&finished.stdout.0)
        .map_err(|e| smoke(format!("unreadable probe report: {e}")))?;
    judge(&report, ctx.settings, work).map_err(|(check, detail)| DockerError::Smoke {
        check,
        detail: format!("{}: {detail}", image.reference),
    })?;
    Ok(report)
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    point: String,
    fstype: String,
    options: Vec<String>,
}

fn mount_lines(table: &str) -> Vec<MountLine> {
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let _device = fields.next()?;
            let point = unescape_octal(fields.next()?);
            let fstype = fields.next()?.to_owned();
            let options = fields.next()?.split(',').map(str::to_owned).collect();
            Some(MountLine {
                point,
                fstype,
                options,
            })
        })
        .collect()
}

/// `/proc/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && bytes
                .get(i + 1..i + 4)
                .is_some_and(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
        {
            let digit = |k: usize| u32::from(bytes[i + k] - b'0');
            out.push(u8::try_from(digit(1) * 64 + digit(2) * 8 + digit(3)).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A tmpfs `size=` option in bytes: plain bytes, or with a k, m or g suffix (runc's kernel
/// shows `size=16384k`, gVisor shows the option as given, `size=16m`).
fn size_bytes(option: &str) -> Option<u64> {
    let value = option.strip_prefix("size=")?;
    let (digits, unit) = match value.as_bytes().last()? {
        b'k' | b'K' => (&value[..value.len() - 1], 1024),
        b'm' | b'M' => (&value[..value.len() - 1], 1024 * 1024),
        b'g' | b'G' => (&value[..value.len() - 1], 1024 * 1024 * 1024),
        _ => (value, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// The checks of §5.12 step 4 on one report. The error names the check.
pub fn judge(
    report: &ProbeReport,
    settings: &Settings,
    work: bool,
) -> Result<(), (&'static str, String)> {
    let runsc = settings.runtime.is_runsc();
    // 1. The host socket answered.
    if report.socket != PONG {
        let hint = if runsc {
            " (register runsc with runtimeArgs [\"--host-uds=open\", \"--network=none\"] in /etc/docker/daemon.json)"
        } else {
            ""
        };
        return Err((
            "host socket",
            format!("the socket answered {:?}{hint}", report.socket),
        ));
    }
    // 2. The root is not writable, and mounted read-only.
    let mounts = mount_lines(&report.mounts);
    let root_ro = mounts
        .iter()
        .rev()
        .find(|m| m.point == "/")
        .is_some_and(|m| m.options.iter().any(|o| o == "ro"));
    if report.root_write == "ok" || !root_ro {
        return Err((
            "read-only root",
            format!(
                "writing /plimsoll-smoke gave {:?}; root mounted read-only: {root_ro}",
                report.root_write
            ),
        ));
    }
    // 3. No network interface but loopback.
    if report.interfaces != ["lo"] {
        return Err((
            "network none",
            format!("interfaces {:?}", report.interfaces),
        ));
    }
    // 4. Every identity is the guest uid.
    let uid = settings.guest_uid.to_string();
    let ids = [
        &report.status.uid,
        &report.status.gid,
        &report.status.groups,
    ];
    if ids
        .iter()
        .any(|v| v.is_empty() || v.iter().any(|id| *id != uid))
    {
        return Err((
            "guest uid",
            format!("{:?}, expected only {uid}", report.status),
        ));
    }
    // 5. The process limit, as the guest sees it: the cgroup under runc, RLIMIT_NPROC
    //    inside gVisor (whose pids.max the host proof checks).
    let pids = settings.pids.to_string();
    if runsc {
        if report.nproc.as_deref() != Some(pids.as_str()) {
            return Err((
                "pids limit",
                format!("max processes {:?}, expected {pids}", report.nproc),
            ));
        }
    } else if report.pids_max.as_deref() != Some(pids.as_str()) {
        return Err((
            "pids limit",
            format!("pids.max {:?}, expected {pids}", report.pids_max),
        ));
    }
    //    No core dumps (the host's core handler must never run), and the open-files cap.
    if report.core.as_deref() != Some("0") || report.nofile.as_deref() != Some("4096") {
        return Err((
            "rlimits",
            format!(
                "core {:?} and nofile {:?}, expected 0 and 4096",
                report.core, report.nofile
            ),
        ));
    }
    // 6. Each promised mount is a tmpfs of the promised size, noexec and nosuid. gVisor does
    //    not list nosuid in its mount table; there the guest's setuid escalation is refused by
    //    no-new-privileges and noexec, which the hostile suite checks.
    let promised = settings.writable_mounts(work);
    for (point, mb) in &promised {
        let Some(m) = mounts.iter().rev().find(|m| m.point == *point) else {
            return Err(("tmpfs mounts", format!("{point} is not mounted")));
        };
        let has = |o: &str| m.options.iter().any(|x| x == o);
        let size = m.options.iter().find_map(|o| size_bytes(o));
        let want = u64::from(*mb) * 1024 * 1024;
        if m.fstype != "tmpfs" || !has("noexec") || (!runsc && !has("nosuid")) || size != Some(want)
        {
            return Err((
                "tmpfs mounts",
                format!(
                    "{point} is {} {:?}, expected tmpfs noexec,nosuid,size={mb}m",
                    m.fstype, m.options
                ),
            ));
        }
    }
    // 7. The writable set is exactly the promised mounts.
    let mut writable: Vec<&str> = report.writable.iter().map(String::as_str).collect();
    writable.sort_unstable();
    let mut expected: Vec<&str> = promised.iter().map(|(p, _)| *p).collect();
    expected.sort_unstable();
    if writable != expected {
        return Err((
            "writable set",
            format!("writable {writable:?}, promised exactly {expected:?}"),
        ));
    }
    Ok(())
}

/// §5.12 step 8 under runsc, the `kernel` tier's evidence (not the registration's file
/// name, which a wrapper or a link to runc would also carry): the host process docker names
/// for a live sandbox is the registered runsc binary itself (the same file), its host cgroup
/// carries the host pids limit, and the kernel the guest reads is not the host's.
pub async fn prove_gvisor(
    ctx: &Context<'_>,
    image: &VerifiedImage,
    runsc_path: Option<&str>,
) -> Result<(), DockerError> {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let fail = |check: &'static str, detail: String| DockerError::Smoke { check, detail };
    let registered = runsc_path.and_then(resolve_binary).ok_or_else(|| {
        fail(
            "gvisor",
            format!("runsc's registered path {runsc_path:?} is not a file here"),
        )
    })?;
    let run = container::run(
        ctx,
        Request {
            image,
            argv: vec!["node".to_owned(), "-".to_owned()],
            run_env: Vec::new(),
            image_env: true,
            stdin: GUEST_KERNEL.as_bytes().to_vec(),
            timeout: PROBE_TIMEOUT,
            work: false,
            socket: None,
            identity: Identity::Guest,
            role: "smoke",
            stdout_cap: OUTPUT_CAP,
            started: Some(started_tx),
        },
    );
    let check = async {
        let id = started_rx
            .await
            .map_err(|_| fail("gvisor", "the container did not start".into()))?;
        let inspected = ctx.engine.inspect_container(&id).await?;
        let pid = inspected
            .state
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or_else(|| fail("gvisor", "docker states no host pid".into()))?;
        same_file(Path::new(&format!("/proc/{pid}/exe")), &registered).map_err(|why| {
            fail(
                "gvisor",
                format!(
                    "the sandbox's host process {pid} is not {}: {why}",
                    registered.display()
                ),
            )
        })?;
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map_err(|e| fail("host pids limit", format!("/proc/{pid}/cgroup: {e}")))?;
        let path = pids_cgroup_file(&cgroup, &id).map_err(|e| fail("host pids limit", e))?;
        let max = std::fs::read_to_string(&path)
            .map_err(|e| fail("host pids limit", format!("{}: {e}", path.display())))?;
        let want = ctx.settings.host_pids_limit().to_string();
        if max.trim() != want {
            return Err(fail(
                "host pids limit",
                format!("{} reads {:?}, expected {want}", path.display(), max.trim()),
            ));
        }
        Ok(())
    };
    let (ran, checked) = tokio::join!(run, check);
    checked?;
    let ran = ran?;
    let host = std::fs::read_to_string("/proc/version")
        .map_err(|e| fail("gvisor", format!("/proc/version: {e}")))?;
    let guest = String::from_utf8_lossy(&ran.stdout.0);
    if ran.exit_code != 0 || guest.trim().is_empty() {
        return Err(fail(
            "gvisor",
            format!(
                "the guest could not read its kernel version (exit {})",
                ran.exit_code
            ),
        ));
    }
    if guest.trim() == host.trim() {
        return Err(fail(
            "gvisor",
            "the guest reads the host's own kernel version: it is not under gVisor".into(),
        ));
    }
    Ok(())
}

/// What the gVisor probe's guest runs: prints the kernel version it sees, then stays up while
/// the host looks at its sandbox.
const GUEST_KERNEL: &str = "process.stdout.write(require('fs').readFileSync('/proc/version', 'utf8')); setTimeout(() => {}, 2000)";

/// The file a registered runtime path names: absolute, or found on this process's `PATH` as
/// dockerd would find a bare name.
fn resolve_binary(path: &str) -> Option<PathBuf> {
    let given = Path::new(path);
    if given.is_absolute() {
        return given.is_file().then(|| given.to_owned());
    }
    let search = std::env::var_os("PATH")?;
    std::env::split_paths(&search)
        .map(|dir| dir.join(given))
        .find(|candidate| candidate.is_file())
}

/// Whether `a` and `b` are the same file (device and inode, links followed).
fn same_file(a: &Path, b: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let of = |p: &Path| std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()));
    let (a_meta, b_meta) = (of(a)?, of(b)?);
    if (a_meta.dev(), a_meta.ino()) == (b_meta.dev(), b_meta.ino()) {
        return Ok(());
    }
    let named = std::fs::read_link(a).map_or_else(|_| "?".to_owned(), |t| t.display().to_string());
    Err(format!("it runs {named}"))
}

/// The host `pids.max` file for the cgroup in `proc_cgroup` (v1 `pids` line or v2 `0::`
/// line), which must name the container `id` (else plimsolld may be in another pid
/// namespace, and the file it would read belongs to someone else).
fn pids_cgroup_file(proc_cgroup: &str, id: &str) -> Result<PathBuf, String> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let file = if controllers.split(',').any(|c| c == "pids") {
            Path::new("/sys/fs/cgroup/pids")
                .join(path.trim_start_matches('/'))
                .join("pids.max")
        } else if controllers.is_empty() && line.starts_with("0::") {
            Path::new("/sys/fs/cgroup")
                .join(path.trim_start_matches('/'))
                .join("pids.max")
        } else {
            continue;
        };
        if !path.contains(id) {
            return Err(format!(
                "the sandbox's pids cgroup {path:?} does not name container {id}"
            ));
        }
        return Ok(file);
    }
    Err("no pids cgroup in /proc/<pid>/cgroup".to_owned())
}

#[cfg(test)]
mod tests;
