//! The caller registry file (`PLIMSOLL_CLIENTS_FILE`, config.md section 3.1).
//!
//! ```json
//! {"clients": [{"id": "ci", "token_sha256": "<64 hex>", "scopes": ["code:run"],
//!               "paid_seconds_per_day": 3600}]}
//! ```
//!
//! The file holds only the SHA-256 of each caller's exact bearer text, never the token, so the
//! daemon cannot check a token's length; `plimsoll-clients` does that when it creates or imports
//! one. Parsing is strict: unknown fields, trailing data and a missing or null `clients` are
//! refused, and every entry is validated and normalised (ids trimmed, fingerprints trimmed and
//! lower-cased). An empty registry parses; the daemon refuses it at startup, the tool may write
//! it (revoking the last caller).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Shortest bearer token accepted where the token itself is seen (`PLIMSOLL_TOKEN`, the tool).
pub const TOKEN_MIN_BYTES: usize = 32;
/// Longest bearer token accepted anywhere.
pub const TOKEN_MAX_BYTES: usize = 4096;
/// The id no caller may have: `allowed_callers: ["*"]` means "every caller".
pub const WILDCARD_ID: &str = "*";
/// Mode of a clients file the tool creates; an existing file keeps its mode.
pub const NEW_FILE_MODE: u32 = 0o600;

// === Errors ===

/// Why a clients file could not be read, validated or written.
#[derive(Debug, thiserror::Error)]
pub enum ClientsFileError {
    /// The path could not be inspected (other than "does not exist" where that is allowed).
    #[error("cannot inspect {path}: {source}")]
    Inspect { path: PathBuf, source: io::Error },
    /// The path names a symbolic link, which the tool refuses to replace.
    #[error("{path} is a symbolic link; name the file itself")]
    Symlink { path: PathBuf },
    /// The path names a directory, FIFO, device or socket.
    #[error("{path} is not a regular file")]
    NotRegularFile { path: PathBuf },
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    /// Not JSON of the expected shape: syntax, unknown field, wrong type, trailing data.
    #[error("invalid clients file: {0}")]
    Json(#[source] serde_json::Error),
    /// `clients` is missing or null.
    #[error("invalid clients file: \"clients\" is missing or null")]
    ClientsMissing,
    /// An id is empty after trimming.
    #[error("client #{index}: id is empty")]
    EmptyId { index: usize },
    /// An id is the wildcard `*`.
    #[error("client #{index}: id must not be \"*\"")]
    WildcardId { index: usize },
    /// An id holds a control character.
    #[error("client #{index}: id contains a control character")]
    IdControlCharacter { index: usize },
    /// Two entries share an id.
    #[error("client {id:?} appears more than once")]
    DuplicateId { id: String },
    /// A fingerprint is not 64 hex characters.
    #[error("client {id:?}: token_sha256 must be exactly 64 hex characters")]
    BadFingerprint { id: String },
    /// Two entries share a fingerprint, so one token would authenticate as both.
    #[error("clients {id:?} and {other:?} have the same token_sha256")]
    DuplicateFingerprint { id: String, other: String },
    /// A scope is the empty string.
    #[error("client {id:?}: a scope is empty")]
    EmptyScope { id: String },
    /// A scope holds whitespace or a control character.
    #[error("client {id:?}: scope {scope:?} contains whitespace or a control character")]
    BadScope { id: String, scope: String },
    /// A scope is listed twice for one client.
    #[error("client {id:?}: scope {scope:?} is listed twice")]
    DuplicateScope { id: String, scope: String },
    /// Serialising failed (not expected for these types).
    #[error("cannot encode clients file: {0}")]
    Encode(#[source] serde_json::Error),
    /// The temporary file next to the target could not be created.
    #[error("cannot create a temporary file in {dir}: {source}")]
    CreateTemp { dir: PathBuf, source: io::Error },
    /// Writing, chmod-ing or fsync-ing the temporary file failed.
    #[error("cannot write {path}: {source}")]
    WriteTemp { path: PathBuf, source: io::Error },
    /// Renaming the temporary file over the target failed.
    #[error("cannot rename {from} to {to}: {source}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    /// The directory could not be fsync-ed after the rename.
    #[error("cannot sync directory {dir}: {source}")]
    SyncDir { dir: PathBuf, source: io::Error },
}

/// Why a bearer token's text is unacceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenShapeError {
    /// Fewer than [`TOKEN_MIN_BYTES`] bytes.
    #[error("is too short: {0} bytes, at least 32 required")]
    TooShort(usize),
    /// More than [`TOKEN_MAX_BYTES`] bytes.
    #[error("is too long: {0} bytes, at most 4096 allowed")]
    TooLong(usize),
    /// A byte outside 0x21..=0x7e (space, control, non-ASCII).
    #[error("must contain only visible ASCII characters (0x21-0x7e)")]
    NotVisibleAscii,
}

// === Tokens ===

/// The lower-case hex SHA-256 of the exact token text, as stored in `token_sha256`.
pub fn token_sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Checks a token's shape: visible ASCII, [`TOKEN_MIN_BYTES`]..=[`TOKEN_MAX_BYTES`] bytes.
///
/// Length is checked first, so a short token is reported as short whatever it holds. Does not
/// trim and does not judge entropy.
pub fn check_token_shape(token: &str) -> Result<(), TokenShapeError> {
    let len = token.len();
    if len < TOKEN_MIN_BYTES {
        return Err(TokenShapeError::TooShort(len));
    }
    if len > TOKEN_MAX_BYTES {
        return Err(TokenShapeError::TooLong(len));
    }
    if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(TokenShapeError::NotVisibleAscii);
    }
    Ok(())
}

