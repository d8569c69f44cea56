//! `/readyz`: the provider's bounded, cached readiness check. The answer's
//! body is fixed; the reason goes only to the log, at most once every 30 s.
//! It never runs the startup proof. A configured grant broker that does not
//! answer makes the daemon not ready too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::grant::Grants;
use crate::provider::Provider;

/// How long one readiness answer is reused.
const CACHE: Duration = Duration::from_secs(1);
/// The longest a readiness check may take before it counts as not ready.
const BOUND: Duration = Duration::from_secs(10);
/// The least time between two logged reasons.
const LOG_EVERY: Duration = Duration::from_secs(30);

struct Cached {
    at: Option<Instant>,
    ready: bool,
    logged: Option<Instant>,
}

/// The readiness probe.
pub struct Probes {
    provider: Arc<dyn Provider>,
    grants: Option<Arc<Grants>>,
    cached: Mutex<Cached>,
}

impl Probes {
    /// A probe over `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> Probes {
        Probes {
            provider,
            grants: None,
            cached: Mutex::new(Cached {
                at: None,
                ready: false,
                logged: None,
            }),
        }
    }

    /// Also not ready while `grants`' broker does not answer.
    pub fn with_grants(mut self, grants: Arc<Grants>) -> Probes {
        self.grants = Some(grants);
        self
    }

    /// Whether the provider is ready, re-checked at most once per second.
    pub async fn ready(&self) -> bool {
        let mut c = self.cached.lock().await;
        if let Some(at) = c.at
            && at.elapsed() < CACHE
        {
            return c.ready;
        }
        let result = match tokio::time::timeout(BOUND, self.provider.ready()).await {
            Ok(r) => r,
            Err(_) => Err(format!("readiness check took longer than {BOUND:?}")),
        }
        .and_then(|()| self.grants.as_ref().map_or(Ok(()), |g| g.ready()));
        c.at = Some(Instant::now());
        c.ready = result.is_ok();
        if let Err(reason) = result
            && c.logged.is_none_or(|l| l.elapsed() >= LOG_EVERY)
        {
            tracing::warn!(reason = %reason, "not ready");
            c.logged = Some(Instant::now());
        }
        c.ready
    }
}
