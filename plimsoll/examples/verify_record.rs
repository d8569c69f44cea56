//! Runs one snippet through the checked client, saves the answer as JSON, and re-checks the
//! saved answer offline, as `plimsoll verify` does.
//!
//! Point it at a daemon with `PLIMSOLL_URL` (default `http://127.0.0.1:8746`) and
//! `PLIMSOLL_TOKEN` when the daemon wants one:
//!
//! ```text
//! PLIMSOLL_URL=http://127.0.0.1:8746 PLIMSOLL_TOKEN=... \
//!     cargo run --example verify_record   (from the workspace root)
//! ```

use std::process::ExitCode;

use plimsoll::client::{Client, RunAnswer, RunOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("verify_record: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::var("PLIMSOLL_URL").unwrap_or_else(|_| "http://127.0.0.1:8746".into());
    let mut builder = Client::builder(url);
    if let Ok(token) = std::env::var("PLIMSOLL_TOKEN") {
        builder = builder.token(token);
    }
    let client = builder.build().map_err(|e| e.to_string())?;

    // Every check (request id echo, digests, evidence, floor) has passed once this returns.
    let answer = client
        .run_javascript(
            "console.log(6*7)",
            &RunOptions::new().minimum_isolation("process"),
        )
        .await
        .map_err(|e| match e.not_dispatched_reason() {
            Some(mark) => format!("refused, nothing ran ({mark}): {e}"),
            None => format!("may have run: {e}"),
        })?;
    println!(
        "ran on {} at {}",
        answer.response.sandbox, answer.response.isolation
    );

    // Save it, read it back, and re-check it with nothing but the saved file.
    let saved = serde_json::to_string_pretty(&answer).map_err(|e| e.to_string())?;
    let back: RunAnswer = serde_json::from_str(&saved).map_err(|e| e.to_string())?;
    let record = back
        .verify()
        .map_err(|e| format!("the saved answer does not check: {e}"))?;
    println!("record {} verified offline", record.record_sha256);
    Ok(())
}
