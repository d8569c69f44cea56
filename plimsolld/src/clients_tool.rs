//! `plimsoll-clients`: offline editor for the caller registry (config.md section 3.2).
//!
//! The tool never contacts a daemon. It creates, imports, rotates and revokes callers in a
//! clients file, storing only each token's SHA-256. A generated token goes to stdout exactly
//! once and nowhere else; every other message goes to stderr. Tokens are never accepted as
//! arguments (they would land in shell history and `ps`), only generated or read from stdin.
//!
//! Writers are serialised by a lock directory, `<file>.lock`, made with `mkdir` and removed
//! afterwards (a killed run leaves it behind, and the error says so). Writes are atomic
//! ([`ClientsFile::save_atomic`]). Exit codes: 0 done, 1 failed, 2 usage error.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use rand::TryRngCore;
use rand::rngs::OsRng;

use crate::auth::clients_file::{
    self, ClientEntry, ClientsFile, ClientsFileError, TOKEN_MAX_BYTES, TokenShapeError,
};

/// The scope given when `--scope` is absent: the one scope all five procedures require.
pub const DEFAULT_SCOPE: &str = "code:run";
/// Below this allowance `limit` warns: it buys less than a minute of paid runs per day.
const LOW_ALLOWANCE_SECONDS: u64 = 60;
/// Bytes of OS randomness in a generated token (64 hex characters).
const TOKEN_RANDOM_BYTES: usize = 32;

/// The tool's usage text.
pub const HELP: &str = "\
plimsoll-clients: edit a plimsoll caller registry (PLIMSOLL_CLIENTS_FILE) offline.

Usage: plimsoll-clients COMMAND --file clients.json [flags]

Commands:
  create --id NAME [--scope S ...] [--paid-seconds-per-day N] --token-stdout
         add a caller with a new random token, printed once to stdout (alias: add)
  import --id NAME [--scope S ...] [--paid-seconds-per-day N]
         add a caller whose token is read from stdin (one trailing newline allowed)
  list [--json]
         show ids, scopes and allowances (never token fingerprints)
  rotate --id NAME (--token-stdout | --token-stdin)
         replace a caller's token; the old one stops working at the next daemon restart
  revoke --id NAME
         remove a caller
  limit --id NAME --paid-seconds-per-day N
         set a caller's daily paid allowance; 0 removes it
  help   show this text

Flags may be written -flag or --flag, with the value after a space or '='.
The default scope is code:run. Tokens are never accepted as arguments.
Exit status: 0 done, 1 failed, 2 usage error.
";

// === Errors ===

/// Why a command failed. [`ClientsToolError::Usage`] exits 2, everything else 1.
#[derive(Debug, thiserror::Error)]
pub enum ClientsToolError {
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// Reading, validating or writing the clients file failed.
    #[error(transparent)]
    File(#[from] ClientsFileError),
    /// Another run holds the lock, or a killed run left it behind.
    #[error(
        "{lock} exists: another plimsoll-clients is editing this file, or one was killed; \
         remove {lock} if no other is running"
    )]
    Locked { lock: PathBuf },
    /// The lock directory could not be made or inspected.
    #[error("cannot create lock {lock}: {source}")]
    Lock { lock: PathBuf, source: io::Error },
    /// `create` or `import` with an id already in the file.
    #[error("client {id:?} already exists; use rotate to replace its token")]
    DuplicateId { id: String },
    /// The id is not in the file.
    #[error("no client {id:?} in {path}")]
    NoSuchClient { id: String, path: PathBuf },
    /// The token read from stdin already belongs to a caller.
    #[error("this token is already used by client {id:?}")]
    TokenInUse { id: String },
    /// `rotate --token-stdin` was given the current token.
    #[error("the new token must differ from the current one")]
    SameToken,
    /// Stdin could not be read.
    #[error("cannot read the token from stdin: {0}")]
    Stdin(#[source] io::Error),
    /// The token on stdin is malformed.
    #[error(
        "the token on stdin {0} (32 to 4096 visible ASCII bytes, one trailing newline allowed)"
    )]
    StdinToken(TokenShapeError),
    /// The OS random number generator failed.
    #[error("cannot read OS randomness: {0}")]
    Random(String),
    /// Writing the listing or the help text failed.
    #[error("cannot write to stdout: {0}")]
    Stdout(#[source] io::Error),
    /// The new token was stored but could not be printed, so nobody knows it.
    #[error(
        "client {id:?} was saved but its token could not be written to stdout ({source}); \
         run rotate --token-stdout to issue another"
    )]
    TokenNotShown { id: String, source: io::Error },
}

