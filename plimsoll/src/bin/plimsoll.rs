//! `plimsoll`: run code on a plimsolld and read the evidence, from the shell.
//!
//! Thin over [`plimsoll::client`] (every answer is checked before it is shown) and
//! [`plimsoll::attest`]. See `plimsoll --help` for the commands and exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

// Beside the binary, not under src/bin/ where it would be taken for another binary.
#[path = "plimsoll/files.rs"]
mod files;

use clap::{Args, Parser, Subcommand};
use plimsoll::attest;
use plimsoll::client::{
    Client, ClientError, RunAnswer, RunOptions, SessionAnswer, SessionOptions, SessionState,
    verify_session,
};
use plimsoll::wire::{DescribeResponse, RunResponse, run_response};
use serde::{Deserialize, Serialize};

/// Ran, and the guest exited 0 (or the evidence verified).
const EXIT_OK: u8 = 0;
/// Ran, and the guest exited non-zero, timed out, or the project did not complete.
const EXIT_GUEST_FAILED: u8 = 1;
/// The command line or a local file was unusable; nothing was sent.
const EXIT_USAGE: u8 = 2;
/// Refused: provably nothing ran (the daemon's or this client's refusal).
const EXIT_REFUSED: u8 = 3;
/// Infrastructure failure: the call may have run.
const EXIT_MAY_HAVE_RUN: u8 = 4;
/// The answer or the saved evidence does not check (data loss): it may have run.
const EXIT_NOT_VERIFIED: u8 = 5;

const AFTER_HELP: &str = "\
Exit codes:
  0  ran and the guest exited 0; or the evidence verified
  1  ran and the guest exited non-zero, timed out, or the project did not complete
  2  bad command line or unreadable local file; nothing was sent
  3  refused: nothing ran (the daemon's refusal, or this client's before sending)
  4  infrastructure failure: the call may have run (never retried automatically)
  5  the answer or the saved evidence does not check (data loss): it may have run

Environment: PLIMSOLL_URL (default http://127.0.0.1:8746), PLIMSOLL_TOKEN.";

/// Run untrusted code on a plimsolld and check the evidence of every answer.
#[derive(Parser)]
#[command(name = "plimsoll", version, after_help = AFTER_HELP)]
struct Cli {
    /// The daemon's URL.
    #[arg(
        long,
        env = "PLIMSOLL_URL",
        default_value = "http://127.0.0.1:8746",
        global = true
    )]
    url: String,
    /// Bearer token with the code:run scope.
    #[arg(long, env = "PLIMSOLL_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// PEM file of the certificate authority to trust for https (instead of the system's).
    #[arg(long, global = true)]
    ca: Option<PathBuf>,
    /// Speak prior-knowledge HTTP/2 (h2c) over cleartext.
    #[arg(long, global = true)]
    http2: bool,
    /// Allow cleartext HTTP to a host that is not loopback.
    #[arg(long, global = true)]
    insecure_http: bool,
    /// Print JSON for scripts instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What the daemon states about itself.
    Describe,
    /// Run a JavaScript snippet in a fresh sandbox.
    Run {
        /// A .js file to run (or use -e).
        file: Option<PathBuf>,
        /// The code to run.
        #[arg(short = 'e', long = "eval", conflicts_with = "file")]
        code: Option<String>,
        #[command(flatten)]
        run: RunFlags,
    },
    /// Run a project: the files under DIR, then the steps in order.
    Project {
        /// The directory whose files are sent (text files only).
        dir: PathBuf,
        /// A shell command to run (repeat, in order; at least one).
        #[arg(long = "step", required = true)]
        steps: Vec<String>,
        /// A relative path to bring back (repeat).
        #[arg(long = "artifact")]
        artifacts: Vec<String>,
        #[command(flatten)]
        run: RunFlags,
    },
    /// Sessions: one sandbox kept for many calls; state is kept in a file.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Re-check a saved answer (`run --json`) or a session state file offline.
    Verify {
        /// The file to check.
        file: PathBuf,
    },
    /// Sign and verify records with Ed25519 (DSSE envelopes, in-toto statements).
    #[command(subcommand)]
    Attest(AttestCommand),
}

#[derive(Args, Clone, Default)]
struct RunFlags {
    /// The weakest isolation tier accepted: process, container, kernel or vm.
    #[arg(long = "min-isolation")]
    min_isolation: Option<String>,
    /// The run's budget in milliseconds (default: the daemon's).
    #[arg(long = "timeout")]
    timeout_ms: Option<u64>,
    /// A grant profile configured on the daemon.
    #[arg(long = "grant")]
    grant: Option<String>,
    /// A trace id for the daemon's audit line.
    #[arg(long = "trace-id")]
    trace_id: Option<String>,
    /// Require this software identity (repeat for an approved list).
    #[arg(long = "software")]
    software: Vec<String>,
}

