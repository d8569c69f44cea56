//! The driver check and its cache (grants.md §8.2).
//!
//! `GetGatewayInfo` must report exactly one compute driver, named `docker` with
//! `capabilities.driver_name == "docker"`, supporting memory and CPU limits; anything else is
//! refused. PermissionDenied or Unauthenticated make the provider refuse to serve.
//!
//! An answer is reused for 5 s. A stale answer starts one check, detached from the caller and
//! bounded to 10 s, and the caller gets the last answer at once ("not ready" before the first
//! check finishes): a `/readyz` flood costs at most one gateway call per 5 s, and a caller
//! that hangs up cannot cancel a check halfway. Startup waits for a fresh answer instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use plimsoll::tier::IsolationTier;
use tokio::sync::Notify;
use tonic::Code;

use super::gateway::{Gateway, GatewayError};
use super::proto::v1::GetGatewayInfoResponse;

/// How long an answer is reused.
pub const CACHE: Duration = Duration::from_secs(5);
/// How long one check may take.
const CHECK_BOUND: Duration = Duration::from_secs(10);

/// Why the gateway is not fit to serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The gateway could not be asked.
    #[error("{0}")]
    Gateway(String),
    /// The gateway refused plimsoll's identity (under OIDC the call needs platform_admin).
    #[error("the gateway refused GetGatewayInfo ({0}); plimsolld refuses to serve with it")]
    Refused(String),
    /// Not exactly one docker driver with memory and CPU limits.
    #[error("the gateway's compute drivers are refused: {0}")]
    Drivers(String),
    /// No check has finished yet.
    #[error("the gateway has not been checked yet")]
    Unchecked,
}

/// Judges a `GetGatewayInfo` answer.
pub fn judge(info: &GetGatewayInfoResponse) -> Result<(), DriverError> {
    let drivers = &info.compute_drivers;
    let [driver] = drivers.as_slice() else {
        let names: Vec<&str> = drivers.iter().map(|d| d.name.as_str()).collect();
        return Err(DriverError::Drivers(format!(
            "exactly one (docker) is required, the gateway lists {names:?}"
        )));
    };
    let caps = driver.capabilities.as_ref();
    if driver.name != "docker" || caps.map(|c| c.driver_name.as_str()) != Some("docker") {
        return Err(DriverError::Drivers(format!(
            "the driver is {:?}, not docker",
            driver.name
        )));
    }
    let resources = caps.and_then(|c| c.resource_capabilities.as_ref());
    let memory = resources
        .and_then(|r| r.memory.as_ref())
        .is_some_and(|m| m.limit_supported);
    let cpu = resources
        .and_then(|r| r.cpu.as_ref())
        .is_some_and(|c| c.limit_supported);
    if !(memory && cpu) {
        return Err(DriverError::Drivers(
            "the docker driver does not support both memory and CPU limits".to_owned(),
        ));
    }
    Ok(())
}

fn classify(e: GatewayError) -> DriverError {
    match e.code() {
        Some(code @ (Code::PermissionDenied | Code::Unauthenticated)) => {
            DriverError::Refused(format!("{code:?}"))
        }
        _ => DriverError::Gateway(e.to_string()),
    }
}

#[derive(Clone)]
struct Answer {
    at: Instant,
    result: Result<(), DriverError>,
}

/// The cached driver check and the tier it supports.
pub struct Readiness {
    gateway: Gateway,
    last: Mutex<Option<Answer>>,
    checking: AtomicBool,
    answered: Notify,
    proven: OnceLock<IsolationTier>,
}

impl Readiness {
    /// Nothing checked yet.
    pub fn new(gateway: Gateway) -> Readiness {
        Readiness {
            gateway,
            last: Mutex::new(None),
            checking: AtomicBool::new(false),
            answered: Notify::new(),
            proven: OnceLock::new(),
        }
    }

