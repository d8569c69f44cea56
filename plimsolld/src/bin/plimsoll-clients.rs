//! `plimsoll-clients`: edit a caller registry offline. Everything lives in
//! `plimsolld::clients_tool`; this only wires up the process's arguments and standard streams.

use std::io;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Rust's runtime already ignores SIGPIPE, so a closed stdout is a write error, not a kill.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let code = plimsolld::clients_tool::run(
        &args,
        &mut io::stdin().lock(),
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
    );
    ExitCode::from(code)
}
