//! The compiled guest, cached on disk so that a daemon start does not pay for Cranelift
//! every time.
//!
//! An artifact is named after the SHA-256 of the module and the engine's compatibility
//! hash, so a new guest or a new wasmtime never loads an old artifact. It lives in a
//! directory only this user can write (`<temp dir>/plimsoll-wasm-<uid>`, mode 0700), is
//! written to a fresh file and renamed into place, and carries a SHA-256 trailer that is
//! checked before loading. Anything unexpected (a directory owned by someone else, loose
//! permissions, a bad trailer, an artifact wasmtime refuses) only skips the cache: the
//! module is compiled again, and the cache is rewritten when it can be.

use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

/// The length of the SHA-256 trailer after the serialized module.
const TRAILER: usize = 32;

/// Where the module came from, for the startup log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Loaded from a cached artifact.
    Cache,
    /// Compiled now (and cached when the directory allowed it).
    Compiled,
}

impl Source {
    /// `cache` or `compiled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Compiled => "compiled",
        }
    }
}

/// The guest module, from the cache when a good artifact is there, else compiled.
pub fn load_or_compile(
    engine: &Engine,
    module: &[u8],
    module_sha256: &str,
) -> wasmtime::Result<(Module, Source)> {
    let artifact = match cache_dir() {
        Ok(dir) => Some(dir.join(artifact_name(engine, module_sha256))),
        Err(reason) => {
            tracing::warn!(%reason, "wasm compile cache unavailable; compiling the guest");
            None
        }
    };
    if let Some(path) = &artifact {
        match load(engine, path) {
            Ok(Some(compiled)) => return Ok((compiled, Source::Cache)),
            Ok(None) => {}
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "ignoring the cached wasm guest")
            }
        }
    }
    let compiled = Module::new(engine, module)?;
    if let Some(path) = &artifact
        && let Err(reason) = store(&compiled, path)
    {
        tracing::warn!(path = %path.display(), %reason, "cannot cache the compiled wasm guest");
    }
    Ok((compiled, Source::Compiled))
}

fn artifact_name(engine: &Engine, module_sha256: &str) -> String {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{module_sha256}-{:016x}.cwasm", hasher.finish())
}

/// This user's cache directory, made if missing; refused unless it is a real directory
/// owned by this user that nobody else can write.
fn cache_dir() -> Result<PathBuf, String> {
    let uid = nix::unistd::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("plimsoll-wasm-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a directory private to uid {uid} (mode {:o}, owner {})",
            dir.display(),
            meta.mode() & 0o7777,
            meta.uid()
        ));
    }
    Ok(dir)
}

/// The cached module, `None` when there is no artifact yet.
fn load(engine: &Engine, path: &Path) -> Result<Option<Module>, String> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let uid = nix::unistd::getuid().as_raw();
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err("not a regular file written by this user".to_owned());
    }
    let mut bytes = fs::read(path).map_err(|e| e.to_string())?;
    let Some(split) = bytes.len().checked_sub(TRAILER) else {
        return Err("shorter than its checksum".to_owned());
    };
    let trailer = bytes.split_off(split);
    if Sha256::digest(&bytes).as_slice() != trailer.as_slice() {
        return Err("checksum mismatch".to_owned());
    }
    deserialize(engine, &bytes)
        .map(Some)
        .map_err(|e| format!("{e:#}"))
}

/// Loads a module that [`store`] serialized.
// SAFETY (of the function): `Module::deserialize` maps the bytes as executable code, so
// they must be exactly what `Module::serialize` produced. They are: `load` only passes
// bytes read from this user's private cache directory (mode 0700, owner checked), from a
// file this user owns that nobody else can write, written whole by `store` and renamed
// into place, whose SHA-256 trailer matches (so a torn or corrupted file is rejected).
// wasmtime itself rejects an artifact from another version or engine configuration.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Module> {
    // SAFETY: see the function comment: `bytes` are a checked, unmodified output of
    // `Module::serialize` from this user's private cache.
    unsafe { Module::deserialize(engine, bytes) }
}

/// Writes the artifact and its trailer to a fresh file, then renames it into place.
fn store(module: &Module, path: &Path) -> Result<(), String> {
    let mut bytes = module.serialize().map_err(|e| format!("{e:#}"))?;
    let digest = Sha256::digest(&bytes);
    bytes.extend_from_slice(&digest);
    let partial = path.with_extension(format!("partial.{}", std::process::id()));
    let result = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&partial, path));
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result.map_err(|e| e.to_string())
}
