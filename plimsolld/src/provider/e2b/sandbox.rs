//! One VM per run (grants.md §6.2): the lease tracked before the create is sent, the create
//! stamped with this instance and the lease, ownership proven by a read-back before the id
//! is trusted (even for a kill), both access tokens required, the resources and the network
//! read back against the envelope. A VM is killed in the background once its run ends, and
//! its lease and admission slot are released only when the kill finished.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use super::api::{Api, ApiError, Created, Detail, Network, NewSandbox, valid_id};
use super::config::EnvdRoute;
use super::envd::Envd;
use super::http::HttpError;
use crate::config::env::{ENV_CPUS, ENV_DISK_MB, ENV_MEMORY_MB};
use crate::provider::tracked::Tracked;
use crate::provider::{Hold, Resources};

/// What E2B's own timeout adds to a run's budget: the leak backstop (grants.md §6.2).
const BACKSTOP_SLACK: Duration = Duration::from_secs(10);
/// The metadata stamps.
pub const STAMP_SDK: &str = "sdk";
pub const STAMP_INSTANCE: &str = "instance";
pub const STAMP_LEASE: &str = "lease";
pub const SDK: &str = "plimsoll";

/// Why a VM could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// E2B refused the create (4xx): no VM exists.
    #[error("E2B refused the create: {0}")]
    Refused(ApiError),
    /// The create's fate is unknown (a 5xx, a transport error, no id): the orphan sweep finds
    /// the VM if it exists.
    #[error("the create was lost: {0}")]
    Lost(ApiError),
    /// The answer lacked a token; the VM was killed once proven ours.
    #[error("{0}")]
    Insecure(&'static str),
    /// The read-back did not show this instance's lease: the id is not trusted.
    #[error("sandbox {id} did not read back with this instance's lease")]
    NotOurs { id: String },
    /// The read-back differs from the envelope; the VM was killed.
    #[error("sandbox {id} read back outside the envelope: {mismatch}")]
    Readback { id: String, mismatch: String },
    /// A read-back call failed.
    #[error("reading sandbox {id} back: {source}")]
    Detail { id: String, source: ApiError },
    /// envd's client could not be made.
    #[error(transparent)]
    Envd(#[from] HttpError),
}

/// A granted VM's one way out: `allowOut` of the guard's host, and the rule by which E2B's
/// egress proxy adds the run's guard token (the guest never holds it).
pub struct GuardRule<'a> {
    /// The guard URL's host name.
    pub host: &'a str,
    /// The run's guard token.
    pub token: &'a str,
}

impl GuardRule<'_> {
    /// The VM's network with this rule on.
    pub fn network(&self) -> Network {
        let mut headers = serde_json::Map::new();
        headers.insert("X-Plimsoll-Guard".to_owned(), self.token.into());
        Network {
            allow_out: Some(vec![self.host.to_owned()]),
            rules: Some(serde_json::json!({
                self.host: [{"transform": {"headers": headers}}]
            })),
            ..Network::deny_all()
        }
    }
}

/// How long the daemon waits for its resolver to name the guard's address.
const RESOLVE_BOUND: Duration = Duration::from_secs(5);

