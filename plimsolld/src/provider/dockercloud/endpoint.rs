//! A sandbox's endpoint (grants.md §7.2, §7.5): `ProcessService/Exec` (unary: `{cmd,
//! workingDir}` → `{exitCode, stdout, stderr}`, base64), `FileService/Upload` (one
//! client stream: per file a header frame, then data frames of at most 512 KiB) and
//! `FileService/Download` (a server stream of header, data and per-file error frames).
//!
//! Over REST the same three calls take the REST routes ([`super::rest_endpoint`]); what is
//! sent and how the answers are judged is this file's either way.
//!
//! The API has no timeout and no output bound: [`wrapped`] makes every command run under
//! `timeout -s KILL` with `head -c` on each stream, its exit status through a file.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::api::{self, ApiError};
use super::config::{Transport, Url};
use super::rest_endpoint;
use crate::provider::e2b::http::Client;

/// The largest data frame an upload sends.
const UPLOAD_CHUNK: usize = 512 << 10;
/// The bound on a file call.
const FILE_BOUND: Duration = Duration::from_secs(60);
/// What the exec call's own bound adds to the in-guest limit.
const EXEC_SLACK: Duration = Duration::from_secs(10);

/// The exec wrapper (`sh -c WRAPPER plimsoll-exec <secs> <cap+1> argv…`): the command under
/// `timeout -s KILL`, its stdout and stderr each through `head -c`, its exit status written
/// to `/tmp/.plimsoll-rc.$$` (125 when the file is missing: the wrapper itself failed).
/// busybox's `timeout` kills only its child, and a grandchild holding the output pipes would
/// keep the exec open: the command runs as its own process group (`setsid`), which is
/// killed whole once `timeout` returns (`kill -KILL -PGID`: dash refuses `--` there).
pub const WRAPPER: &str = r#"s=$1; c=$2; shift 2; f=/tmp/.plimsoll-rc.$$; g=/tmp/.plimsoll-pg.$$; rm -f "$f" "$g"
{ { timeout -s KILL "$s" setsid sh -c 'echo $$ >"$0"; exec "$@"' "$g" "$@"; echo $? >"$f"; p=$(cat "$g" 2>/dev/null); [ -n "$p" ] && kill -KILL "-$p" 2>/dev/null; } 2>&1 1>&3 | head -c "$c" 1>&2; } 3>&1 | head -c "$c"
rc=$(cat "$f" 2>/dev/null) || rc=125; rm -f "$f" "$g"; exit "${rc:-125}""#;

/// The exit of a run whose answer was larger than the caps allow.
pub const EXIT_FLOOD: i32 = 153;

/// `argv` as the wrapped command for a limit of `secs` and a per-stream `cap`.
pub fn wrapped(secs: u64, cap: usize, argv: &[&str]) -> Vec<String> {
    let mut cmd = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        WRAPPER.to_owned(),
        "plimsoll-exec".to_owned(),
        secs.max(1).to_string(),
        (cap + 1).to_string(),
    ];
    cmd.extend(argv.iter().map(|a| (*a).to_owned()));
    cmd
}

/// An exec's answer.
#[derive(Debug)]
pub struct Exec {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The answer was larger than the caps allow (the wrapper did not bound it).
    pub flooded: bool,
}

/// A sandbox's endpoint.
pub struct Endpoint {
    transport: Transport,
    client: Client,
    path: String,
}

fn decode(v: &Value) -> Result<Vec<u8>, ApiError> {
    match v.as_str() {
        None => Ok(Vec::new()),
        Some(s) => STANDARD
            .decode(s)
            .map_err(|e| ApiError::Answer(format!("exec output is not base64: {e}"))),
    }
}

