//! Where the broker's guest sockets live on the host, and the reaping of the directories a
//! dead broker left behind (providers.md §5.13 step 1).
//!
//! A broker keeps every run socket and session socket of its life in one directory of its
//! own under the temp directory, named [`RUN_DIR_PREFIX`] and a random suffix, mode 0711:
//! anyone may pass through it, nobody but the broker's uid may list it. Each socket in it
//! has an unguessable name (128 random bits), and the broker serves only the peers it admits
//! (see the server's `guest_sockets` module). Beside them sits [`ANCHOR_NAME`], a socket the
//! broker answers on for its whole life, so a live broker's directory is never mistaken
//! for a dead one's, even with no run open.
//!
//! A broker that is killed cannot remove its directory, so the next broker, and plimsolld's
//! background loop, call [`reap_stale`] with [`BROKER_PREFIXES`]. This part of the crate is
//! linked by plimsolld (no `server` feature).

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Prefix of a broker's socket directory (and, in brokers before issue 12, of one run
/// socket's private directory).
pub const RUN_DIR_PREFIX: &str = "crsbx-broker";
/// Prefix of one session socket's private directory in brokers before issue 12; still
/// reaped.
pub const SESSION_DIR_PREFIX: &str = "crsbx-session-broker";
/// Every prefix a broker's directories were named with.
pub const BROKER_PREFIXES: [&str; 2] = [RUN_DIR_PREFIX, SESSION_DIR_PREFIX];
/// The socket's file name in a one-socket directory (the docker smoke test's, and brokers
/// before issue 12).
pub const SOCKET_NAME: &str = "host-api.sock";
/// The socket a live broker answers on in its directory, for as long as it lives.
pub const ANCHOR_NAME: &str = "broker.sock";
/// How old a directory must be before it may be reaped: a socket being bound right now is
/// never taken for a dead one.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Removes the directories in `dir` named with one of `prefixes` that are older than
/// [`STALE_AFTER`] at `now` and in which every socket refuses connections (or there is none):
/// what a killed broker (or daemon) left. A directory with a socket that still answers
/// belongs to a live process and stays, whatever its age; so does one that cannot be read.
/// Returns how many were removed; failures are left for the next call.
pub fn reap_stale(dir: &Path, prefixes: &[&str], now: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut reaped = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        // Only real directories: a symlink or a file with the prefix is not ours to judge.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if old && all_sockets_refuse(&entry.path()) && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            reaped += 1;
        }
    }
    reaped
}

/// Whether every socket in `dir` refuses connections (`false` when `dir` cannot be read).
fn all_sockets_refuse(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        if !entry.file_type().is_ok_and(|t| t.is_socket()) {
            continue;
        }
        let refused = matches!(
            std::os::unix::net::UnixStream::connect(entry.path()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
                || e.kind() == std::io::ErrorKind::NotFound
        );
        if !refused {
            return false;
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn stale_socket_directories_go_only_when_old_and_dead() {
        let tmp = tempfile::tempdir().unwrap();
        let make = |name: &str, socket: &str| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            dir.join(socket)
        };
        // Brokers that died: their socket files are left and refuse connections.
        drop(
            std::os::unix::net::UnixListener::bind(make("crsbx-broker-dead", SOCKET_NAME)).unwrap(),
        );
        drop(
            std::os::unix::net::UnixListener::bind(make("crsbx-session-broker-dead", SOCKET_NAME))
                .unwrap(),
        );
        drop(
            std::os::unix::net::UnixListener::bind(make("crsbx-broker-gone", ANCHOR_NAME)).unwrap(),
        );
        drop(std::os::unix::net::UnixListener::bind(make("crsbx-broker-gone", "ab.sock")).unwrap());
        // A live broker's directory: its anchor answers, its dead run socket does not matter.
        let _live = std::os::unix::net::UnixListener::bind(make("crsbx-broker-live", ANCHOR_NAME));
        drop(std::os::unix::net::UnixListener::bind(make("crsbx-broker-live", "cd.sock")).unwrap());
        // A directory that is not the broker's.
        drop(std::os::unix::net::UnixListener::bind(make("other-dead", SOCKET_NAME)).unwrap());
        let left = || {
            let mut names: Vec<String> = std::fs::read_dir(tmp.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        // Too young: nothing goes.
        let reap = |now| reap_stale(tmp.path(), &BROKER_PREFIXES, now);
        assert_eq!(reap(SystemTime::now()), 0);
        assert_eq!(left().len(), 5);
        let later = SystemTime::now() + STALE_AFTER + Duration::from_secs(1);
        assert_eq!(reap(later), 3);
        assert_eq!(left(), ["crsbx-broker-live", "other-dead"]);
    }
}
