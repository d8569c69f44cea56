//! `sim-worker`: see the library's docs.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(sim_worker::cli::main(&args));
}
