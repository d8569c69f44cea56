//! The state every listener shares: settings, docker, the sandboxes, the faults, the egress
//! host map and the CA.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard};

use crate::config::{Config, Upstream};
use crate::egress::ca::Ca;
use crate::faults::Faults;
use crate::sandbox::Registry;
use crate::served::Ledger;
use crate::vm::Vms;

pub struct App {
    pub config: Config,
    pub vms: Vms,
    pub sandboxes: Registry,
    pub ca: Ca,
    /// Sockets, hosts files and the CA bundle live here.
    pub state_dir: PathBuf,
    /// This simulator's id, in container names and labels.
    pub instance: String,
    faults: Mutex<Faults>,
    hosts: Mutex<BTreeMap<String, Upstream>>,
    /// `Idempotency-Key` of a create → the sandbox it made.
    pub idempotency: Mutex<HashMap<String, String>>,
    /// Creates in flight, counted against `max_sandboxes` with the registry.
    pub creating: AtomicUsize,
    /// How long each sandbox's calls took to serve (benchmarks read it).
    pub served: Ledger,
    /// Creates in flight; at shutdown no VM is made after them.
    pub makers: sim_support::closing::Makers,
}

/// A lock whose holder panicked still guards plain data (each update is one insert or field
/// write): keep serving it.
pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl App {
    pub fn new(config: Config, vms: Vms, ca: Ca, state_dir: PathBuf, instance: String) -> App {
        let hosts = config
            .hosts
            .iter()
            .map(|(name, upstream)| (name.to_ascii_lowercase(), upstream.clone()))
            .collect();
        App {
            faults: Mutex::new(config.faults.clone()),
            hosts: Mutex::new(hosts),
            config,
            vms,
            sandboxes: Registry::default(),
            ca,
            state_dir,
            instance,
            idempotency: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            makers: Default::default(),
            served: Ledger::default(),
        }
    }

    /// The faults now.
    pub fn faults(&self) -> Faults {
        locked(&self.faults).clone()
    }

    pub fn set_faults(&self, faults: Faults) {
        *locked(&self.faults) = faults;
    }

    /// Takes one of the pending delete errors, if any.
    pub fn take_delete_error(&self) -> bool {
        let mut faults = locked(&self.faults);
        if faults.delete_errors > 0 {
            faults.delete_errors -= 1;
            true
        } else {
            false
        }
    }

    pub fn hosts(&self) -> BTreeMap<String, Upstream> {
        locked(&self.hosts).clone()
    }

    pub fn upstream(&self, host: &str) -> Option<Upstream> {
        locked(&self.hosts).get(host).cloned()
    }

    pub fn set_host(&self, name: &str, upstream: Option<Upstream>) {
        let name = name.to_ascii_lowercase();
        let mut hosts = locked(&self.hosts);
        match upstream {
            Some(upstream) => hosts.insert(name, upstream),
            None => hosts.remove(&name),
        };
    }

    pub fn idempotent(&self) -> MutexGuard<'_, HashMap<String, String>> {
        locked(&self.idempotency)
    }
}
