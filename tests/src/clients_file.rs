//! Caller registries for `PLIMSOLL_CLIENTS_FILE` (config.md §3.1), written by the test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use sha2::{Digest, Sha256};

/// A fresh 64-hex-character bearer token, unique within the test process.
pub fn fresh_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(b"plimsoll-tests token\n");
    h.update(nanos.to_le_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    hex::encode(h.finalize())
}

// === impl ClientsFile ===

/// A clients file in its own temporary directory, removed when dropped.
pub struct ClientsFile {
    dir: tempfile::TempDir,
}

impl ClientsFile {
    /// Writes `{"clients":[{"id","token_sha256","scopes"}…]}` for `(id, token, scopes)`.
    pub fn new(clients: &[(&str, &str, &[&str])]) -> ClientsFile {
        let entries: Vec<_> = clients
            .iter()
            .map(|(id, token, scopes)| {
                json!({
                    "id": id,
                    "token_sha256": hex::encode(Sha256::digest(token.as_bytes())),
                    "scopes": scopes,
                })
            })
            .collect();
        ClientsFile::raw(&json!({ "clients": entries }).to_string())
    }

    /// Writes `text` as the file's exact content.
    pub fn raw(text: &str) -> ClientsFile {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        std::fs::write(dir.path().join("clients.json"), text).expect("write the clients file");
        ClientsFile { dir }
    }

    /// An empty directory of the same lifetime, for a file another tool creates.
    pub fn empty() -> ClientsFile {
        ClientsFile {
            dir: tempfile::tempdir().expect("create a temporary directory"),
        }
    }

    /// The file's path (it need not exist yet for [`ClientsFile::empty`]).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("clients.json")
    }

    /// The path as a `&str` for an environment map.
    pub fn path_str(&self) -> String {
        path_string(&self.path())
    }
}

fn path_string(p: &Path) -> String {
    p.to_str().expect("temporary paths are UTF-8").to_string()
}