/// The address a granted VM's client library connects to for the guard: `configured`
/// (`E2B_GUARD_ADDRESS`), else the first IPv4 address this host's resolver gives `host`.
/// The VM has no nameserver (`dnsServers: []`); E2B's egress firewall matches the guard's
/// name in the connection and dials that name itself, so the address only has to leave the
/// VM. The error says why there is none.
pub async fn guard_address(host: &str, configured: Option<Ipv4Addr>) -> Result<Ipv4Addr, String> {
    if let Some(address) = configured {
        return Ok(address);
    }
    let looked_up = tokio::time::timeout(RESOLVE_BOUND, tokio::net::lookup_host((host, 443))).await;
    let addresses = match looked_up {
        Ok(Ok(addresses)) => addresses,
        Ok(Err(e)) => return Err(format!("the guard host {host} did not resolve here: {e}")),
        Err(_) => {
            return Err(format!(
                "the guard host {host} did not resolve here within {RESOLVE_BOUND:?}"
            ));
        }
    };
    addresses
        .into_iter()
        .find_map(|a| match a.ip() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .ok_or_else(|| format!("the guard host {host} has no IPv4 address here"))
}

/// Everything a VM is made from.
pub struct Fleet {
    pub api: Api,
    pub envd_route: EnvdRoute,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub template: String,
    /// This provider's random instance stamp.
    pub instance: String,
    /// The operator's envelope (0 = unbounded), checked by read-back.
    pub resources: Resources,
    pub leases: Tracked,
}

/// A VM a run holds. Dropping it kills the VM in the background, then releases the lease
/// and the admission slot.
pub struct Vm {
    fleet: Arc<Fleet>,
    id: String,
    lease: String,
    pub envd: Envd,
    hold: Option<Hold>,
}

impl Vm {
    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lease stamp it was made with.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The fleet it belongs to (its control plane and envelope).
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let fleet = self.fleet.clone();
        let (id, lease, hold) = (
            std::mem::take(&mut self.id),
            std::mem::take(&mut self.lease),
            self.hold.take(),
        );
        let kill = async move {
            fleet.kill_and_release(&id, &lease).await;
            drop(hold);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(kill);
            }
            // No runtime (only at process exit): the orphan sweep or E2B's timeout ends it.
            Err(_) => tracing::warn!("a VM was dropped outside the runtime; left to its timeout"),
        }
    }
}

impl Fleet {
    /// Kills `id` and then stops tracking `lease`.
    pub async fn kill_and_release(&self, id: &str, lease: &str) {
        if let Err(e) = self.api.kill(id).await {
            tracing::warn!(sandbox = %id, error = %e, "e2b: a VM could not be killed; the orphan sweep retries");
        }
        self.leases.release(lease);
    }