impl ClientsToolError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            _ => 1,
        }
    }
}

// === Commands ===

/// Where `rotate` gets the new token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// Generate one and print it.
    Generate,
    /// Read it from stdin.
    Stdin,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print the usage text.
    Help,
    /// Add a caller with a generated token.
    Create(NewClient),
    /// Add a caller with a token from stdin.
    Import(NewClient),
    /// Show callers.
    List { file: PathBuf, json: bool },
    /// Replace a caller's token.
    Rotate {
        file: PathBuf,
        id: String,
        source: TokenSource,
    },
    /// Remove a caller.
    Revoke { file: PathBuf, id: String },
    /// Set or clear a caller's allowance (`None` clears).
    Limit {
        file: PathBuf,
        id: String,
        paid_seconds_per_day: Option<u64>,
    },
}

/// The flags `create` and `import` share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewClient {
    /// The clients file; created when absent.
    pub file: PathBuf,
    /// The caller's id as given (trimmed when stored).
    pub id: String,
    /// Never empty: [`DEFAULT_SCOPE`] when no `--scope` was given.
    pub scopes: Vec<String>,
    /// `None` when absent or 0.
    pub paid_seconds_per_day: Option<u64>,
}

// === Argument parsing ===

#[derive(Debug, Default)]
struct Flags {
    file: Option<PathBuf>,
    id: Option<String>,
    scopes: Vec<String>,
    paid: Option<u64>,
    token_stdout: bool,
    token_stdin: bool,
    json: bool,
}

/// Parses `args` (without the program name). `-h`/`--help` anywhere means [`Command::Help`].
///
/// Go-style: one or two dashes, value after a space or `=`. A flag given twice (other than
/// `--scope`), a flag the command does not take, or any positional argument is a usage error.
/// Positional arguments are never echoed: they may be tokens.
pub fn parse_args(args: &[String]) -> Result<Command, ClientsToolError> {
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "-help"))
    {
        return Ok(Command::Help);
    }
    let Some((command, rest)) = args.split_first() else {
        return Err(usage("missing command"));
    };
    let allowed: &[&str] = match command.as_str() {
        "help" => return Ok(Command::Help),
        "create" | "add" => &[
            "file",
            "id",
            "scope",
            "paid-seconds-per-day",
            "token-stdout",
        ],
        "import" => &["file", "id", "scope", "paid-seconds-per-day"],
        "list" => &["file", "json"],
        "rotate" => &["file", "id", "token-stdout", "token-stdin"],
        "revoke" => &["file", "id"],
        "limit" => &["file", "id", "paid-seconds-per-day"],
        other if other.starts_with('-') => {
            return Err(usage(
                "the command comes first, e.g. plimsoll-clients list --file F",
            ));
        }
        other => return Err(usage(&format!("unknown command {other:?}"))),
    };
    let flags = parse_flags(rest, allowed)?;
    let file = flags
        .file
        .clone()
        .ok_or_else(|| usage("--file is required"))?;
    let id = || flags.id.clone().ok_or_else(|| usage("--id is required"));
    let new_client = || -> Result<NewClient, ClientsToolError> {
        Ok(NewClient {
            file: file.clone(),
            id: id()?,
            scopes: if flags.scopes.is_empty() {
                vec![DEFAULT_SCOPE.to_owned()]
            } else {
                flags.scopes.clone()
            },
            paid_seconds_per_day: flags.paid.filter(|n| *n > 0),
        })
    };
    Ok(match command.as_str() {
        "create" | "add" => {
            if !flags.token_stdout {
                return Err(usage(
                    "create prints the new token to stdout; pass --token-stdout to confirm",
                ));
            }
            Command::Create(new_client()?)
        }
        "import" => Command::Import(new_client()?),
        "list" => Command::List {
            file,
            json: flags.json,
        },
        "rotate" => {
            let source = match (flags.token_stdout, flags.token_stdin) {
                (true, false) => TokenSource::Generate,
                (false, true) => TokenSource::Stdin,
                _ => {
                    return Err(usage(
                        "rotate needs exactly one of --token-stdout, --token-stdin",
                    ));
                }
            };
            Command::Rotate {
                file,
                id: id()?,
                source,
            }
        }
        "revoke" => Command::Revoke { file, id: id()? },
        _ => {
            let paid = flags.paid.ok_or_else(|| {
                usage("limit needs --paid-seconds-per-day (0 removes the allowance)")
            })?;
            Command::Limit {
                file,
                id: id()?,
                paid_seconds_per_day: Some(paid).filter(|n| *n > 0),
            }
        }
    })
}

