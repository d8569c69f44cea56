//! The command line's private files: a session's state (it holds the session id, which names
//! the session to the daemon) and a private key.
//!
//! A private file is never written in place: its bytes go to a new file beside it, made
//! before anything runs (so a directory that cannot take it fails the command before a call
//! is sent), then reach the disk and replace it whole. An interrupted or failed write leaves
//! the old file as it was, and a symbolic link at the path is replaced, never followed.
//! A session's state file is also locked for the whole command (see [`lock`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The replacement of one private file, made and not yet written. Dropped unwritten, it is
/// removed.
pub struct Pending {
    path: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

impl Pending {
    /// Makes the replacement's file beside `path`, readable by its owner only.
    pub fn beside(path: &Path) -> io::Result<Pending> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
        // A random name: a file a killed command left behind is never in the way.
        for _ in 0..8 {
            let mut temp = std::ffi::OsString::from(".");
            temp.push(name);
            temp.push(format!(".{:016x}.tmp", rand::random::<u64>()));
            let temp = path.with_file_name(temp);
            let made = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temp);
            match made {
                Ok(file) => {
                    return Ok(Pending {
                        path: path.to_owned(),
                        temp,
                        file: Some(file),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free name for the new file beside it",
        ))
    }

    /// Writes `data`, waits for the disk, and replaces the file with it.
    pub fn commit(mut self, data: &[u8]) -> io::Result<()> {
        let Some(mut file) = self.file.take() else {
            return Err(io::Error::other("already written"));
        };
        let written = file
            .write_all(data)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&self.temp, &self.path));
        if written.is_err() {
            let _ = std::fs::remove_file(&self.temp);
        }
        written
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Locks the file at `path` for as long as the returned handle lives and reads it: a second
/// command on the same file waits until this one has ended, so neither saves over the
/// other's call. The file is replaced whole on every save, so a lock taken on a file since
/// replaced is taken again on the new one.
pub fn lock(path: &Path) -> io::Result<(File, String)> {
    for _ in 0..100 {
        // Read and write: an exclusive lock on NFS (a POSIX lock there) needs a writer.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        file.lock()?;
        let held = file.metadata()?;
        let now = path.symlink_metadata();
        if now.is_ok_and(|now| (now.dev(), now.ino()) == (held.dev(), held.ino())) {
            let mut text = String::new();
            file.read_to_string(&mut text)?;
            return Ok((file, text));
        }
    }
    Err(io::Error::other(
        "replaced again and again while waiting for its lock",
    ))
}
