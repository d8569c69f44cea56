//! What the vendor simulators under `tests/simulators/` share, so each of them keeps only
//! what its vendor does differently: [`docker`] drives a sandbox's local container through
//! the Docker Engine API with a time budget on every call, [`closing`] ends a simulator
//! without leaving a container behind, and [`launch`] starts a simulator binary from a test,
//! reads its ready line and stops it on drop.

pub mod closing;
pub mod docker;
pub mod launch;
