//! The protocol's messages and service, generated from `proto/plimsoll/v1/sandbox.proto`.
//!
//! Everything is re-exported flat under this module: `wire::RunRequest`,
//! `wire::run_request::Payload` (each `oneof` sits in a module named for its message),
//! `wire::SandboxService`, and so on. The
//! generated code is never edited by hand; change the `.proto` instead.

#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
mod generated {
    connectrpc::include_generated!();
}

pub use generated::plimsoll::v1::*;

/// The full name of the service, as it appears in every RPC path.
pub const SERVICE_NAME: &str = "plimsoll.v1.SandboxService";

/// The path prefix shared by every procedure of the service.
pub const SERVICE_PREFIX: &str = "/plimsoll.v1.SandboxService/";

/// The five procedures, by the name that ends their path.
pub const PROCEDURES: [&str; 5] = [
    "Run",
    "Describe",
    "OpenSession",
    "SessionRun",
    "CloseSession",
];
