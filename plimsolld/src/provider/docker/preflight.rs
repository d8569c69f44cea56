//! Preflight: the cheap checks that run at startup, lazily before runs and behind `/readyz`
//! (providers.md §5.11), in the spec's order. It never starts a container.
//!
//! Steps 1, 2 and 4 (image reference shapes, the writable budget, pinning) and the endpoint
//! rules of step 7 are configuration, already checked before the daemon built this provider.
//! What is left here needs the host: the guest uid against the host's accounts (3), the seccomp
//! profile file (5), the Engine on its pinned socket (7), the runtime registration (8), and one
//! whole-object inspection per image (10), which also gives each image its software identity
//! from docker's own records ([`super::identity`], step 11). There is no docker CLI to find
//! (6), and no platform is chosen (9): containers start the inspected content id, whose
//! platform the identity states.

use std::path::Path;

use bollard::models::ImageInspect;

use crate::provider::docker::config::SeccompSetting;

use super::DockerError;
use super::engine::Engine;
use super::identity::{self, ImageStore, Unstated};
use super::settings::Settings;

/// A seccomp profile larger than this is refused unread.
const MAX_PROFILE_BYTES: u64 = 1024 * 1024;
/// Image ENV names a dynamic loader reads before `env -i` could clear them.
const LOADER_VARIABLES: &[&str] = &["GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "GCONV_PATH"];
/// Search paths that must not lead into a writable mount.
const SEARCH_PATHS: &[&str] = &["PATH", "NODE_PATH", "PYTHONPATH"];
/// The writable mounts of every container.
const WRITABLE: &[&str] = &["/tmp", "/dev/shm", "/work"];

/// One image as inspected: runs start its id, never the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedImage {
    /// The reference as configured.
    pub reference: String,
    /// The content id, `sha256:<64 hex>`.
    pub id: String,
    /// The image's ENV, checked, delivered to the guest through the start script.
    pub env: Vec<String>,
    /// Its software identity, `oci-manifest:<platform>@sha256:<64 hex>`, or why docker's
    /// records give it none.
    pub software: Result<String, Unstated>,
}

impl VerifiedImage {
    /// The software identity `Describe`, the rule check and records state: "" when there is
    /// none (which satisfies no rule).
    pub fn software_identity(&self) -> String {
        self.software.clone().unwrap_or_default()
    }
}

/// What the runtime registration showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEvidence {
    /// The configured runtime's name (`runc` for docker's default).
    pub name: String,
    /// The registered path, when docker states one.
    pub path: Option<String>,
    /// The `kernel` tier's precondition: runsc is configured and registered under a path
    /// whose file name is `runsc` (the startup proof then sees gVisor at work:
    /// `smoke::prove_gvisor`).
    pub runsc_verified: bool,
}

/// Everything preflight verified, published as one value.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The Engine.
    pub engine: Engine,
    /// The snippet image.
    pub snippet: VerifiedImage,
    /// The project image.
    pub project: VerifiedImage,
    /// The module image, when one is configured.
    pub module: Option<VerifiedImage>,
    /// The runtime.
    pub runtime: RuntimeEvidence,
    /// The seccomp profile text to send with every container, when one applies.
    pub seccomp: Option<String>,
    /// Docker's version, for the log.
    pub server_version: String,
}

/// Runs every check in order against `engine`.
pub async fn run(settings: &Settings, engine: &Engine) -> Result<Verified, DockerError> {
    // 3. The guest uid (and uid+1) belong to no host account or group.
    check_host_accounts(
        settings.guest_uid,
        Path::new("/etc/passwd"),
        Path::new("/etc/group"),
    )?;
    // 5. The seccomp profile exists and parses.
    let seccomp = seccomp_profile(settings)?;
    // 7. One local daemon on the pinned socket.
    engine.ping().await?;
    let info = engine.info().await?;
    if let Some(os) = info.os_type.as_deref()
        && os != "linux"
    {
        return Err(DockerError::NotLinux(os.to_owned()));
    }
    // 8. The runtime is registered; runsc under a path named runsc.
    let runtime = runtime_evidence(settings, &info)?;
    // 10–11. Each image once, as a whole object; its identity from the same answer.
    let store = ImageStore::from_driver_status(info.driver_status.as_deref());
    let snippet = verify_image(engine, &settings.snippet_image, store).await?;
    let project = if settings.project_image == settings.snippet_image {
        snippet.clone()
    } else {
        verify_image(engine, &settings.project_image, store).await?
    };
    let module = match &settings.module_image {
        None => None,
        Some(reference) if *reference == project.reference => Some(project.clone()),
        Some(reference) => Some(verify_image(engine, reference, store).await?),
    };
    let server_version = match info.server_version {
        Some(v) => v,
        None => engine.version().await?.version.unwrap_or_default(),
    };
    // 12. Published by the caller, atomically.
    Ok(Verified {
        engine: engine.clone(),
        snippet,
        project,
        module,
        runtime,
        seccomp,
        server_version,
    })
}