fn usage(message: &str) -> ClientsToolError {
    ClientsToolError::Usage(message.to_owned())
}

fn parse_flags(args: &[String], allowed: &[&str]) -> Result<Flags, ClientsToolError> {
    let mut flags = Flags::default();
    let mut seen: Vec<String> = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let Some(body) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !b.starts_with('-'))
        else {
            return Err(usage(
                "unexpected positional argument: tokens must never be passed as arguments \
                 (create generates one; import and rotate --token-stdin read stdin)",
            ));
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (body, None),
        };
        if !allowed.contains(&name) {
            return Err(usage(&format!("flag -{name} is not accepted here")));
        }
        if name != "scope" && seen.iter().any(|s| s == name) {
            return Err(usage(&format!("flag -{name} given twice")));
        }
        seen.push(name.to_owned());
        if matches!(name, "token-stdout" | "token-stdin" | "json") {
            let on = match inline.as_deref() {
                None | Some("true" | "1") => true,
                Some("false" | "0") => false,
                Some(_) => return Err(usage(&format!("flag -{name} takes no value"))),
            };
            match name {
                "token-stdout" => flags.token_stdout = on,
                "token-stdin" => flags.token_stdin = on,
                _ => flags.json = on,
            }
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => iter
                .next()
                .cloned()
                .ok_or_else(|| usage(&format!("flag -{name} needs a value")))?,
        };
        match name {
            "file" if value.is_empty() => return Err(usage("--file must not be empty")),
            "file" => flags.file = Some(PathBuf::from(value)),
            "id" => flags.id = Some(value),
            "scope" => flags.scopes.push(value),
            _ => {
                let n = value.trim().parse::<u64>().map_err(|_| {
                    usage("--paid-seconds-per-day must be a non-negative whole number")
                })?;
                flags.paid = Some(n);
            }
        }
    }
    Ok(flags)
}

// === Running ===

/// Runs the tool with `args` (without the program name) and returns the exit status.
///
/// Writes only a generated token (or a listing, or help) to `stdout`; everything else goes
/// to `stderr`.
pub fn run(
    args: &[String],
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let result = parse_args(args).and_then(|command| execute(command, stdin, stdout, stderr));
    match result {
        Ok(()) => 0,
        Err(err) => {
            let _ = writeln!(stderr, "plimsoll-clients: {err}");
            if let ClientsToolError::Usage(_) = err {
                let _ = write!(stderr, "\n{HELP}");
            }
            err.exit_code()
        }
    }
}