// === impl ClientEntry ===

/// One caller: its id, the SHA-256 of its token, its scopes and its optional daily allowance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// Trimmed, non-empty, not `*`, no control characters, unique in the file.
    pub id: String,
    /// 64 lower-case hex characters, unique in the file.
    pub token_sha256: String,
    /// Unique, non-empty, no whitespace or control characters; may be empty (or absent in the
    /// file), in which case the caller authenticates but may call nothing.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Paid VM seconds per UTC day on metered providers; `None` = no per-caller allowance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_seconds_per_day: Option<u64>,
}

// === impl ClientsFile ===

/// A validated caller registry with a fingerprint index.
///
/// Build one with [`ClientsFile::parse`], [`ClientsFile::load`] or [`ClientsFile::new`]; each
/// validates and normalises every entry. [`ClientsFile::lookup`] uses an index built at that
/// moment: after editing `clients` directly, pass the list through [`ClientsFile::new`] again
/// (a stale index fails closed: it may miss a caller, never return the wrong one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientsFile {
    /// The callers, in file order.
    pub clients: Vec<ClientEntry>,
    #[serde(skip)]
    index: HashMap<String, usize>,
}

/// The document as it is on disk, before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientsFile {
    clients: Option<Vec<ClientEntry>>,
}

impl ClientsFile {
    /// Validates and normalises `clients`, then indexes them by fingerprint.
    ///
    /// An empty list is valid here; the daemon's configuration refuses it separately.
    pub fn new(clients: Vec<ClientEntry>) -> Result<Self, ClientsFileError> {
        let clients = clients
            .into_iter()
            .enumerate()
            .map(|(index, entry)| normalise(index, entry))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ids = HashSet::new();
        let mut index = HashMap::new();
        for (position, entry) in clients.iter().enumerate() {
            if !ids.insert(entry.id.as_str()) {
                return Err(ClientsFileError::DuplicateId {
                    id: entry.id.clone(),
                });
            }
            if let Some(&other) = index.get(&entry.token_sha256) {
                let other: &ClientEntry = &clients[other];
                return Err(ClientsFileError::DuplicateFingerprint {
                    id: entry.id.clone(),
                    other: other.id.clone(),
                });
            }
            index.insert(entry.token_sha256.clone(), position);
        }
        Ok(Self { clients, index })
    }

    /// Parses and validates the file's bytes. Strict: see the module docs.
    pub fn parse(bytes: &[u8]) -> Result<Self, ClientsFileError> {
        // `from_slice` refuses trailing non-whitespace after the document.
        let raw: RawClientsFile = serde_json::from_slice(bytes).map_err(ClientsFileError::Json)?;
        Self::new(raw.clients.ok_or(ClientsFileError::ClientsMissing)?)
    }