#[derive(Subcommand)]
enum SessionCommand {
    /// Open a session and write its state file.
    Open {
        #[arg(long)]
        state: PathBuf,
        #[arg(long = "min-isolation")]
        min_isolation: Option<String>,
        /// The end user the session is for (sent only as a keyed digest).
        #[arg(long)]
        owner: Option<String>,
        /// A language the cells will use (repeat).
        #[arg(long = "language")]
        languages: Vec<String>,
    },
    /// Run a snippet in the session.
    Run {
        #[arg(long)]
        state: PathBuf,
        file: Option<PathBuf>,
        #[arg(short = 'e', long = "eval", conflicts_with = "file")]
        code: Option<String>,
        #[command(flatten)]
        run: RunFlags,
    },
    /// Run a cell in the session's interpreter.
    Cell {
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value = "python")]
        language: String,
        file: Option<PathBuf>,
        #[arg(short = 'e', long = "eval", conflicts_with = "file")]
        code: Option<String>,
        #[command(flatten)]
        run: RunFlags,
    },
    /// Close the session and check the daemon's totals against the chain.
    Close {
        #[arg(long)]
        state: PathBuf,
    },
}

#[derive(Subcommand)]
enum AttestCommand {
    /// Write a new Ed25519 key pair (PKCS#8 private, SPKI public PEM).
    Keygen {
        #[arg(long)]
        private: PathBuf,
        #[arg(long)]
        public: PathBuf,
    },
    /// Sign a saved answer (prints a DSSE envelope) or a session state file (prints a bundle).
    Sign {
        #[arg(long)]
        key: PathBuf,
        file: PathBuf,
    },
    /// Verify an envelope (with --answer) or a session bundle.
    Verify {
        #[arg(long)]
        public: PathBuf,
        file: PathBuf,
        /// The saved answer the envelope signs.
        #[arg(long)]
        answer: Option<PathBuf>,
    },
}

/// A session state file: what the client holds, and every checked answer so far.
#[derive(Serialize, Deserialize, Default)]
struct SessionFile {
    state: SessionState,
    answers: Vec<SessionAnswer>,
}

/// How a command ended: an exit code and what to say on stderr.
struct Failed(u8, String);

impl From<ClientError> for Failed {
    fn from(e: ClientError) -> Failed {
        let code = if e.is_data_loss() {
            EXIT_NOT_VERIFIED
        } else if e.not_dispatched_reason().is_some() {
            EXIT_REFUSED
        } else {
            EXIT_MAY_HAVE_RUN
        };
        let note = match e.not_dispatched_reason() {
            Some(mark) => format!(" [not dispatched: {mark}]"),
            None => " [may have run]".to_owned(),
        };
        Failed(code, format!("{e}{note}"))
    }
}

fn usage(message: impl Into<String>) -> Failed {
    Failed(EXIT_USAGE, message.into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plimsoll: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_MAY_HAVE_RUN);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(Failed(code, message)) => {
            // Client errors already name the program.
            let message = message.strip_prefix("plimsoll: ").unwrap_or(&message);
            eprintln!("plimsoll: {message}");
            ExitCode::from(code)
        }
    }
}

async fn run(cli: Cli) -> Result<u8, Failed> {
    match &cli.command {
        Command::Verify { file } => verify(file, cli.json),
        Command::Attest(cmd) => attest_command(cmd),
        Command::Describe => {
            let info = client(&cli)?.describe().await?;
            print_describe(&info, cli.json)?;
            Ok(EXIT_OK)
        }
        Command::Run { file, code, run } => {
            let code = source(file.as_deref(), code.as_deref())?;
            let answer = client(&cli)?.run_javascript(&code, &options(run)).await?;
            print_answer(&answer.response, cli.json, &answer)
        }
        Command::Project {
            dir,
            steps,
            artifacts,
            run,
        } => {
            let files = read_tree(dir)?;
            let answer = client(&cli)?
                .run_project(&files, steps, artifacts, &options(run))
                .await?;
            print_answer(&answer.response, cli.json, &answer)
        }
        Command::Session(cmd) => session(&cli, cmd).await,
    }
}

