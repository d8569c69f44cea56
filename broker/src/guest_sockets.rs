//! The directory that holds one broker's guest sockets, and who may use them (issue 12,
//! part 5).
//!
//! `/tmp` is listable, and the host path of a socket bind-mounted into a runc container is
//! readable by every local user in the guest process's `/proc/<pid>/mountinfo`. So neither
//! the directory nor the name is the guard, only a layer of it:
//!
//! 1. One directory per broker, `<tmp>/crsbx-broker-<random>`, mode 0711: any uid may pass
//!    through it (docker bind-mounts a socket from it, runsc's gofer opens it, plimsolld's
//!    wasm host calls dial it), none but the broker's may list it.
//! 2. Each socket's name is 128 random bits (`<32 hex>.sock`), unrelated to the run id.
//! 3. Every connection's peer is checked with `SO_PEERCRED` before a byte is read: only
//!    [`Peers::admits`] uids get an answer; any other connection is closed at once. A peer
//!    whose credentials cannot be read is refused (fail closed).
//!
//! Who connects, as the kernel reports it: under runc, the guest process itself (the guest
//! uid, 61000 by default, which is a host uid: runc gives the container no user namespace);
//! under runsc with `--host-uds=open`, the sandbox's gofer (`runsc-gofer`, uid 0); with the
//! wasm provider, plimsolld (the broker's uid when it supervises the broker, else the uid it
//! runs as, which must then be the broker's or root to reach the control socket at all).
//! Root is admitted because a root process can read the broker's memory anyway; no check on
//! a socket can stop it.
//!
//! The socket itself is mode 0666: the guest uid differs from the broker's, and the peer
//! check, not the mode, decides.

use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::{UnixListener, UnixStream};

use crate::socket_dirs::{ANCHOR_NAME, RUN_DIR_PREFIX, STALE_AFTER};

/// The uid docker guests run as unless the operator says otherwise (plimsolld's
/// `SANDBOX_GUEST_UID` default).
pub const DEFAULT_GUEST_UID: u32 = 61_000;
/// At most one log line about refused peers per this many seconds.
const REFUSED_LOG_EVERY_SECS: u64 = 10;

/// Why the directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GuestSocketsError {
    /// Creating the directory, its anchor socket or a guest socket, or setting a mode,
    /// failed.
    #[error("guest socket directory {path}: {source}")]
    Create {
        /// What was being created.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The uids whose connections a guest socket answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peers {
    /// The broker's own uid (the owner of its socket directory).
    pub broker_uid: u32,
    /// The uid docker guests run as.
    pub guest_uid: u32,
}

// === impl Peers ===

impl Peers {
    /// Whether a peer running as `uid` may use a guest socket: root, the broker's uid or
    /// the guest uid.
    pub fn admits(&self, uid: u32) -> bool {
        uid == 0 || uid == self.broker_uid || uid == self.guest_uid
    }

    /// Whether `stream`'s peer may use a guest socket; a peer whose credentials cannot be
    /// read may not. A refusal is logged, at most once per [`REFUSED_LOG_EVERY_SECS`].
    pub fn check(&self, stream: &UnixStream) -> bool {
        let cred = match stream.peer_cred() {
            Ok(cred) if self.admits(cred.uid()) => return true,
            Ok(cred) => format!("uid {} gid {} pid {:?}", cred.uid(), cred.gid(), cred.pid()),
            Err(error) => format!("unreadable credentials ({error})"),
        };
        note_refused(&cred);
        false
    }
}

/// Logs a refused peer, at most once per [`REFUSED_LOG_EVERY_SECS`] (a local user cannot
/// flood the log), with how many were refused in between.
fn note_refused(peer: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SINCE: AtomicU64 = AtomicU64::new(0);
    let refused = SINCE.fetch_add(1, Ordering::Relaxed) + 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + REFUSED_LOG_EVERY_SECS
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        SINCE.store(0, Ordering::Relaxed);
        tracing::warn!(
            peer,
            refused,
            "a connection to a guest socket from a peer that is neither the guest, the broker's uid nor root was closed unanswered"
        );
    }
}

/// One broker's socket directory. Dropping it removes the directory and everything in it.
pub struct GuestSockets {
    dir: PathBuf,
    peers: Peers,
    anchor: tokio::task::JoinHandle<()>,
}

// === impl GuestSockets ===