    /// Reads and parses `path`. Follows symbolic links (secret mounts are often links), but the
    /// target must be a regular file. Does not check ownership or mode.
    pub fn load(path: &Path) -> Result<Self, ClientsFileError> {
        // Checked before opening: opening a FIFO for reading would block.
        let meta = fs::metadata(path).map_err(|source| ClientsFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        if !meta.is_file() {
            return Err(ClientsFileError::NotRegularFile {
                path: path.to_owned(),
            });
        }
        let read_error = |source| ClientsFileError::Read {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(read_error)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(read_error)?;
        Self::parse(&bytes)
    }

    /// Loads `path` for editing: `Ok(None)` when it does not exist; a symbolic link or a
    /// non-regular file is refused.
    pub fn load_for_update(path: &Path) -> Result<Option<Self>, ClientsFileError> {
        match inspect_target(path)? {
            None => Ok(None),
            Some(_) => Self::load(path).map(Some),
        }
    }

    /// The caller whose `token_sha256` equals `token_sha256_hex` (lower-case hex), if any.
    ///
    /// A map lookup, not a constant-time comparison: the key is already a hash.
    pub fn lookup(&self, token_sha256_hex: &str) -> Option<&ClientEntry> {
        let position = *self.index.get(token_sha256_hex)?;
        self.clients
            .get(position)
            .filter(|entry| entry.token_sha256 == token_sha256_hex)
    }

    /// The caller with this id, if any.
    pub fn find(&self, id: &str) -> Option<&ClientEntry> {
        self.clients.iter().find(|entry| entry.id == id)
    }

    /// The file's JSON text: pretty-printed, entries in order, ending with a newline.
    pub fn to_json(&self) -> Result<String, ClientsFileError> {
        let mut text = serde_json::to_string_pretty(self).map_err(ClientsFileError::Encode)?;
        text.push('\n');
        Ok(text)
    }

    /// Writes the registry to `path` atomically.
    ///
    /// Re-validates first (`clients` is public). Writes a temporary file in the same
    /// directory, fsyncs it, renames it over `path`, then fsyncs the directory. A new file gets
    /// mode [`NEW_FILE_MODE`]; an existing one keeps its mode (but not its owner, when another
    /// user owned it). Refuses a symbolic link or a non-regular file at `path`. Takes no lock:
    /// callers serialise writers themselves.
    pub fn save_atomic(&self, path: &Path) -> Result<(), ClientsFileError> {
        let checked = Self::new(self.clients.clone())?;
        let text = checked.to_json()?;
        let mode = match inspect_target(path)? {
            Some(mode) => mode,
            None => NEW_FILE_MODE,
        };
        let name = path
            .file_name()
            .ok_or_else(|| ClientsFileError::NotRegularFile {
                path: path.to_owned(),
            })?;
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };

        let (temp_path, mut temp) = create_temp(&dir, &name.to_string_lossy())?;
        let written = (|| {
            temp.set_permissions(fs::Permissions::from_mode(mode))?;
            temp.write_all(text.as_bytes())?;
            temp.sync_all()
        })();
        drop(temp);
        if let Err(source) = written {
            let _ = fs::remove_file(&temp_path);
            return Err(ClientsFileError::WriteTemp {
                path: temp_path,
                source,
            });
        }
        if let Err(source) = fs::rename(&temp_path, path) {
            let _ = fs::remove_file(&temp_path);
            return Err(ClientsFileError::Rename {
                from: temp_path,
                to: path.to_owned(),
                source,
            });
        }
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| ClientsFileError::SyncDir { dir, source })
    }
}

/// `Ok(None)` when nothing is at `path`, `Ok(Some(mode))` for a regular file; refuses a
/// symbolic link or anything else. Does not follow links.
fn inspect_target(path: &Path) -> Result<Option<u32>, ClientsFileError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ClientsFileError::Inspect {
            path: path.to_owned(),
            source,
        }),
        Ok(meta) if meta.file_type().is_symlink() => Err(ClientsFileError::Symlink {
            path: path.to_owned(),
        }),
        Ok(meta) if !meta.is_file() => Err(ClientsFileError::NotRegularFile {
            path: path.to_owned(),
        }),
        Ok(meta) => Ok(Some(meta.permissions().mode() & 0o7777)),
    }
}

