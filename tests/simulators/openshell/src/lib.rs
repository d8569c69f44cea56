//! A stand-in for NVIDIA OpenShell's gateway, so plimsoll's openshell provider and relay can
//! be tested here, where no gateway can be reached.
//!
//! It speaks the gateway's own gRPC API (`openshell.v1.OpenShell`, from the workspace's
//! `proto/openshell/`, which is checked field by field against OpenShell's published
//! Python package) over HTTP/2 with mutual TLS, and backs every sandbox with a local,
//! locked-down container (runsc where docker has it, else runc). Faithfulness is judged
//! by OpenShell's own published client, which drives it unmodified in
//! `fidelity/test_client.py`. docs/openshell-simulator.md says what is simulated and how
//! closely.
//!
//! # Using it from a test
//!
//! [`launch::Simulator::start`] runs the built binary and parses its ready line
//! ([`server::Ready`]: the gRPC URL, the CA, client certificate and key, the admin URL).
//! [`launch::Simulator::set_faults`] switches [`Faults`] on and off. The generated client
//! and messages are in [`proto`].
//!
//! # The pieces
//!
//! - [`server`]: startup (test CA, docker, listeners), the ready line, shutdown.
//! - [`gateway`]: the service, one module per part of the API.
//! - [`docker`]: sandbox containers and execs in them.
//! - [`faults`], [`admin`]: faults on demand, over a loopback HTTP endpoint.
//! - [`policy_hash`]: the gateway's deterministic policy hash.
//! - [`clock`]: the gateway's (skewable) clock.
#![forbid(unsafe_code)]

pub mod admin;
pub mod client;
pub mod clock;
pub mod docker;
pub mod faults;
pub mod gateway;
pub mod ids;
pub mod launch;
pub mod options;
pub mod pki;
pub mod policy_hash;
pub mod server;
pub mod validate;

pub use faults::{ConfigFault, Faults, GatewayInfoError, ReadbackFault};
pub use options::Options;

/// The generated messages, server and client of `proto/openshell/` (never hand-edited).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    pub mod v1 {
        tonic::include_proto!("openshell.v1");
    }
    pub mod sandbox {
        pub mod v1 {
            tonic::include_proto!("openshell.sandbox.v1");
        }
    }
    pub mod datamodel {
        pub mod v1 {
            tonic::include_proto!("openshell.datamodel.v1");
        }
    }
}