    fn stamps(&self, lease: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (STAMP_SDK.to_owned(), SDK.to_owned()),
            (STAMP_INSTANCE.to_owned(), self.instance.clone()),
            (STAMP_LEASE.to_owned(), lease.to_owned()),
        ])
    }

    /// Whether `detail` carries this instance's `lease` stamp.
    pub fn ours(&self, detail: &Detail, lease: &str) -> bool {
        detail.metadata.get(STAMP_INSTANCE) == Some(&self.instance)
            && detail.metadata.get(STAMP_LEASE).map(String::as_str) == Some(lease)
    }

    /// Makes a VM for a run of `budget`, holding `hold` until it is killed.
    pub async fn lease(
        self: &Arc<Self>,
        budget: Duration,
        hold: Hold,
        guard: Option<GuardRule<'_>>,
    ) -> Result<Vm, SandboxError> {
        self.lease_stamped(budget, hold, guard, &[]).await
    }

    /// [`Fleet::lease`] with `extra` metadata beside the stamps (a session's `session` and
    /// `expires`); an extra never overwrites a stamp.
    pub async fn lease_stamped(
        self: &Arc<Self>,
        budget: Duration,
        hold: Hold,
        guard: Option<GuardRule<'_>>,
        extra: &[(&str, String)],
    ) -> Result<Vm, SandboxError> {
        let lease = hex::encode(rand::random::<[u8; 16]>());
        // Tracked before the request leaves: the orphan sweep never kills a VM being made.
        self.leases.track(&lease);
        let made = self.create(&lease, budget, guard, extra).await;
        match made {
            Ok((id, envd)) => Ok(Vm {
                fleet: self.clone(),
                id,
                lease,
                envd,
                hold: Some(hold),
            }),
            Err(e) => {
                self.leases.release(&lease);
                Err(e)
            }
        }
    }

    async fn create(
        &self,
        lease: &str,
        budget: Duration,
        guard: Option<GuardRule<'_>>,
        extra: &[(&str, String)],
    ) -> Result<(String, Envd), SandboxError> {
        let network = guard
            .as_ref()
            .map_or_else(Network::deny_all, GuardRule::network);
        let mut metadata = self.stamps(lease);
        for (key, value) in extra {
            metadata
                .entry((*key).to_owned())
                .or_insert_with(|| value.clone());
        }
        let new = NewSandbox {
            template_id: &self.template,
            timeout: budget.as_secs_f64().ceil() as u64 + BACKSTOP_SLACK.as_secs(),
            auto_pause: false,
            metadata: &metadata,
            network,
        };
        let created: Created = match self.api.create(&new).await {
            Ok(Ok(created)) => created,
            Ok(Err(refused)) => return Err(SandboxError::Refused(refused)),
            Err(lost) => return Err(SandboxError::Lost(lost)),
        };
        let Some(id) = created.sandbox_id.filter(|id| valid_id(id)) else {
            // Never used in a path: the sweep finds the VM by its stamps.
            return Err(SandboxError::Lost(ApiError::Answer(
                "a create answer without a usable sandboxID".to_owned(),
            )));
        };
        let detail = match self.api.detail(&id).await {
            Ok(Some(detail)) if self.ours(&detail, lease) => detail,
            Ok(_) => return Err(SandboxError::NotOurs { id }),
            Err(source) => {
                // Unknown: the sweep judges it later by its stamps.
                return Err(SandboxError::Detail { id, source });
            }
        };
        let access = created.envd_access_token.filter(|t| !t.is_empty());
        let traffic = created.traffic_access_token.filter(|t| !t.is_empty());
        let (access, traffic) = match (access, traffic) {
            (Some(access), Some(traffic)) => (access, traffic),
            (access, _) => {
                self.kill_now(&id).await;
                return Err(SandboxError::Insecure(if access.is_none() {
                    "no envd access token in secure-mode response (template's envd too old?)"
                } else {
                    "no traffic access token in the create response (public traffic must be off)"
                }));
            }
        };
        if let Some(mismatch) = self.mismatch(&detail, guard.as_ref().map(|g| g.host)) {
            self.kill_now(&id).await;
            return Err(SandboxError::Readback { id, mismatch });
        }
        let envd = Envd::new(&self.envd_route, self.tls.clone(), &id, &access, &traffic)?;
        Ok((id, envd))
    }

    /// The envd of VM `id` with its access tokens (a resumed VM may answer new ones).
    pub fn envd_for(&self, id: &str, access: &str, traffic: &str) -> Result<Envd, HttpError> {
        Envd::new(&self.envd_route, self.tls.clone(), id, access, traffic)
    }

    async fn kill_now(&self, id: &str) {
        if let Err(e) = self.api.kill(id).await {
            tracing::warn!(sandbox = %id, error = %e, "e2b: a refused VM could not be killed; the orphan sweep retries");
        }
    }

    /// What in a read-back is outside the envelope or not deny-all (but for the guard's host
    /// on a granted VM), if anything. The read-back holds the guard token: never logged.
    pub fn mismatch(&self, detail: &Detail, guard_host: Option<&str>) -> Option<String> {
        let r = self.resources;
        let checks = [
            beyond(
                "memoryMB",
                detail.memory_mb,
                u64::from(r.memory_mb),
                r.memory_mb,
                ENV_MEMORY_MB,
            ),
            beyond(
                "cpuCount",
                detail.cpu_count,
                r.cpus.floor(),
                r.cpus,
                ENV_CPUS,
            ),
            beyond(
                "diskSizeMB",
                detail.disk_size_mb,
                u64::from(r.disk_mb),
                r.disk_mb,
                ENV_DISK_MB,
            ),
        ];
        if let Some(beyond) = checks.into_iter().flatten().next() {
            return Some(beyond);
        }
        let network = detail.network.clone().unwrap_or_default();
        let denies_all = network
            .deny_out
            .as_ref()
            .is_some_and(|d| d.iter().any(|c| c == "0.0.0.0/0"));
        let allowed: &[String] = network.allow_out.as_deref().unwrap_or_default();
        let allows_only_guard = match guard_host {
            None => allowed.is_empty(),
            Some(host) => allowed.len() == 1 && allowed[0] == host,
        };
        if !denies_all || !allows_only_guard || network.allow_public_traffic == Some(true) {
            return Some("the network is not deny-all".to_owned());
        }
        // An allowed domain opens the nameservers beside it: left out, that is 8.8.8.8.
        if guard_host.is_some() && network.dns_servers.as_ref().is_none_or(|d| !d.is_empty()) {
            return Some("the network opens a nameserver (dnsServers is not empty)".to_owned());
        }
        None
    }
}

