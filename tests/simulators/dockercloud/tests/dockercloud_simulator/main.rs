//! The simulator's wire rules, one test per rule, each through the built binary and the
//! runtime in PLIMSOLL_TEST_DOCKER_RUNTIME (runc by default): each asserts the behaviour
//! grants.md §7 (and Docker's REST API reference, for REST) describes. Docker's own
//! published SDK drives the simulator separately (fidelity/test_client.py); these tests
//! cover what it does not: the token rules, REST, egress, faults, timeouts. Every test
//! starts its own simulator, which removes its containers when the test ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod common;
mod egress;
mod endpoint;
mod faults;
mod management;
mod rest;
