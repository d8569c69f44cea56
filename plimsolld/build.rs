//! Builds the wasm provider's guest (`wasm-guest/`, QuickJS for `wasm32-wasip1`) and puts
//! the module in `OUT_DIR/wasm-guest.wasm`, where `provider::wasm` embeds it with
//! `include_bytes!`.
//!
//! The guest is its own cargo project (excluded from the workspace), built with its own
//! target directory `wasm-guest/target`, so an unchanged guest costs one no-op cargo call.
//! What it needs on the machine is what `scripts/setup-wasm` installs: the `wasm32-wasip1`
//! Rust target, `clang`, `llvm-ar` and Debian's `wasi-libc`. Each missing piece fails the
//! build with a message that names it.
//!
//! Nothing happens when the `wasm` feature is off.
//!
//! With the `openshell` feature it also generates the OpenShell gateway's client and messages
//! from the workspace's `proto/openshell/` (the one source, checked against OpenShell's
//! published package; nothing generated is checked in). protoc finds the well-known types in
//! its own include directory, which Debian's `libprotobuf-dev` provides (scripts/setup).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest's project, relative to this crate.
const GUEST_DIR: &str = "../wasm-guest";
/// The module's name in the guest's target directory and in `OUT_DIR`.
const MODULE: &str = "wasm-guest.wasm";
const TARGET: &str = "wasm32-wasip1";
/// A header Debian's `wasi-libc` installs; clang finds the WASI sysroot through it.
const WASI_LIBC_HEADER: &str = "/usr/include/wasm32-wasi/stdio.h";

fn main() {
    #[cfg(feature = "openshell")]
    if let Err(message) = openshell_protos() {
        eprintln!("plimsolld build: the OpenShell protocol: {message}");
        std::process::exit(1);
    }
    if env::var_os("CARGO_FEATURE_WASM").is_none() {
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let guest = manifest_dir.join(GUEST_DIR);
    for input in ["src", "Cargo.toml", "Cargo.lock", ".cargo/config.toml"] {
        println!("cargo::rerun-if-changed={}", guest.join(input).display());
    }
    if let Err(message) = build(&guest) {
        // Cargo shows a failed build script's stderr under `--- stderr`.
        eprintln!("plimsolld build: {message}");
        std::process::exit(1);
    }
}

fn build(guest: &Path) -> Result<(), String> {
    check_tools()?;
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(guest)
        .args(["build", "--release", "--locked", "--target", TARGET])
        .arg("--target-dir")
        .arg(guest.join("target"));
    // The outer build's settings are for the host crates, not for the guest: compiler
    // wrappers (clippy sets one), flags and a target directory would leak into it.
    for name in [
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CLIPPY_ARGS",
    ] {
        command.env_remove(name);
    }
    let output = command.output().map_err(|e| {
        format!(
            "cannot run cargo to build the wasm guest in {}: {e}",
            guest.display()
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "building the wasm guest (cd {} && cargo build --release --target {TARGET}) failed; \
             run scripts/setup-wasm to install what it needs.\n{}",
            guest.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let built = guest
        .join("target")
        .join(TARGET)
        .join("release")
        .join(MODULE);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::copy(&built, out_dir.join(MODULE))
        .map_err(|e| format!("cannot copy the wasm guest {}: {e}", built.display()))?;
    Ok(())
}

/// Names the first missing piece of the guest's toolchain.
fn check_tools() -> Result<(), String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot.join("lib/rustlib").join(TARGET).exists() {
        return Err(format!(
            "the Rust target {TARGET} is not installed (the wasm provider's guest needs it): \
             run `rustup target add {TARGET}` or scripts/setup-wasm"
        ));
    }
    for (tool, package) in [("clang", "clang"), ("llvm-ar", "llvm")] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!(
                "`{tool}` is not on PATH (the wasm provider's guest compiles QuickJS with it): \
                 run `apt-get install -y {package}` or scripts/setup-wasm"
            ));
        }
    }
    if !Path::new(WASI_LIBC_HEADER).exists() {
        return Err(format!(
            "the WASI C library headers are missing ({WASI_LIBC_HEADER}): \
             run `apt-get install -y wasi-libc` or scripts/setup-wasm"
        ));
    }
    Ok(())
}

/// The gateway's client (no server) and messages, with ordered maps so a policy's encoding,
/// and so its hash, is the same every time.
#[cfg(feature = "openshell")]
fn openshell_protos() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dir = manifest_dir.join("../proto/openshell");
    let files = ["openshell.proto", "sandbox.proto", "datamodel.proto"].map(|f| dir.join(f));
    for file in &files {
        println!("cargo::rerun-if-changed={}", file.display());
    }
    tonic_prost_build::configure()
        .btree_map(".")
        .build_server(false)
        .build_client(true)
        .compile_protos(&files, &[dir])?;
    Ok(())
}