/// Creates `.<name>.tmp.<pid>.<n>` in `dir` with `O_EXCL` and mode 0600.
fn create_temp(dir: &Path, name: &str) -> Result<(PathBuf, File), ClientsFileError> {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut last_error = io::Error::from(io::ErrorKind::AlreadyExists);
    for attempt in 0..16u32 {
        let temp_path = dir.join(format!(
            ".{name}.tmp.{}.{}",
            std::process::id(),
            seed.wrapping_add(attempt)
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(NEW_FILE_MODE)
            .open(&temp_path)
        {
            Ok(file) => return Ok((temp_path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_error = e,
            Err(source) => {
                return Err(ClientsFileError::CreateTemp {
                    dir: dir.to_owned(),
                    source,
                });
            }
        }
    }
    Err(ClientsFileError::CreateTemp {
        dir: dir.to_owned(),
        source: last_error,
    })
}

/// Trims and checks one entry; `index` is its position, for messages about unnamed entries.
fn normalise(index: usize, mut entry: ClientEntry) -> Result<ClientEntry, ClientsFileError> {
    entry.id = entry.id.trim().to_owned();
    if entry.id.is_empty() {
        return Err(ClientsFileError::EmptyId { index });
    }
    if entry.id == WILDCARD_ID {
        return Err(ClientsFileError::WildcardId { index });
    }
    if entry.id.chars().any(char::is_control) {
        return Err(ClientsFileError::IdControlCharacter { index });
    }
    entry.token_sha256 = entry.token_sha256.trim().to_ascii_lowercase();
    if entry.token_sha256.len() != 64 || !entry.token_sha256.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(ClientsFileError::BadFingerprint { id: entry.id });
    }
    let mut seen = HashSet::new();
    for scope in &entry.scopes {
        if scope.is_empty() {
            return Err(ClientsFileError::EmptyScope { id: entry.id });
        }
        if scope.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ClientsFileError::BadScope {
                id: entry.id,
                scope: scope.clone(),
            });
        }
        if !seen.insert(scope.as_str()) {
            return Err(ClientsFileError::DuplicateScope {
                id: entry.id,
                scope: scope.clone(),
            });
        }
    }
    Ok(entry)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const FP_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const FP_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn entry(id: &str, fp: &str, scopes: &[&str]) -> ClientEntry {
        ClientEntry {
            id: id.into(),
            token_sha256: fp.into(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            paid_seconds_per_day: None,
        }
    }

    fn parse_str(text: &str) -> Result<ClientsFile, ClientsFileError> {
        ClientsFile::parse(text.as_bytes())
    }

    #[test]
    fn a_valid_file_parses_and_normalises() {
        let text = format!(
            r#"{{"clients": [{{"id": "  ci ", "token_sha256": " {} ", "scopes": ["code:run"],
                "paid_seconds_per_day": 60}}]}}"#,
            FP_A.to_uppercase()
        );
        let file = parse_str(&text).unwrap();
        assert_eq!(file.clients.len(), 1);
        let ci = &file.clients[0];
        assert_eq!(ci.id, "ci");
        assert_eq!(ci.token_sha256, FP_A);
        assert_eq!(ci.scopes, ["code:run"]);
        assert_eq!(ci.paid_seconds_per_day, Some(60));
    }

    #[test]
    fn an_empty_registry_parses_here() {
        assert!(parse_str(r#"{"clients": []}"#).unwrap().clients.is_empty());
    }

    #[test]
    fn clients_missing_or_null_is_refused() {
        assert!(matches!(
            parse_str("{}"),
            Err(ClientsFileError::ClientsMissing)
        ));
        assert!(matches!(
            parse_str(r#"{"clients": null}"#),
            Err(ClientsFileError::ClientsMissing)
        ));
    }

    #[test]
    fn unknown_fields_are_refused_at_both_levels() {
        assert!(matches!(
            parse_str(r#"{"clients": [], "extra": 1}"#),
            Err(ClientsFileError::Json(_))
        ));
        let text = format!(
            r#"{{"clients": [{{"id": "a", "token_sha256": "{FP_A}", "scopes": [], "x": 1}}]}}"#
        );
        assert!(matches!(parse_str(&text), Err(ClientsFileError::Json(_))));
    }

    #[test]
    fn trailing_data_is_refused() {
        assert!(matches!(
            parse_str(r#"{"clients": []} {}"#),
            Err(ClientsFileError::Json(_))
        ));
        assert!(matches!(
            parse_str(r#"{"clients": []}x"#),
            Err(ClientsFileError::Json(_))
        ));
        assert!(parse_str("{\"clients\": []}\n\n").is_ok());
    }

    #[test]
    fn negative_allowance_is_refused() {
        let text = format!(
            r#"{{"clients": [{{"id": "a", "token_sha256": "{FP_A}", "scopes": [],
                "paid_seconds_per_day": -1}}]}}"#
        );
        assert!(matches!(parse_str(&text), Err(ClientsFileError::Json(_))));
    }

    #[test]
    fn absent_scopes_mean_no_scopes() {
        let text = format!(r#"{{"clients": [{{"id": "a", "token_sha256": "{FP_A}"}}]}}"#);
        assert!(parse_str(&text).unwrap().clients[0].scopes.is_empty());
    }

    #[test]
    fn empty_id_is_refused() {
        let err = ClientsFile::new(vec![entry("   ", FP_A, &[])]).unwrap_err();
        assert!(matches!(err, ClientsFileError::EmptyId { index: 0 }));
    }

    #[test]
    fn wildcard_id_is_refused() {
        let err = ClientsFile::new(vec![entry(" * ", FP_A, &[])]).unwrap_err();
        assert!(matches!(err, ClientsFileError::WildcardId { index: 0 }));
    }

    #[test]
    fn control_characters_in_id_are_refused() {
        for id in ["a\u{7}b", "a\nb", "a\u{85}b"] {
            let err = ClientsFile::new(vec![entry(id, FP_A, &[])]).unwrap_err();
            assert!(
                matches!(err, ClientsFileError::IdControlCharacter { .. }),
                "{id:?}"
            );
        }
    }

    #[test]
    fn duplicate_ids_are_refused_after_trimming() {
        let err =
            ClientsFile::new(vec![entry("a", FP_A, &[]), entry(" a", FP_B, &[])]).unwrap_err();
        assert!(matches!(err, ClientsFileError::DuplicateId { id } if id == "a"));
    }

    #[test]
    fn fingerprint_must_be_64_hex() {
        for fp in [
            &FP_A[..63],
            &format!("{FP_A}a")[..],
            &FP_A.replace('a', "g")[..],
            "",
        ] {
            let err = ClientsFile::new(vec![entry("a", fp, &[])]).unwrap_err();
            assert!(
                matches!(err, ClientsFileError::BadFingerprint { .. }),
                "{fp:?}"
            );
        }
    }

    #[test]
    fn duplicate_fingerprints_are_refused_after_lowercasing() {
        let err = ClientsFile::new(vec![
            entry("a", FP_A, &[]),
            entry("b", &FP_A.to_uppercase(), &[]),
        ])
        .unwrap_err();
        assert!(matches!(
            err,
            ClientsFileError::DuplicateFingerprint { id, other } if id == "b" && other == "a"
        ));
    }

    #[test]
    fn scopes_must_be_non_empty_unique_and_free_of_whitespace() {
        let err = ClientsFile::new(vec![entry("a", FP_A, &[""])]).unwrap_err();
        assert!(matches!(err, ClientsFileError::EmptyScope { .. }));
        for bad in ["code run", "code:run\t", "\u{a0}x", "x\u{1}"] {
            let err = ClientsFile::new(vec![entry("a", FP_A, &[bad])]).unwrap_err();
            assert!(matches!(err, ClientsFileError::BadScope { .. }), "{bad:?}");
        }
        let err = ClientsFile::new(vec![entry("a", FP_A, &["x", "x"])]).unwrap_err();
        assert!(matches!(err, ClientsFileError::DuplicateScope { scope, .. } if scope == "x"));
    }

    #[test]
    fn lookup_finds_by_fingerprint_of_the_exact_token() {
        let token = "t".repeat(40);
        let fp = token_sha256_hex(&token);
        let file =
            ClientsFile::new(vec![entry("a", FP_A, &[]), entry("b", &fp, &["code:run"])]).unwrap();
        assert_eq!(file.lookup(&fp).map(|e| e.id.as_str()), Some("b"));
        assert!(
            file.lookup(&token_sha256_hex(&format!("{token} ")))
                .is_none()
        );
        assert!(file.lookup(FP_B).is_none());
    }

    #[test]
    fn lookup_fails_closed_after_direct_edits() {
        let mut file =
            ClientsFile::new(vec![entry("a", FP_A, &[]), entry("b", FP_B, &[])]).unwrap();
        file.clients.remove(0);
        assert!(file.lookup(FP_A).is_none());
        assert!(
            file.lookup(FP_B).is_none(),
            "stale position must not answer"
        );
    }

    #[test]
    fn token_sha256_hex_matches_a_known_vector() {
        assert_eq!(
            token_sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn token_shape_rules() {
        assert_eq!(
            check_token_shape(&"a".repeat(31)),
            Err(TokenShapeError::TooShort(31))
        );
        assert_eq!(check_token_shape(&"a".repeat(32)), Ok(()));
        assert_eq!(check_token_shape(&"a".repeat(4096)), Ok(()));
        assert_eq!(
            check_token_shape(&"a".repeat(4097)),
            Err(TokenShapeError::TooLong(4097))
        );
        let spaced = format!("{} ", "a".repeat(40));
        assert_eq!(
            check_token_shape(&spaced),
            Err(TokenShapeError::NotVisibleAscii)
        );
        let accented = format!("{}é", "a".repeat(40));
        assert_eq!(
            check_token_shape(&accented),
            Err(TokenShapeError::NotVisibleAscii)
        );
    }

    #[test]
    fn save_then_load_round_trips_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.json");
        let mut a = entry("a", FP_A, &["code:run"]);
        a.paid_seconds_per_day = Some(3600);
        let file = ClientsFile::new(vec![a, entry("b", FP_B, &[])]).unwrap();
        file.save_atomic(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(ClientsFile::load(&path).unwrap(), file);
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn save_keeps_an_existing_files_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.json");
        fs::write(&path, r#"{"clients": []}"#).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        ClientsFile::new(vec![entry("a", FP_A, &[])])
            .unwrap()
            .save_atomic(&path)
            .unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        assert_eq!(ClientsFile::load(&path).unwrap().clients.len(), 1);
    }

    #[test]
    fn save_refuses_a_symlink_and_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        fs::write(&real, r#"{"clients": []}"#).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = ClientsFile::default().save_atomic(&link).unwrap_err();
        assert!(matches!(err, ClientsFileError::Symlink { .. }));
        let err = ClientsFile::default().save_atomic(dir.path()).unwrap_err();
        assert!(matches!(err, ClientsFileError::NotRegularFile { .. }));
    }

    #[test]
    fn save_refuses_an_invalid_registry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.json");
        let mut file = ClientsFile::default();
        file.clients.push(entry("*", FP_A, &[]));
        assert!(matches!(
            file.save_atomic(&path),
            Err(ClientsFileError::WildcardId { .. })
        ));
        assert!(!path.exists());
    }

    #[test]
    fn load_follows_symlinks_but_refuses_non_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        ClientsFile::new(vec![entry("a", FP_A, &[])])
            .unwrap()
            .save_atomic(&real)
            .unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(ClientsFile::load(&link).unwrap().clients.len(), 1);
        assert!(matches!(
            ClientsFile::load(dir.path()),
            Err(ClientsFileError::NotRegularFile { .. })
        ));
        assert!(matches!(
            ClientsFile::load(&dir.path().join("missing.json")),
            Err(ClientsFileError::Read { .. })
        ));
    }

    #[test]
    fn load_for_update_reports_absence_and_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.json");
        assert!(ClientsFile::load_for_update(&path).unwrap().is_none());
        ClientsFile::default().save_atomic(&path).unwrap();
        assert!(ClientsFile::load_for_update(&path).unwrap().is_some());
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            ClientsFile::load_for_update(&link),
            Err(ClientsFileError::Symlink { .. })
        ));
    }

    #[test]
    fn json_never_contains_the_index_and_omits_absent_allowances() {
        let json = ClientsFile::new(vec![entry("a", FP_A, &["code:run"])])
            .unwrap()
            .to_json()
            .unwrap();
        assert!(json.ends_with('\n'));
        assert!(!json.contains("index"));
        assert!(!json.contains("paid_seconds_per_day"));
        assert_eq!(
            ClientsFile::parse(json.as_bytes()).unwrap().clients[0].id,
            "a"
        );
    }
}