impl Endpoint {
    pub fn new(
        transport: Transport,
        url: Url,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Endpoint {
        Endpoint {
            transport,
            client: Client::new(url.base, tls),
            path: url.path,
        }
    }

    /// Runs `cmd` (already wrapped) in `cwd`; `limit` is the in-guest limit, `cap` the
    /// per-stream cap the wrapper applies.
    pub async fn exec(
        &self,
        bearer: &str,
        cmd: &[String],
        cwd: &str,
        limit: Duration,
        cap: usize,
    ) -> Result<Exec, ApiError> {
        let bound = limit + EXEC_SLACK;
        // Both streams base64 at cap + 1 bytes each, and the message around them.
        let most = (2 * (cap + 1)).div_ceil(3) * 4 * 2 + 4096;
        let message = json!({ "cmd": cmd, "workingDir": cwd });
        let answer = match self.transport {
            Transport::Connect => {
                api::unary(
                    &self.client,
                    &self.path,
                    "/docker.sbx.process.v1.ProcessService/Exec",
                    bearer,
                    &message,
                    bound,
                )
                .await
            }
            Transport::Rest => {
                let path = format!("{}/v1/processes/exec", self.path);
                let post = http::Method::POST;
                api::rest(
                    &self.client,
                    post,
                    &path,
                    bearer,
                    Some(&message),
                    &[],
                    bound,
                )
                .await
            }
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(ApiError::Answer(why)) if why.contains("body") && why.contains("length limit") => {
                return Ok(Exec {
                    exit_code: EXIT_FLOOD,
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    flooded: true,
                });
            }
            Err(e) => return Err(e),
        };
        let stdout = decode(&answer["stdout"])?;
        let stderr = decode(&answer["stderr"])?;
        let flooded =
            stdout.len() > cap + 1 || stderr.len() > cap + 1 || answer.to_string().len() > most;
        let exit_code = answer["exitCode"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(0);
        Ok(Exec {
            exit_code: if flooded { EXIT_FLOOD } else { exit_code },
            stdout,
            stderr,
            flooded,
        })
    }

    /// Writes `files` (absolute paths; their parents must exist) in one upload stream.
    pub async fn upload(&self, bearer: &str, files: &[(String, Vec<u8>)]) -> Result<(), ApiError> {
        if self.transport == Transport::Rest {
            let path = format!("{}/v1/files/upload", self.path);
            let written =
                rest_endpoint::upload(&self.client, &path, bearer, files, FILE_BOUND).await?;
            return check_written(written, files.len());
        }
        let mut frames = Vec::new();
        for (path, data) in files {
            frames.extend(api::envelope(
                &json!({ "header": { "path": path, "mode": 420 } }),
            ));
            for chunk in data.chunks(UPLOAD_CHUNK) {
                frames.extend(api::envelope(&json!({ "data": STANDARD.encode(chunk) })));
            }
        }
        let path = format!("{}/docker.sbx.files.v1.FileService/Upload", self.path);
        let answer = api::stream(
            &self.client,
            &path,
            "Upload",
            bearer,
            frames,
            64 << 10,
            FILE_BOUND,
        )
        .await?;
        let written = answer
            .first()
            .and_then(|a| a["filesWritten"].as_u64())
            .unwrap_or(0);
        check_written(written, files.len())
    }

    /// Reads `path`: `None` when it is absent or unreadable, an error when the whole answer
    /// exceeds `limit` bytes or breaks the stream.
    pub async fn download(
        &self,
        bearer: &str,
        path: &str,
        limit: usize,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        if self.transport == Transport::Rest {
            let route = format!("{}/v1/files/download", self.path);
            let read =
                rest_endpoint::download(&self.client, &route, bearer, path, limit, FILE_BOUND)
                    .await?;
            return within(path, read, limit);
        }
        let frames = api::envelope(&json!({ "paths": [path] }));
        let route = format!("{}/docker.sbx.files.v1.FileService/Download", self.path);
        // base64 and framing around `limit` bytes of content.
        let wire = limit.div_ceil(3) * 4 + 64 * 1024;
        let messages = api::stream(
            &self.client,
            &route,
            "Download",
            bearer,
            frames,
            wire,
            FILE_BOUND,
        )
        .await?;
        let mut content = Vec::new();
        let mut found = false;
        for m in &messages {
            if m.get("error").is_some() {
                return Ok(None);
            }
            if m.get("header").is_some() {
                found = true;
            }
            if let Some(data) = m.get("data") {
                content.extend(decode(data)?);
            }
        }
        within(path, found.then_some(content), limit)
    }
}

/// The upload's answer must count every file sent.
fn check_written(written: u64, files: usize) -> Result<(), ApiError> {
    if written != files as u64 {
        return Err(ApiError::Answer(format!(
            "the upload wrote {written} of {files} files"
        )));
    }
    Ok(())
}

/// A downloaded file within the artifact budget.
fn within(path: &str, read: Option<Vec<u8>>, limit: usize) -> Result<Option<Vec<u8>>, ApiError> {
    if read.as_ref().is_some_and(|c| c.len() > limit) {
        return Err(ApiError::Answer(format!(
            "{path} is larger than {limit} bytes"
        )));
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::wrapped;

    /// The wrapper as the sandbox's `sh` runs it (here the host's: dash on Debian).
    fn run(secs: u64, argv: &[&str]) -> (i32, String, Duration) {
        let cmd = wrapped(secs, 1000, argv);
        let began = Instant::now();
        let out = Command::new(&cmd[0])
            .args(&cmd[1..])
            .output()
            .unwrap_or_else(|e| panic!("sh: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code().unwrap_or(-1), stdout, began.elapsed())
    }

    #[test]
    fn the_commands_exit_and_output_pass_through() {
        let (code, stdout, _) = run(5, &["sh", "-c", "echo hi; exit 3"]);
        assert_eq!((code, stdout.as_str()), (3, "hi\n"));
    }

    /// A child left in the command's group holds the output pipes: the group is killed at
    /// the limit, so the exec ends then (before, dash refused the kill and the exec lasted
    /// as long as the child).
    #[test]
    fn the_whole_group_is_killed_at_the_limit() {
        let (code, _, took) = run(1, &["sh", "-c", "sleep 30 & sleep 30"]);
        assert_eq!(code, 137, "killed by the limit");
        assert!(took < Duration::from_secs(15), "took {took:?}");
    }
}