    fn last(&self) -> Option<Answer> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last answer at once, starting a detached check when it is older than 5 s.
    pub fn answer(self: &Arc<Self>) -> Result<(), DriverError> {
        let last = self.last();
        if last.as_ref().is_none_or(|a| a.at.elapsed() >= CACHE) {
            self.spawn_check();
        }
        last.map_or(Err(DriverError::Unchecked), |a| a.result)
    }

    /// A fresh answer (startup): waits for a check that starts after this call.
    pub async fn fresh(self: &Arc<Self>) -> Result<(), DriverError> {
        let asked = Instant::now();
        loop {
            let notified = self.answered.notified();
            if let Some(a) = self.last().filter(|a| a.at >= asked) {
                return a.result;
            }
            self.spawn_check();
            if tokio::time::timeout(CHECK_BOUND * 2, notified)
                .await
                .is_err()
            {
                return Err(DriverError::Gateway(
                    "the driver check did not finish".to_owned(),
                ));
            }
        }
    }

    fn spawn_check(self: &Arc<Self>) {
        if self.checking.swap(true, Ordering::SeqCst) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let result = match tokio::time::timeout(CHECK_BOUND, this.gateway.gateway_info()).await
            {
                Ok(Ok(info)) => judge(&info),
                Ok(Err(e)) => Err(classify(e)),
                Err(_) => Err(DriverError::Gateway(format!(
                    "GetGatewayInfo did not answer within {CHECK_BOUND:?}"
                ))),
            };
            if let Err(e) = &result {
                tracing::warn!(error = %e, "openshell driver check failed");
            }
            *this.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Answer {
                at: Instant::now(),
                result,
            });
            this.checking.store(false, Ordering::SeqCst);
            this.answered.notify_waiters();
        });
    }

    /// Records the tier the startup proof proved.
    pub fn set_proven(&self, tier: IsolationTier) {
        let _ = self.proven.set(tier);
    }

    /// Whether the startup proof has passed.
    pub fn proven(&self) -> bool {
        self.proven.get().is_some()
    }

    /// The proven tier while the last answer is good, else `none`.
    pub fn current_tier(&self) -> IsolationTier {
        match (self.proven.get(), self.last()) {
            (Some(tier), Some(Answer { result: Ok(()), .. })) => *tier,
            _ => IsolationTier::None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::proto::v1::{
        ComputeDriverCapabilities, ComputeDriverInfo, CpuResourceCapabilities,
        MemoryResourceCapabilities, ResourceCapabilities,
    };
    use super::*;

    fn driver(name: &str, memory: bool, cpu: bool) -> ComputeDriverInfo {
        ComputeDriverInfo {
            name: name.into(),
            capabilities: Some(ComputeDriverCapabilities {
                driver_name: name.into(),
                driver_version: "27".into(),
                resource_capabilities: Some(ResourceCapabilities {
                    cpu: Some(CpuResourceCapabilities {
                        limit_supported: cpu,
                    }),
                    memory: Some(MemoryResourceCapabilities {
                        limit_supported: memory,
                    }),
                    gpu: None,
                }),
            }),
        }
    }

    fn info(drivers: Vec<ComputeDriverInfo>) -> GetGatewayInfoResponse {
        GetGatewayInfoResponse {
            compute_drivers: drivers,
            ..GetGatewayInfoResponse::default()
        }
    }

    #[test]
    fn only_exactly_one_docker_driver_with_both_limits_passes() {
        judge(&info(vec![driver("docker", true, true)])).unwrap();
        for refused in [
            vec![],
            vec![
                driver("docker", true, true),
                driver("kubernetes", true, true),
            ],
            vec![driver("kubernetes", true, true)],
            vec![driver("docker", false, true)],
            vec![driver("docker", true, false)],
        ] {
            assert!(judge(&info(refused.clone())).is_err(), "{refused:?}");
        }
        let mut renamed = driver("docker", true, true);
        if let Some(c) = renamed.capabilities.as_mut() {
            c.driver_name = "podman".into();
        }
        assert!(judge(&info(vec![renamed])).is_err());
    }
}
