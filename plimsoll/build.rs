//! Generates the protocol's message types and service trait from `proto/`,
//! the wire's single source, into `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    connectrpc_build::Config::new()
        .files(&["../proto/plimsoll/v1/sandbox.proto"])
        .includes(&["../proto"])
        .include_file("_connectrpc.rs")
        .compile()?;
    Ok(())
}
