//! A cell's files, written under the work directory without following any link the session
//! may have planted (providers.md §9.6). A refusal is named by its errno, as Node named it.
//!
//! The steps: the path is resolved as text against the work directory and must stay inside
//! it; each parent directory is made when missing and must be a real directory (a link is
//! `ELOOP`, anything else `ENOTDIR`); the parent's real path must be inside the work directory;
//! the file is opened with `O_NOFOLLOW | O_NONBLOCK` (a link is `ELOOP`, a FIFO without a
//! reader `ENXIO`, never a wait), must be a regular file and, by `/proc/self/fd`, inside the
//! work directory; only then is it truncated and written.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use nix::errno::Errno;

use super::message::FileSpec;

/// Why a file was not written: the errno's name (`EPERM`, `ELOOP`…).
pub type Refusal = String;

/// Writes one file of a prepare under `work`.
pub fn write(work: &str, file: &FileSpec) -> Result<(), Refusal> {
    let (rel, content) = match file {
        FileSpec::Null => return Err("EIO".to_owned()),
        FileSpec::Entry {
            path: Some(rel),
            content: Some(content),
        } if !rel.is_empty() && !rel.contains('\0') => (rel, content),
        FileSpec::Entry { .. } => return Err(named(Errno::EINVAL)),
    };
    let dest = resolve(work, rel);
    if !inside(work, dest.as_bytes()) || dest == work || rel.starts_with('/') {
        return Err(named(Errno::EPERM));
    }
    let below = &dest[work.len() + 1..];
    let parent = make_parents(work, below).map_err(|e| io_name(&e))?;
    let real = std::fs::canonicalize(&parent).map_err(|e| io_name(&e))?;
    if !inside(work, real.as_os_str().as_bytes()) {
        return Err(named(Errno::EPERM));
    }
    let mut opened = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&dest)
        .map_err(|e| io_name(&e))?;
    if !opened.metadata().map_err(|e| io_name(&e))?.is_file() {
        return Err(named(Errno::EINVAL));
    }
    let seen = std::fs::read_link(format!("/proc/self/fd/{}", opened.as_raw_fd()))
        .map_err(|e| io_name(&e))?;
    if !inside(work, seen.as_os_str().as_bytes()) {
        return Err(named(Errno::EPERM));
    }
    opened.set_len(0).map_err(|e| io_name(&e))?;
    opened
        .write_all(content.as_bytes())
        .map_err(|e| io_name(&e))
}