/// What is wrong with a VM's stated `figure` (`name` in the read-back) against a limit in
/// force (`ceiling`, as `variable` says it: `limit`), if anything. A limit in force needs the
/// VM's own figure: one the read-back does not state (or states as zero) cannot be shown
/// within it. No limit (zero) needs nothing.
fn beyond<T: PartialOrd + Default + std::fmt::Display>(
    name: &str,
    figure: Option<T>,
    ceiling: T,
    limit: impl std::fmt::Display + PartialOrd + Default,
    variable: &str,
) -> Option<String> {
    if limit <= Default::default() {
        return None;
    }
    match figure.filter(|f| *f > T::default()) {
        None => Some(format!("the read-back states no {name}")),
        Some(f) if f > ceiling => Some(format!("{name} {f} above {variable} {limit}")),
        Some(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_network_sent_opens_no_nameserver() {
        let granted = GuardRule {
            host: "guard.example.test",
            token: "t",
        }
        .network();
        let sent = serde_json::to_value(&granted).unwrap();
        assert_eq!(sent["dnsServers"], serde_json::json!([]));
        assert_eq!(sent["allowOut"], serde_json::json!(["guard.example.test"]));
        let denied = serde_json::to_value(Network::deny_all()).unwrap();
        assert_eq!(denied["dnsServers"], serde_json::json!([]));
    }

    #[tokio::test]
    async fn the_guard_address_is_the_configured_one_else_this_hosts_ipv4_answer() {
        let configured = Ipv4Addr::new(203, 0, 113, 9);
        assert_eq!(
            guard_address("guard.invalid", Some(configured)).await,
            Ok(configured)
        );
        assert_eq!(
            guard_address("localhost", None).await,
            Ok(Ipv4Addr::LOCALHOST)
        );
        let unknown = guard_address("guard.invalid", None).await.unwrap_err();
        assert!(unknown.contains("guard.invalid"), "{unknown}");
    }

    #[test]
    fn a_limit_in_force_needs_a_stated_figure_within_it() {
        let memory = |figure| beyond("memoryMB", figure, 512u64, 512u32, "SANDBOX_MEMORY_MB");
        assert_eq!(memory(Some(512)), None);
        assert_eq!(
            memory(Some(1024)).as_deref(),
            Some("memoryMB 1024 above SANDBOX_MEMORY_MB 512")
        );
        assert_eq!(
            memory(None).as_deref(),
            Some("the read-back states no memoryMB")
        );
        assert_eq!(
            memory(Some(0)).as_deref(),
            Some("the read-back states no memoryMB")
        );
        // No limit: nothing is asked of the figure.
        assert_eq!(
            beyond("diskSizeMB", None, 0u64, 0u32, "SANDBOX_DISK_MB"),
            None
        );
        // CPUs: the ceiling is the whole part of the limit, the message names the limit.
        assert_eq!(
            beyond("cpuCount", Some(2.0), 1.5f64.floor(), 1.5, "SANDBOX_CPUS").as_deref(),
            Some("cpuCount 2 above SANDBOX_CPUS 1.5")
        );
        assert_eq!(
            beyond("cpuCount", Some(1.0), 1.5f64.floor(), 1.5, "SANDBOX_CPUS"),
            None
        );
    }
}