fn client(cli: &Cli) -> Result<Client, Failed> {
    let mut b = Client::builder(&cli.url)
        .http2(cli.http2)
        .insecure_http(cli.insecure_http);
    if let Some(t) = &cli.token {
        b = b.token(t.clone());
    }
    if let Some(ca) = &cli.ca {
        b = b.ca_pem(read(ca)?);
    }
    b.build().map_err(|e| usage(e.to_string()))
}

fn options(f: &RunFlags) -> RunOptions {
    let mut o = RunOptions::new();
    if let Some(t) = &f.min_isolation {
        o = o.minimum_isolation(t.clone());
    }
    if let Some(ms) = f.timeout_ms {
        o = o.timeout(Duration::from_millis(ms));
    }
    if let Some(g) = &f.grant {
        o = o.grant_profile(g.clone());
    }
    if let Some(t) = &f.trace_id {
        o = o.trace_id(t.clone());
    }
    match f.software.as_slice() {
        [] => o,
        [one] => o.software_exact(one.clone()),
        many => o.software_approved(many.iter().cloned()),
    }
}

/// A failure on `path`, named with it.
fn at<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> Failed + '_ {
    move |e| usage(format!("{}: {e}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>, Failed> {
    std::fs::read(path).map_err(at(path))
}

fn read_text(path: &Path) -> Result<String, Failed> {
    String::from_utf8(read(path)?).map_err(|_| usage(format!("{}: not UTF-8 text", path.display())))
}

fn write(path: &Path, data: &[u8]) -> Result<(), Failed> {
    std::fs::write(path, data).map_err(at(path))
}

/// Writes a file only its owner may read, replacing what is at `path` whole (never
/// through a symbolic link): see [`files`].
fn write_private(path: &Path, data: &[u8]) -> Result<(), Failed> {
    files::Pending::beside(path)
        .map_err(at(path))?
        .commit(data)
        .map_err(at(path))
}

fn source(file: Option<&Path>, code: Option<&str>) -> Result<String, Failed> {
    match (file, code) {
        (_, Some(c)) => Ok(c.to_owned()),
        (Some(f), None) => read_text(f),
        (None, None) => Err(usage("give a FILE or -e CODE")),
    }
}

/// Every regular file under `dir`, as (relative path with `/`, text), sorted by path. A
/// symbolic link or any other kind of file is refused: following a link could send a file
/// from outside the project (a key, a password file) into the sandbox, and skipping it
/// would leave the project short without a word.
fn read_tree(dir: &Path) -> Result<Vec<(String, String)>, Failed> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(at(&d))?;
        for entry in entries {
            let entry = entry.map_err(at(&d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(at(&path))?;
            if kind.is_symlink() {
                return Err(usage(format!(
                    "{}: a symbolic link; a project is sent as regular files only (copy what it points to in place of the link, or remove it)",
                    path.display()
                )));
            } else if kind.is_dir() {
                stack.push(path);
            } else if !kind.is_file() {
                return Err(usage(format!(
                    "{}: not a regular file or a directory; a project is sent as regular files only",
                    path.display()
                )));
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .map_err(|_| usage(format!("{}: outside {}", path.display(), dir.display())))?;
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push((rel.join("/"), read_text(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn to_json<T: Serialize>(v: &T) -> Result<String, Failed> {
    serde_json::to_string_pretty(v).map_err(|e| Failed(EXIT_MAY_HAVE_RUN, format!("JSON: {e}")))
}

fn print_describe(info: &DescribeResponse, json: bool) -> Result<(), Failed> {
    if json {
        println!("{}", to_json(info)?);
        return Ok(());
    }
    println!("provider:   {}", info.sandbox);
    println!("isolation:  {}", info.isolation);
    println!("protocol:   {}", info.protocol);
    if let Some(js) = info.javascript_environment.as_option() {
        println!("javascript: {} (max {} ms)", js.identity, js.max_timeout_ms);
    }
    println!("projects:   {}", info.supports_project);
    println!("sessions:   {}", info.supports_sessions);
    Ok(())
}

/// The exit code a checked run earns: 0 only when the guest finished cleanly.
fn guest_code(resp: &RunResponse) -> u8 {
    let ok = match &resp.result {
        Some(run_response::Result::Javascript(j)) => j.exit_code == 0 && !j.timed_out,
        Some(run_response::Result::Cell(c)) => c.exit_code == 0 && !c.timed_out,
        Some(run_response::Result::Project(p)) => {
            p.outcome == plimsoll::wire::ProjectOutcome::PROJECT_OUTCOME_COMPLETED
                && p.steps.iter().all(|s| s.exit_code == 0 && !s.timed_out)
        }
        Some(run_response::Result::Module(m)) => {
            m.outcome == plimsoll::wire::ProjectOutcome::PROJECT_OUTCOME_COMPLETED
        }
        None => false,
    };
    if ok { EXIT_OK } else { EXIT_GUEST_FAILED }
}

fn print_answer<T: Serialize>(resp: &RunResponse, json: bool, whole: &T) -> Result<u8, Failed> {
    if json {
        println!("{}", to_json(whole)?);
        return Ok(guest_code(resp));
    }
    let record = resp
        .record
        .as_option()
        .map(|r| r.record_sha256.as_str())
        .unwrap_or("");
    println!("provider:  {}", resp.sandbox);
    println!("isolation: {}", resp.isolation);
    let (code, timed_out, out, err) = match &resp.result {
        Some(run_response::Result::Javascript(j)) => {
            (j.exit_code, j.timed_out, j.stdout.clone(), j.stderr.clone())
        }
        Some(run_response::Result::Cell(c)) => {
            (c.exit_code, c.timed_out, c.stdout.clone(), c.stderr.clone())
        }
        Some(run_response::Result::Project(p)) => {
            println!("outcome:   {:?} {}", p.outcome, p.outcome_detail);
            let last = p.steps.last();
            let mut out = Vec::new();
            let mut err = Vec::new();
            for s in &p.steps {
                out.extend_from_slice(&s.stdout);
                err.extend_from_slice(&s.stderr);
            }
            for a in &p.artifacts {
                println!("artifact:  {} ({} bytes)", a.path, a.content.len());
            }
            (
                last.map_or(0, |s| s.exit_code),
                last.is_some_and(|s| s.timed_out),
                out,
                err,
            )
        }
        _ => (0, false, Vec::new(), Vec::new()),
    };
    println!(
        "exit code: {code}{}",
        if timed_out { " (timed out)" } else { "" }
    );
    println!("duration:  {} ms", resp.duration_ms);
    println!("record:    {record} (verified)");
    println!("stdout:\n{}", String::from_utf8_lossy(&out));
    if !err.is_empty() {
        println!("stderr:\n{}", String::from_utf8_lossy(&err));
    }
    Ok(guest_code(resp))
}

fn verify(file: &Path, json: bool) -> Result<u8, Failed> {
    let text = read_text(file)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(at(file))?;
    let not_verified = |e: String| {
        Failed(
            EXIT_NOT_VERIFIED,
            format!("{}: does not check: {e}", file.display()),
        )
    };
    let (what, digest) = if value.get("state").is_some() {
        let sf: SessionFile = serde_json::from_value(value).map_err(|e| usage(e.to_string()))?;
        let (calls, last) =
            verify_session(&sf.state, &sf.answers).map_err(|e| not_verified(e.to_string()))?;
        (format!("session of {calls} calls"), last)
    } else {
        let answer: RunAnswer = serde_json::from_value(value).map_err(|e| usage(e.to_string()))?;
        let record = answer.verify().map_err(|e| not_verified(e.to_string()))?;
        ("run".to_owned(), record.record_sha256.clone())
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"verified": true, "what": what, "record_sha256": digest})
        );
    } else {
        println!("verified: {what}, record {digest}");
    }
    Ok(EXIT_OK)
}

/// A session state file, locked for this command, with its replacement made ahead.
struct Locked {
    _lock: std::fs::File,
    path: PathBuf,
    save: files::Pending,
    file: SessionFile,
}

impl Locked {
    fn save(self) -> Result<(), Failed> {
        let data = to_json(&self.file)?;
        self.save.commit(data.as_bytes()).map_err(at(&self.path))
    }
}

/// Locks and reads a session's state file, and makes its replacement before any call is
/// sent (a directory that cannot take it fails the command here, with nothing run).
fn load_session(path: &Path) -> Result<Locked, Failed> {
    let (lock, text) = files::lock(path).map_err(at(path))?;
    let file = serde_json::from_str(&text).map_err(at(path))?;
    let save = files::Pending::beside(path).map_err(at(path))?;
    Ok(Locked {
        _lock: lock,
        path: path.to_owned(),
        save,
        file,
    })
}

async fn session(cli: &Cli, cmd: &SessionCommand) -> Result<u8, Failed> {
    let c = client(cli)?;
    match cmd {
        SessionCommand::Open {
            state,
            min_isolation,
            owner,
            languages,
        } => {
            let mut o = SessionOptions::new().languages(languages.iter().cloned());
            if let Some(t) = min_isolation {
                o = o.minimum_isolation(t.clone());
            }
            if let Some(w) = owner {
                o = o.owner(w.clone());
            }
            // Made before the open: a state file that cannot be written fails here.
            let save = files::Pending::beside(state).map_err(at(state))?;
            let s = c.open_session(&o).await?;
            let sf = SessionFile {
                state: s.state().await,
                answers: Vec::new(),
            };
            save.commit(to_json(&sf)?.as_bytes()).map_err(at(state))?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"session": sf.state.fingerprint, "provider": sf.state.provider, "isolation": sf.state.isolation})
                );
            } else {
                println!("session:   {}", sf.state.fingerprint);
                println!("provider:  {}", sf.state.provider);
                println!("isolation: {}", sf.state.isolation);
            }
            Ok(EXIT_OK)
        }
        SessionCommand::Run {
            state,
            file,
            code,
            run,
        }
        | SessionCommand::Cell {
            state,
            file,
            code,
            run,
            ..
        } => {
            let src = source(file.as_deref(), code.as_deref())?;
            let mut locked = load_session(state)?;
            let sf = &mut locked.file;
            let s = c.resume_session(sf.state.clone());
            let result = match cmd {
                SessionCommand::Cell { language, .. } => {
                    s.run_cell(language, &src, &[], &options(run)).await
                }
                _ => s.run_javascript(&src, &options(run)).await,
            };
            sf.state = s.state().await;
            // Both count in the chain: the file keeps every call the state counts.
            match &result {
                Ok(a) => sf.answers.push(a.clone()),
                Err(e) => sf.answers.extend(e.unanswered_call().cloned()),
            }
            locked.save()?;
            let mut answer = result?;
            // Printed answers go to terminals and job logs: never the session id.
            answer.request.session_id.clear();
            print_answer(answer.run(), cli.json, &answer)
        }
        SessionCommand::Close { state } => {
            let mut locked = load_session(state)?;
            let s = c.resume_session(locked.file.state.clone());
            let result = s.close().await;
            locked.file.state = s.state().await;
            locked.save()?;
            let summary = result?;
            if cli.json {
                println!("{}", to_json(&summary)?);
            } else {
                println!(
                    "closed: {} calls, last record {}",
                    summary.calls, summary.last_record_sha256
                );
            }
            Ok(EXIT_OK)
        }
    }
}

fn attest_command(cmd: &AttestCommand) -> Result<u8, Failed> {
    let bad = |e: attest::AttestError| Failed(EXIT_NOT_VERIFIED, e.to_string());
    match cmd {
        AttestCommand::Keygen { private, public } => {
            let (sk, pk) = attest::keygen().map_err(|e| usage(e.to_string()))?;
            write_private(private, sk.as_bytes())?;
            write(public, pk.as_bytes())?;
            Ok(EXIT_OK)
        }
        AttestCommand::Sign { key, file } => {
            let key = attest::signing_key(&read_text(key)?).map_err(|e| usage(e.to_string()))?;
            let value: serde_json::Value =
                serde_json::from_str(&read_text(file)?).map_err(|e| usage(e.to_string()))?;
            if value.get("state").is_some() {
                let sf: SessionFile =
                    serde_json::from_value(value).map_err(|e| usage(e.to_string()))?;
                print!(
                    "{}",
                    attest::sign_session(&key, &sf.state, &sf.answers).map_err(bad)?
                );
            } else {
                let answer: RunAnswer =
                    serde_json::from_value(value).map_err(|e| usage(e.to_string()))?;
                let record = answer.verify()?;
                println!(
                    "{}",
                    to_json(&attest::sign_record(&key, record).map_err(bad)?)?
                );
            }
            Ok(EXIT_OK)
        }
        AttestCommand::Verify {
            public,
            file,
            answer,
        } => {
            let key =
                attest::verifying_key(&read_text(public)?).map_err(|e| usage(e.to_string()))?;
            let text = read_text(file)?;
            match answer {
                Some(a) => {
                    let env: attest::Envelope =
                        serde_json::from_str(&text).map_err(|e| usage(e.to_string()))?;
                    let answer: RunAnswer =
                        serde_json::from_str(&read_text(a)?).map_err(|e| usage(e.to_string()))?;
                    attest::verify_answer(&key, &env, &answer).map_err(bad)?;
                    println!("verified: signed record {}", answer.record().record_sha256);
                }
                None => {
                    let (calls, last) = attest::verify_bundle(&key, &text).map_err(bad)?;
                    println!("verified: bundle of {calls} calls, last record {last}");
                }
            }
            Ok(EXIT_OK)
        }
    }
}
