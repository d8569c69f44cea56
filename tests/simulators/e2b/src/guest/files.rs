//! `guest write` and `guest read`: envd's `/files` upload and download, inside the VM, as root
//! (envd is root and uses the request's user only for ownership and `~`).
//!
//! `write --uid U --gid G` reads records from stdin, each a 4-byte big-endian path length, the
//! absolute path, an 8-byte big-endian data length and the data, and writes each file the way
//! envd's `processFile` does: missing parents made 0755 and given to the user, an existing
//! directory at the path refused, the file truncated, owned by the user. It answers one
//! result frame listing what it wrote, or a failed frame with envd's status and message.
//!
//! `read --path P` answers a failed frame (404 absent, 400 a directory) or a result frame with
//! the size, then the bytes in data frames.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Failure, Written, flag, number};
use crate::frames::{Tag, encode};

/// Data frames of a download.
const READ_CHUNK: usize = 64 * 1024;
/// ENOSPC and EDQUOT: envd answers 507.
const NO_SPACE: [i32; 2] = [28, 122];

pub(super) async fn write(args: &[String]) -> Result<ExitCode, String> {
    let uid: u32 = number(args, "--uid")?;
    let gid: u32 = number(args, "--gid")?;
    let mut input = tokio::io::stdin();
    let mut written = Vec::new();
    loop {
        let mut len = [0u8; 4];
        match input.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("stdin: {e}")),
        }
        let mut path = vec![0u8; u32::from_be_bytes(len) as usize];
        input
            .read_exact(&mut path)
            .await
            .map_err(|e| format!("stdin: {e}"))?;
        let path = PathBuf::from(String::from_utf8(path).map_err(|_| "path is not UTF-8")?);
        let mut size = [0u8; 8];
        input
            .read_exact(&mut size)
            .await
            .map_err(|e| format!("stdin: {e}"))?;
        let size = u64::from_be_bytes(size);
        let mut data = (&mut input).take(size);
        if let Err(failure) = write_one(&path, &mut data, uid, gid).await {
            emit(Tag::Failed, &failure).await?;
            return Ok(ExitCode::SUCCESS);
        }
        written.push(Written {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            path: path.to_string_lossy().into_owned(),
        });
    }
    emit(Tag::Result, &written).await?;
    Ok(ExitCode::SUCCESS)
}

async fn write_one(
    path: &Path,
    data: &mut (impl tokio::io::AsyncRead + Unpin),
    uid: u32,
    gid: u32,
) -> Result<(), Failure> {
    let fail = |status: u16, message: String| Failure {
        status,
        code: String::new(),
        message,
    };
    if let Some(parent) = path.parent() {
        ensure_dirs(parent, uid, gid)
            .map_err(|e| fail(500, format!("error ensuring directories: {e}")))?;
    }
    let existed = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(fail(
                400,
                format!("path is a directory: {}", path.display()),
            ));
        }
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => return Err(fail(500, format!("error getting file info: {e}"))),
    };
    if existed {
        chown(path, Some(uid), Some(gid))
            .map_err(|e| fail(500, format!("error changing file ownership: {e}")))?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if NO_SPACE.contains(&code) => {
                fail(507, format!("not enough inodes available: {e}"))
            }
            _ => fail(500, format!("error opening file: {e}")),
        })?;
    if !existed {
        chown(path, Some(uid), Some(gid))
            .map_err(|e| fail(500, format!("error changing file ownership: {e}")))?;
    }
    let mut file = tokio::fs::File::from_std(file);
    let copied = tokio::io::copy(data, &mut file).await;
    let flushed = match copied {
        Ok(_) => file.flush().await,
        Err(e) => Err(e),
    };
    flushed.map_err(|e| match e.raw_os_error() {
        Some(code) if NO_SPACE.contains(&code) => {
            fail(507, "not enough disk space available".to_owned())
        }
        _ => fail(500, format!("error writing file: {e}")),
    })
}

/// envd's `EnsureDirs`: every missing directory from `/` down is made 0755 and given to the
/// user; an existing non-directory on the way is an error.
fn ensure_dirs(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let mut current = PathBuf::from("/");
    for part in path.components().skip(1) {
        current.push(part);
        match std::fs::metadata(&current) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => return Err(format!("path is a file: {}", current.display())),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(0o755).create(&current) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("failed to create directory: {e}")),
                }
                chown(&current, Some(uid), Some(gid))
                    .map_err(|e| format!("failed to chown directory: {e}"))?;
            }
            Err(e) => return Err(format!("failed to stat directory: {e}")),
        }
    }
    Ok(())
}

pub(super) async fn read(args: &[String]) -> Result<ExitCode, String> {
    let path = flag(args, "--path").ok_or("--path is missing")?;
    let fail = |status: u16, message: String| Failure {
        status,
        code: String::new(),
        message,
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            emit(
                Tag::Failed,
                &fail(404, format!("path '{path}' does not exist")),
            )
            .await?;
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            let message = format!("error checking if path exists '{path}': {e}");
            emit(Tag::Failed, &fail(500, message)).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    if meta.is_dir() {
        emit(
            Tag::Failed,
            &fail(400, format!("path '{path}' is a directory")),
        )
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut file = match tokio::fs::File::open(path).await {
        Ok(file) => file,
        Err(e) => {
            let message = format!("error opening file '{path}': {e}");
            emit(Tag::Failed, &fail(500, message)).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    emit(
        Tag::Result,
        &serde_json::json!({"size": meta.len(), "modified": modified}),
    )
    .await?;
    let mut out = tokio::io::stdout();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| format!("read {path}: {e}"))?;
        if n == 0 {
            break;
        }
        out.write_all(&encode(Tag::Data, &buf[..n]))
            .await
            .map_err(|e| format!("stdout: {e}"))?;
    }
    out.flush().await.map_err(|e| format!("stdout: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

async fn emit(tag: Tag, value: &impl Serialize) -> Result<(), String> {
    let json = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    let mut out = tokio::io::stdout();
    out.write_all(&encode(tag, &json))
        .await
        .map_err(|e| format!("stdout: {e}"))?;
    out.flush().await.map_err(|e| format!("stdout: {e}"))
}