/// Carries out one parsed command.
pub fn execute(
    command: Command,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), ClientsToolError> {
    match command {
        Command::Help => stdout
            .write_all(HELP.as_bytes())
            .map_err(ClientsToolError::Stdout),
        Command::List { file, json } => list(&file, json, stdout),
        Command::Create(new) => {
            let token = generate_token()?;
            add(&new, &token)?;
            print_token(&token, new.id.trim(), stdout)?;
            let _ = writeln!(
                stderr,
                "added client {:?} to {}; its token is shown once, above",
                new.id.trim(),
                new.file.display()
            );
            Ok(())
        }
        Command::Import(new) => {
            let token = read_token(stdin)?;
            add(&new, &token)?;
            let _ = writeln!(
                stderr,
                "added client {:?} to {}",
                new.id.trim(),
                new.file.display()
            );
            Ok(())
        }
        Command::Rotate { file, id, source } => {
            let token = match source {
                TokenSource::Generate => generate_token()?,
                TokenSource::Stdin => read_token(stdin)?,
            };
            rotate(&file, &id, &token)?;
            if source == TokenSource::Generate {
                print_token(&token, id.trim(), stdout)?;
            }
            let _ = writeln!(
                stderr,
                "rotated the token of {:?}; restart the daemon to apply it",
                id.trim()
            );
            Ok(())
        }
        Command::Revoke { file, id } => {
            edit(&file, |registry| {
                let before = registry.clients.len();
                registry.clients.retain(|c| c.id != id.trim());
                if registry.clients.len() == before {
                    return Err(no_such_client(&id, &file));
                }
                Ok(())
            })?;
            let _ = writeln!(
                stderr,
                "revoked client {:?} in {}",
                id.trim(),
                file.display()
            );
            Ok(())
        }
        Command::Limit {
            file,
            id,
            paid_seconds_per_day,
        } => {
            edit(&file, |registry| {
                let entry = registry
                    .clients
                    .iter_mut()
                    .find(|c| c.id == id.trim())
                    .ok_or_else(|| no_such_client(&id, &file))?;
                entry.paid_seconds_per_day = paid_seconds_per_day;
                Ok(())
            })?;
            let id = id.trim();
            match paid_seconds_per_day {
                None => {
                    let _ = writeln!(stderr, "removed the paid allowance of {id:?}");
                }
                Some(n) => {
                    if n < LOW_ALLOWANCE_SECONDS {
                        let _ = writeln!(
                            stderr,
                            "warning: {n} paid seconds per day is less than a minute of runs"
                        );
                    }
                    let _ = writeln!(stderr, "set {id:?} to {n} paid seconds per day");
                }
            }
            Ok(())
        }
    }
}

fn no_such_client(id: &str, file: &Path) -> ClientsToolError {
    ClientsToolError::NoSuchClient {
        id: id.trim().to_owned(),
        path: file.to_owned(),
    }
}

/// Locks `file`, loads it (empty when absent), applies `change`, validates and saves.
fn edit(
    file: &Path,
    change: impl FnOnce(&mut ClientsFile) -> Result<(), ClientsToolError>,
) -> Result<(), ClientsToolError> {
    let _lock = FileLock::acquire(file)?;
    let mut registry = ClientsFile::load_for_update(file)?.unwrap_or_default();
    change(&mut registry)?;
    ClientsFile::new(registry.clients)?.save_atomic(file)?;
    Ok(())
}

fn add(new: &NewClient, token: &str) -> Result<(), ClientsToolError> {
    let fingerprint = clients_file::token_sha256_hex(token);
    edit(&new.file, |registry| {
        let id = new.id.trim();
        if registry.find(id).is_some() {
            return Err(ClientsToolError::DuplicateId { id: id.to_owned() });
        }
        if let Some(owner) = registry.lookup(&fingerprint) {
            return Err(ClientsToolError::TokenInUse {
                id: owner.id.clone(),
            });
        }
        registry.clients.push(ClientEntry {
            id: id.to_owned(),
            token_sha256: fingerprint.clone(),
            scopes: new.scopes.clone(),
            paid_seconds_per_day: new.paid_seconds_per_day,
        });
        Ok(())
    })
}

