//! Generates the OpenShell gateway's messages, server and client from the workspace's
//! `proto/openshell/` (the one source; nothing generated is checked in). protoc finds the
//! well-known types (`google/protobuf/*.proto`) in its own include directory, which
//! Debian's `libprotobuf-dev` provides (scripts/setup installs it).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../proto/openshell");
    let files = ["openshell.proto", "sandbox.proto", "datamodel.proto"].map(|f| dir.join(f));
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    tonic_prost_build::configure()
        // Ordered maps: answers encode the same bytes every time, and the policy hash walks
        // map entries sorted by key.
        .btree_map(".")
        .build_server(true)
        .build_client(true)
        .compile_protos(&files, &[dir])?;
    Ok(())
}
