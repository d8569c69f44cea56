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

#[cfg(test)]
mod tests {
    use super::*;

    /// wire.md §5.6: doubles survive proto3 JSON bit for bit, or request and
    /// result digests computed on either side of the wire disagree.
    #[test]
    fn json_doubles_decode_to_the_exact_value_sent() {
        for text in [
            "2.5e57",
            "985.6906946328695",
            "1e-30",
            "0.1",
            "5e-324",
            "1.7976931348623157e308",
        ] {
            let json = format!(r#"{{"protocol":4,"module":{{"rows":[{{"values":[{text}]}}]}}}}"#);
            let req: RunRequest = serde_json::from_str(&json).expect("decodes");
            let Some(run_request::Payload::Module(m)) = req.payload else {
                panic!("module payload expected");
            };
            let want: f64 = text.parse().expect("literal");
            assert_eq!(m.rows[0].values[0].to_bits(), want.to_bits(), "{text}");
        }
    }
}
