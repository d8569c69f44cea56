//! A project call's files: the plan's files written under /work and artifacts read back, as
//! the guest (the callers switch ids), and the grant's client library in a directory of the
//! agent's own under /tmp; never through a symbolic link (O_NOFOLLOW, the resolved
//! directory, and /proc/self/fd of what was opened).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::sync::OnceLock;

use nix::errno::Errno;

use super::env::WORK;

pub const ARTIFACTS_CAP: u64 = 8 << 20;

/// The directory the grant's client library lives in, once made.
static HOST_DIR: OnceLock<String> = OnceLock::new();

/// Node's `e.code` for an error: the errno's name, else "error".
pub fn code(e: &io::Error) -> String {
    e.raw_os_error().map_or_else(
        || "error".to_owned(),
        |n| format!("{:?}", Errno::from_raw(n)),
    )
}

/// `JSON.stringify` of a string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// `path.resolve(base, rel)`: lexical, `.` and `..` folded, no trailing slash.
pub fn resolve(base: &str, rel: &str) -> String {
    let joined = if rel.starts_with('/') {
        rel.to_owned()
    } else {
        format!("{base}/{rel}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `rel` resolved under /work, or why not.
pub fn under_work(rel: &str, what: &str) -> Result<String, String> {
    let abs = resolve(WORK, rel);
    if !abs.starts_with(&format!("{WORK}/")) {
        return Err(format!("{what} {} is not inside {WORK}", quoted(rel)));
    }
    Ok(abs)
}

fn inside_work(real: &str) -> bool {
    real == WORK || real.starts_with(&format!("{WORK}/"))
}

/// Writes each `(path, content)`; the first that cannot be written is the call's error.
pub fn write_files(files: &[(String, String)]) -> Result<(), String> {
    for (rel, content) in files {
        let abs = under_work(rel, "file")?;
        let dir = abs
            .rsplit_once('/')
            .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
        let real = DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .and_then(|()| std::fs::canonicalize(dir))
            .map_err(|e| {
                format!(
                    "the directory of file {} could not be made ({})",
                    quoted(rel),
                    code(&e)
                )
            })?;
        if !inside_work(&real.to_string_lossy()) {
            return Err(format!("file {} is not inside {WORK}", quoted(rel)));
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&abs)
            .map_err(|e| format!("file {} could not be written ({})", quoted(rel), code(&e)))?;
        let regular = file.metadata().map_err(|e| e.to_string())?.is_file();
        if !regular {
            return Err(format!("file {} is not a regular file", quoted(rel)));
        }
        file.write_all(content.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes the grant's client library, which every node a granted step starts imports, and
/// answers its path. It is written as the agent (not the guest) into a directory the agent
/// made under its own uid with a name no guest can guess: no guest process, from this call or
/// an earlier one (a held interpreter its own timer woke), can change what a later step
/// imports, or replace or remove the directory in the sticky /tmp.
pub fn write_host_client(source: &str) -> Result<String, String> {
    let failed = |e: io::Error| format!("the host client could not be written ({})", code(&e));
    let dir = host_dir().map_err(failed)?;
    let path = format!("{dir}/host.mjs");
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| {
            f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            f.write_all(source.as_bytes())
        })
        .map_err(failed)?;
    Ok(path)
}

/// The agent's directory for the host client, made at the first use (0755, its own uid).
fn host_dir() -> io::Result<&'static str> {
    if let Some(dir) = HOST_DIR.get() {
        return Ok(dir);
    }
    let mut random = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut random)?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = format!("/tmp/.plimsoll-host-{name}");
    // `create` fails if the name exists: nothing of a guest's is ever reused.
    DirBuilder::new().mode(0o755).create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let made = std::fs::symlink_metadata(&dir)?;
    if !made.is_dir() || made.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::from(io::ErrorKind::PermissionDenied));
    }
    Ok(HOST_DIR.get_or_init(|| dir))
}

/// An artifact's path as asked, and its content.
pub type Captured = (String, Vec<u8>);

/// One artifact read: None when it is not a regular file reached without a link.
enum Artifact {
    Content(Vec<u8>),
    Over,
}

fn read_artifact(rel: &str, room: u64) -> io::Result<Option<Artifact>> {
    let Ok(abs) = under_work(rel, "artifact") else {
        return Ok(None);
    };
    match std::fs::canonicalize(&abs) {
        Ok(real) if real.to_string_lossy() == abs => {}
        _ => return Ok(None),
    }
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&abs)
    else {
        return Ok(None);
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    if std::fs::read_link(format!("/proc/self/fd/{fd}"))?.to_string_lossy() != abs {
        return Ok(None);
    }
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > room {
        return Ok(Some(Artifact::Over));
    }
    Ok(Some(Artifact::Content(read_upto(&file, meta.len())?)))
}

/// Up to `size` bytes from the start (fewer when the file shrank meanwhile).
fn read_upto(file: &File, size: u64) -> io::Result<Vec<u8>> {
    let mut content = vec![0u8; usize::try_from(size).map_err(io::Error::other)?];
    let mut off = 0usize;
    while off < content.len() {
        let n = file.read_at(content.get_mut(off..).unwrap_or_default(), off as u64)?;
        if n == 0 {
            break;
        }
        off += n;
    }
    content.truncate(off);
    Ok(content)
}

/// The artifacts read, in order, up to [`ARTIFACTS_CAP`] in all, and whether one did not fit
/// (reading stops there). An I/O error past the open ends the call with it, as in the JS.
pub fn capture(paths: &[String]) -> io::Result<(Vec<Captured>, bool)> {
    let mut artifacts = Vec::new();
    let mut total = 0u64;
    for rel in paths {
        match read_artifact(rel, ARTIFACTS_CAP - total)? {
            None => {}
            Some(Artifact::Over) => return Ok((artifacts, true)),
            Some(Artifact::Content(content)) => {
                total += content.len() as u64;
                artifacts.push((rel.clone(), content));
            }
        }
    }
    Ok((artifacts, false))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_as_node_resolves_them() {
        assert_eq!(resolve(WORK, "a/./b/../c/"), "/work/a/c");
        assert_eq!(resolve(WORK, "/etc/x"), "/etc/x");
        assert_eq!(resolve(WORK, "../../x"), "/x");
        assert_eq!(under_work("a", "file").unwrap(), "/work/a");
        assert_eq!(
            under_work("../etc", "file").unwrap_err(),
            r#"file "../etc" is not inside /work"#
        );
        assert!(under_work("", "artifact").is_err());
        assert!(under_work(".", "artifact").is_err());
        assert!(inside_work("/work") && !inside_work("/workx"));
    }

    #[test]
    fn errors_are_named_as_node_names_them() {
        assert_eq!(code(&io::Error::from_raw_os_error(libc::EACCES)), "EACCES");
        assert_eq!(code(&io::Error::other("x")), "error");
    }
}