fn rotate(file: &Path, id: &str, token: &str) -> Result<(), ClientsToolError> {
    let fingerprint = clients_file::token_sha256_hex(token);
    edit(file, |registry| {
        if let Some(owner) = registry.lookup(&fingerprint) {
            return Err(if owner.id == id.trim() {
                ClientsToolError::SameToken
            } else {
                ClientsToolError::TokenInUse {
                    id: owner.id.clone(),
                }
            });
        }
        let entry = registry
            .clients
            .iter_mut()
            .find(|c| c.id == id.trim())
            .ok_or_else(|| no_such_client(id, file))?;
        entry.token_sha256 = fingerprint.clone();
        Ok(())
    })
}

fn list(file: &Path, json: bool, stdout: &mut dyn Write) -> Result<(), ClientsToolError> {
    let registry = ClientsFile::load(file)?;
    let text = if json {
        let clients: Vec<serde_json::Value> = registry
            .clients
            .iter()
            .map(|c| {
                let mut obj = serde_json::json!({"id": c.id, "scopes": c.scopes});
                if let Some(n) = c.paid_seconds_per_day {
                    obj["paid_seconds_per_day"] = n.into();
                }
                obj
            })
            .collect();
        let mut text = serde_json::to_string_pretty(&serde_json::json!({ "clients": clients }))
            .map_err(|e| ClientsToolError::File(ClientsFileError::Encode(e)))?;
        text.push('\n');
        text
    } else {
        let mut text = String::new();
        for c in &registry.clients {
            let scopes = if c.scopes.is_empty() {
                "(none)".to_owned()
            } else {
                c.scopes.join(",")
            };
            let paid = c
                .paid_seconds_per_day
                .map_or_else(|| "-".to_owned(), |n| n.to_string());
            text.push_str(&format!(
                "{}\tscopes={scopes}\tpaid_seconds_per_day={paid}\n",
                c.id
            ));
        }
        text
    };
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(ClientsToolError::Stdout)
}

// === Tokens ===

/// 32 bytes from the OS RNG as 64 lower-case hex characters.
fn generate_token() -> Result<String, ClientsToolError> {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| ClientsToolError::Random(e.to_string()))?;
    Ok(hex::encode(bytes))
}

/// Reads one token from stdin: at most one trailing `\n`, then the shape rules.
fn read_token(stdin: &mut dyn Read) -> Result<String, ClientsToolError> {
    let mut bytes = Vec::new();
    // One byte past the limit plus the newline is enough to tell "too long".
    let cap = (TOKEN_MAX_BYTES + 2) as u64;
    stdin
        .take(cap)
        .read_to_end(&mut bytes)
        .map_err(ClientsToolError::Stdin)?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    let token = String::from_utf8(bytes)
        .map_err(|_| ClientsToolError::StdinToken(TokenShapeError::NotVisibleAscii))?;
    clients_file::check_token_shape(&token).map_err(ClientsToolError::StdinToken)?;
    Ok(token)
}

/// Prints the token, the only thing a command writes to stdout.
fn print_token(token: &str, id: &str, stdout: &mut dyn Write) -> Result<(), ClientsToolError> {
    writeln!(stdout, "{token}")
        .and_then(|()| stdout.flush())
        .map_err(|source| ClientsToolError::TokenNotShown {
            id: id.to_owned(),
            source,
        })
}

// === impl FileLock ===

/// `<file>.lock`, a directory whose existence is the lock; removed on drop.
struct FileLock {
    path: PathBuf,
}

impl FileLock {
    fn acquire(file: &Path) -> Result<Self, ClientsToolError> {
        let mut path = OsString::from(file.as_os_str());
        path.push(".lock");
        let path = PathBuf::from(path);
        match fs::create_dir(&path) {
            Ok(()) => Ok(Self { path }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(ClientsToolError::Locked { lock: path })
            }
            Err(source) => Err(ClientsToolError::Lock { lock: path, source }),
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests;