/// Step 3: neither the guest uid nor uid+1 may be a host account's uid, a primary gid, or a
/// group's gid (under runc without user namespaces an escaped process would act as that
/// account).
pub fn check_host_accounts(uid: u32, passwd: &Path, group: &Path) -> Result<(), DockerError> {
    for (path, fields) in [(passwd, &[2usize, 3][..]), (group, &[2usize][..])] {
        let text = std::fs::read_to_string(path).map_err(|source| DockerError::HostFile {
            path: path.to_path_buf(),
            source,
        })?;
        if let Some((id, line)) = account_using(&text, fields, [uid, uid + 1]) {
            return Err(DockerError::GuestUidTaken {
                uid: id,
                file: path.to_path_buf(),
                entry: line,
            });
        }
    }
    Ok(())
}

/// The first id of `ids` found in one of `fields` (0-based, `:`-separated) of `text`, with the
/// entry's name.
fn account_using(text: &str, fields: &[usize], ids: [u32; 2]) -> Option<(u32, String)> {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let parts: Vec<&str> = line.split(':').collect();
        for &field in fields {
            if let Some(id) = parts.get(field).and_then(|v| v.trim().parse::<u32>().ok())
                && ids.contains(&id)
            {
                return Some((id, parts[0].to_owned()));
            }
        }
    }
    None
}

fn seccomp_profile(settings: &Settings) -> Result<Option<String>, DockerError> {
    match &settings.seccomp {
        SeccompSetting::DockerDefault => Ok(None),
        SeccompSetting::Unconfined => {
            Ok(settings.seccomp_applies().then(|| "unconfined".to_owned()))
        }
        SeccompSetting::Profile(path) => {
            let text = read_profile(path)?;
            seccomp::Profile::parse(&text).map_err(|source| DockerError::SeccompProfile {
                path: path.clone(),
                source,
            })?;
            Ok(settings.seccomp_applies().then_some(text))
        }
    }
}

fn read_profile(path: &Path) -> Result<String, DockerError> {
    let host_file = |source| DockerError::HostFile {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(host_file)?.len();
    if size > MAX_PROFILE_BYTES {
        return Err(DockerError::HostFile {
            path: path.to_path_buf(),
            source: std::io::Error::other(format!("{size} bytes is over the 1 MiB limit")),
        });
    }
    std::fs::read_to_string(path).map_err(host_file)
}

fn runtime_evidence(
    settings: &Settings,
    info: &bollard::models::SystemInfo,
) -> Result<RuntimeEvidence, DockerError> {
    let Some(name) = settings.runtime.name() else {
        return Ok(RuntimeEvidence {
            name: info
                .default_runtime
                .clone()
                .unwrap_or_else(|| "runc".to_owned()),
            path: None,
            runsc_verified: false,
        });
    };
    let registered = info.runtimes.as_ref().and_then(|r| r.get(name));
    let Some(registered) = registered else {
        let mut known: Vec<String> = info
            .runtimes
            .as_ref()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        known.sort();
        return Err(DockerError::RuntimeNotRegistered {
            runtime: name.to_owned(),
            registered: known.join(", "),
        });
    };
    let path = registered.path.clone();
    let runsc_verified = if settings.runtime.is_runsc() {
        let file_name = path
            .as_deref()
            .and_then(|p| Path::new(p).file_name())
            .and_then(|f| f.to_str());
        if file_name != Some("runsc") {
            return Err(DockerError::RuntimeNotRunsc {
                path: path.unwrap_or_default(),
            });
        }
        true
    } else {
        false
    };
    Ok(RuntimeEvidence {
        name: name.to_owned(),
        path,
        runsc_verified,
    })
}

async fn verify_image(
    engine: &Engine,
    reference: &str,
    store: ImageStore,
) -> Result<VerifiedImage, DockerError> {
    let inspected =
        engine
            .inspect_image(reference)
            .await
            .map_err(|e| DockerError::ImageMissing {
                reference: reference.to_owned(),
                reason: e.to_string(),
            })?;
    check_image(reference, &inspected, store)
}

/// Step 10's rules on one inspected image, and its identity (step 11).
pub fn check_image(
    reference: &str,
    image: &ImageInspect,
    store: ImageStore,
) -> Result<VerifiedImage, DockerError> {
    let refused = |reason: String| DockerError::ImageRefused {
        reference: reference.to_owned(),
        reason,
    };
    let id = image.id.clone().unwrap_or_default();
    let hex = id.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refused(format!("its id {id:?} is not sha256:<64 hex>")));
    }
    let config = image.config.clone().unwrap_or_default();
    if let Some(volumes) = config.volumes.filter(|v| !v.is_empty()) {
        return Err(refused(format!(
            "it declares VOLUME {} (an anonymous volume would bypass the read-only root and the tmpfs bounds)",
            volumes.join(", ")
        )));
    }
    let env = config.env.unwrap_or_default();
    for entry in &env {
        env_entry_problem(entry).map_or(Ok(()), |reason| Err(refused(reason)))?;
    }
    Ok(VerifiedImage {
        reference: reference.to_owned(),
        id,
        env,
        software: identity::manifest_identity(reference, image, store),
    })
}

