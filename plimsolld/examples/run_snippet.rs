//! Runs one JavaScript snippet on a running plimsolld and prints what the answer says:
//! provider, isolation, exit code, timed out, truncation flags, duration and stdout, all
//! read from the result, and whether its run record checks out.
//!
//! It starts nothing itself. Point it at a daemon with `PLIMSOLL_URL` (and
//! `PLIMSOLL_TOKEN` when the daemon wants one); the snippet is the arguments, joined by
//! spaces, or `console.log(6*7)` when there are none:
//!
//! ```text
//! PLIMSOLL_URL=http://127.0.0.1:8080 PLIMSOLL_TOKEN=... \
//!     cargo run -p plimsolld --example run_snippet -- 'console.log(6*7)'
//! ```
//!
//! `scripts/run-main` starts a wasm daemon and runs this against it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use connectrpc::client::{ClientConfig, HttpClient};
use plimsoll::record::{check_single, request_digest};
use plimsoll::refusal::PROTOCOL;
use plimsoll::wire::{JavaScriptRun, RunRequest, RunResponse, SandboxServiceClient, run_response};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("run_snippet: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::var("PLIMSOLL_URL")
        .map_err(|_| "set PLIMSOLL_URL to the daemon's URL, e.g. http://127.0.0.1:8080")?;
    let token = std::env::var("PLIMSOLL_TOKEN").unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = if args.is_empty() {
        "console.log(6*7)".to_owned()
    } else {
        args.join(" ")
    };

    let uri = url
        .parse()
        .map_err(|e| format!("PLIMSOLL_URL {url:?}: {e}"))?;
    let mut config = ClientConfig::new(uri).with_default_timeout(Duration::from_secs(60));
    if !token.is_empty() {
        let value = http::HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| "PLIMSOLL_TOKEN is not a valid header value")?;
        config = config.with_default_header(http::header::AUTHORIZATION, value);
    }
    let client = SandboxServiceClient::new(HttpClient::plaintext(), config);

    let request = RunRequest {
        protocol: PROTOCOL,
        payload: Some(
            JavaScriptRun {
                code,
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    let digest = request_digest(&request);
    let response: RunResponse = client
        .run(request)
        .await
        .map_err(|e| format!("the daemon refused or failed the run: {e}"))?
        .into_owned();
    let record = match check_single(&digest, None, &response) {
        Ok(_) => "verified".to_owned(),
        Err(e) => format!("DOES NOT CHECK OUT: {e}"),
    };
    let Some(run_response::Result::Javascript(result)) = &response.result else {
        return Err("the answer carries no JavaScript result".to_owned());
    };
    println!("provider:    {}", response.sandbox);
    println!("isolation:   {}", response.isolation);
    println!("environment: {}", response.environment);
    println!("exit code:   {}", result.exit_code);
    println!("timed out:   {}", result.timed_out);
    println!(
        "truncated:   stdout {}, stderr {}",
        result.stdout_truncated, result.stderr_truncated
    );
    println!("duration:    {} ms", response.duration_ms);
    println!("record:      {record}");
    println!("stdout:");
    let mut out = std::io::stdout().lock();
    out.write_all(&result.stdout).map_err(|e| e.to_string())?;
    if !result.stderr.is_empty() {
        writeln!(out, "stderr:").map_err(|e| e.to_string())?;
        out.write_all(&result.stderr).map_err(|e| e.to_string())?;
    }
    Ok(())
}