impl GuestSockets {
    /// Makes a fresh directory under `tmp` (mode 0711) with its anchor socket (mode 0600,
    /// answered until this value is dropped). Needs a Tokio runtime.
    pub fn create(tmp: &Path, guest_uid: u32) -> Result<GuestSockets, GuestSocketsError> {
        let dir = tmp.join(format!("{RUN_DIR_PREFIX}-{}", random_hex::<8>()));
        let failed = |path: &Path| {
            let path = path.to_owned();
            move |source| GuestSocketsError::Create { path, source }
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(failed(&dir))?;
        // Opened up only now, and exactly (the umask does not apply to a chmod).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(failed(&dir))?;
        let broker_uid = std::fs::metadata(&dir).map_err(failed(&dir))?.uid();
        let anchor_path = dir.join(ANCHOR_NAME);
        let anchor = UnixListener::bind(&anchor_path).map_err(failed(&anchor_path))?;
        std::fs::set_permissions(&anchor_path, std::fs::Permissions::from_mode(0o600))
            .map_err(failed(&anchor_path))?;
        let anchor = tokio::spawn(async move {
            // Accepts and hangs up: a connect that succeeds is all a reaper asks.
            loop {
                let _ = anchor.accept().await;
            }
        });
        Ok(GuestSockets {
            dir,
            peers: Peers {
                broker_uid,
                guest_uid,
            },
            anchor,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Who may use the sockets.
    pub fn peers(&self) -> Peers {
        self.peers
    }

    /// Binds a new socket with an unguessable name (mode 0666; the peer check decides).
    pub fn bind(&self) -> Result<(PathBuf, UnixListener), GuestSocketsError> {
        let path = self.dir.join(format!("{}.sock", random_hex::<16>()));
        let failed = |source| GuestSocketsError::Create {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(failed)?;
        if let Err(source) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        {
            let _ = std::fs::remove_file(&path);
            return Err(failed(source));
        }
        Ok((path, listener))
    }

    /// Removes what is in the directory but belongs to no open run or session (`open`):
    /// entries older than [`STALE_AFTER`] at `now` (a socket being bound is never taken),
    /// the anchor aside. Returns how many went. A socket whose removal failed when its run
    /// closed, or anything else left there, goes within a sweep or two.
    pub fn sweep(&self, open: &HashSet<PathBuf>, now: SystemTime) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name() == ANCHOR_NAME || open.contains(&path) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let old = meta
                .modified()
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= STALE_AFTER);
            if !old {
                continue;
            }
            let gone = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if gone.is_ok() {
                removed += 1;
                tracing::info!(
                    path = %path.display(),
                    socket = meta.file_type().is_socket(),
                    "a guest socket no open run or session owns was removed"
                );
            }
        }
        removed
    }
}

impl Drop for GuestSockets {
    fn drop(&mut self) {
        self.anchor.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `N` random bytes as hex.
fn random_hex<const N: usize>() -> String {
    hex::encode(rand::random::<[u8; N]>())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn root_the_broker_and_the_guest_are_admitted_and_nobody_else() {
        let peers = Peers {
            broker_uid: 1000,
            guest_uid: 61_000,
        };
        for uid in [0, 1000, 61_000] {
            assert!(peers.admits(uid), "{uid}");
        }
        for uid in [1, 999, 65_534, 61_001, 60_999] {
            assert!(!peers.admits(uid), "{uid}");
        }
    }

    #[tokio::test]
    async fn the_directory_is_unlistable_its_sockets_unguessable_and_it_sweeps_strays() {
        let tmp = tempfile::tempdir().unwrap();
        let sockets = GuestSockets::create(tmp.path(), DEFAULT_GUEST_UID).unwrap();
        let dir = sockets.dir().to_owned();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o711);
        assert_eq!(mode(&dir.join(ANCHOR_NAME)), 0o600);
        let (a, _la) = sockets.bind().unwrap();
        let (b, _lb) = sockets.bind().unwrap();
        assert_ne!(a, b);
        assert_eq!(mode(&a), 0o666);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), 32 + ".sock".len(), "{name}");
        // A sweep keeps what is open, and young strays; old strays go.
        let open: HashSet<PathBuf> = [a.clone()].into();
        assert_eq!(sockets.sweep(&open, SystemTime::now()), 0);
        let later = SystemTime::now() + STALE_AFTER + Duration::from_secs(1);
        assert_eq!(sockets.sweep(&open, later), 1);
        assert!(a.exists() && !b.exists() && dir.join(ANCHOR_NAME).exists());
        // The reaper leaves a live broker's directory alone, however old.
        let reaped =
            crate::socket_dirs::reap_stale(tmp.path(), &crate::socket_dirs::BROKER_PREFIXES, later);
        assert_eq!(reaped, 0);
        drop(sockets);
        assert!(!dir.exists());
    }
}