/// `path.resolve(work, rel)`: `.` and empty segments dropped, `..` taken back (never above
/// `/`), an absolute `rel` starting over.
fn resolve(work: &str, rel: &str) -> String {
    let base = if rel.starts_with('/') { "" } else { work };
    let mut parts: Vec<&str> = Vec::new();
    for segment in base.split('/').chain(rel.split('/')) {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Whether `path` is `work` or below it.
fn inside(work: &str, path: &[u8]) -> bool {
    let work = work.as_bytes();
    path == work || (path.starts_with(work) && path.get(work.len()) == Some(&b'/'))
}

/// Makes the parent directories of `below` (relative to `work`) one by one, following no
/// link; returns the innermost.
fn make_parents(work: &str, below: &str) -> io::Result<std::path::PathBuf> {
    let mut at = Path::new(work).to_path_buf();
    let mut parts: Vec<&str> = below.split('/').collect();
    parts.pop();
    for part in parts {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(meta) if meta.file_type().is_symlink() => return Err(Errno::ELOOP.into()),
            Ok(_) => return Err(Errno::ENOTDIR.into()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new().mode(0o755).create(&at)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// An errno's name.
fn named(errno: Errno) -> Refusal {
    match errno {
        // Node had no name for these; it never happened on a write.
        Errno::UnknownErrno => "EIO".to_owned(),
        errno => format!("{errno:?}"),
    }
}

/// An I/O error's errno name (`EIO` when it carries none).
fn io_name(error: &io::Error) -> Refusal {
    error
        .raw_os_error()
        .map_or_else(|| "EIO".to_owned(), |code| named(Errno::from_raw(code)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(path: &str, content: &str) -> FileSpec {
        FileSpec::Entry {
            path: Some(path.to_owned()),
            content: Some(content.to_owned()),
        }
    }

    fn work() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let real = std::fs::canonicalize(work).unwrap();
        (dir, real.to_str().unwrap().to_owned())
    }

    #[test]
    fn paths_resolve_as_nodes_path_resolve_does() {
        assert_eq!(resolve("/work", "a/b"), "/work/a/b");
        assert_eq!(resolve("/work", "a//./b/"), "/work/a/b");
        assert_eq!(resolve("/work", "a/../b"), "/work/b");
        assert_eq!(resolve("/work", "../x"), "/x");
        assert_eq!(resolve("/work", "../../../.."), "/");
        assert_eq!(resolve("/work", "/etc/passwd"), "/etc/passwd");
        assert!(inside("/work", b"/work") && inside("/work", b"/work/a"));
        assert!(!inside("/work", b"/workx") && !inside("/work", b"/wor"));
    }

    #[test]
    fn files_are_written_with_their_parents_and_replaced_whole() {
        let (_dir, work) = work();
        write(&work, &entry("a/b/c.txt", "long content")).unwrap();
        write(&work, &entry("a/b/c.txt", "short")).unwrap();
        write(&work, &entry("./d/../top.py", "x = 1\n")).unwrap();
        let path = Path::new(&work);
        assert_eq!(
            std::fs::read_to_string(path.join("a/b/c.txt")).unwrap(),
            "short"
        );
        assert_eq!(
            std::fs::read_to_string(path.join("top.py")).unwrap(),
            "x = 1\n"
        );
        // Resolved as text first, as Node did: `d` is never made.
        assert!(!path.join("d").exists());
    }

    #[test]
    fn paths_outside_work_and_bad_entries_are_refused_by_name() {
        let (_dir, work) = work();
        let refused = |file: FileSpec| write(&work, &file).unwrap_err();
        assert_eq!(refused(entry("../x", "")), "EPERM");
        assert_eq!(refused(entry("/etc/x", "")), "EPERM");
        assert_eq!(refused(entry(&format!("{work}/x"), "")), "EPERM");
        assert_eq!(refused(entry("a/..", "")), "EPERM");
        assert_eq!(refused(entry(".", "")), "EPERM");
        assert_eq!(refused(entry("", "")), "EINVAL");
        assert_eq!(refused(entry("a\0b", "")), "EINVAL");
        assert_eq!(refused(FileSpec::Null), "EIO");
        let no_content = FileSpec::Entry {
            path: Some("x".into()),
            content: None,
        };
        assert_eq!(refused(no_content), "EINVAL");
    }

    #[test]
    fn planted_links_fifos_and_directories_are_refused_and_nothing_outside_is_touched() {
        let (dir, work) = work();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("target"), "kept").unwrap();
        let w = Path::new(&work);
        std::os::unix::fs::symlink(&outside, w.join("linkdir")).unwrap();
        std::os::unix::fs::symlink(outside.join("target"), w.join("linkfile")).unwrap();
        std::fs::write(w.join("plain"), "").unwrap();
        std::fs::create_dir(w.join("sub")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(w.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        let refused = |path: &str| write(&work, &entry(path, "bad")).unwrap_err();
        assert_eq!(refused("linkdir/target"), "ELOOP");
        assert_eq!(refused("linkdir/new/x"), "ELOOP");
        assert_eq!(refused("linkfile"), "ELOOP");
        assert_eq!(refused("plain/x"), "ENOTDIR");
        assert_eq!(refused("sub"), "EISDIR");
        assert_eq!(refused("fifo"), "ENXIO");
        assert_eq!(
            std::fs::read_to_string(outside.join("target")).unwrap(),
            "kept"
        );
        assert!(!outside.join("new").exists());
    }

    #[test]
    fn a_work_directory_reached_through_a_link_is_refused() {
        let (dir, work) = work();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&work, &link).unwrap();
        let link = link.to_str().unwrap().to_owned();
        assert_eq!(write(&link, &entry("x", "")).unwrap_err(), "EPERM");
    }
}