/// Why one image ENV entry is refused.
fn env_entry_problem(entry: &str) -> Option<String> {
    let Some((name, value)) = entry.split_once('=') else {
        return Some(format!("its ENV entry {entry:?} is not NAME=value"));
    };
    let valid_name = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        return Some(format!(
            "its ENV name {name:?} is not a plain variable name"
        ));
    }
    if name.starts_with("LD_") || LOADER_VARIABLES.contains(&name) {
        return Some(format!(
            "its ENV sets {name}, which the dynamic loader reads before plimsoll can clear it"
        ));
    }
    if SEARCH_PATHS.contains(&name)
        && let Some(dir) = value.split(':').find(|d| {
            WRITABLE
                .iter()
                .any(|w| d == w || d.starts_with(&format!("{w}/")))
        })
    {
        return Some(format!(
            "its {name} searches {dir}, which is writable in the guest"
        ));
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use bollard::models::ImageConfig;

    const ID: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn image(env: &[&str], volumes: &[&str]) -> ImageInspect {
        ImageInspect {
            id: Some(ID.to_owned()),
            config: Some(ImageConfig {
                env: Some(env.iter().map(|s| (*s).to_owned()).collect()),
                volumes: Some(volumes.iter().map(|s| (*s).to_owned()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_image_verifies_with_its_id_and_env() {
        let v = check_image(
            "x:1",
            &image(&["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], &[]),
            ImageStore::Classic,
        )
        .unwrap();
        assert_eq!(v.id, ID);
        assert_eq!(v.env, ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]);
        // Never pulled by digest: no manifest, no identity.
        assert_eq!(v.software, Err(Unstated::NoManifest));
        assert_eq!(v.software_identity(), "");
    }

    #[test]
    fn volumes_loader_variables_and_writable_search_paths_are_refused() {
        for (env, volumes, needle) in [
            (&[][..], &["/data"][..], "VOLUME /data"),
            (&["LD_PRELOAD=/x.so"][..], &[][..], "LD_PRELOAD"),
            (&["GLIBC_TUNABLES=x"][..], &[][..], "GLIBC_TUNABLES"),
            (&["GCONV_PATH=/x"][..], &[][..], "GCONV_PATH"),
            (&["NOEQUALS"][..], &[][..], "NAME=value"),
            (&["1BAD=x"][..], &[][..], "plain variable name"),
            (&["PATH=/usr/bin:/tmp/bin"][..], &[][..], "/tmp/bin"),
            (&["NODE_PATH=/work"][..], &[][..], "/work"),
        ] {
            let err = check_image("x:1", &image(env, volumes), ImageStore::Classic)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn an_id_that_is_not_sha256_is_refused() {
        let mut i = image(&[], &[]);
        i.id = Some("abc".into());
        assert!(check_image("x", &i, ImageStore::Classic).is_err());
    }

    #[test]
    fn host_accounts_using_the_uid_or_uid_plus_one_are_found() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nsvc:x:61001:100::/:/bin/false\n";
        assert_eq!(
            account_using(passwd, &[2, 3], [61_000, 61_001]),
            Some((61_001, "svc".to_owned()))
        );
        let primary = "svc:x:1000:61000::/:/bin/false\n";
        assert_eq!(
            account_using(primary, &[2, 3], [61_000, 61_001]).unwrap().0,
            61_000
        );
        let group = "docker:x:105:\nstaff:x:61000:\n";
        assert_eq!(
            account_using(group, &[2], [61_000, 61_001]),
            Some((61_000, "staff".to_owned()))
        );
        assert_eq!(account_using(group, &[2], [70_000, 70_001]), None);
    }

    #[test]
    fn this_hosts_accounts_leave_the_default_uid_free() {
        check_host_accounts(61_000, Path::new("/etc/passwd"), Path::new("/etc/group")).unwrap();
    }
}
