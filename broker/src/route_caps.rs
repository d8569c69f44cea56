//! Route caps (`spec/grants.md` §2.2 step 5): how many calls of a run may reach each capped
//! route of its profile.
//!
//! A run counts in counts of its own ([`RouteCaps::own`]). A run lent to a session counts in
//! the session's [`SessionCounts`] instead ([`RouteCaps::shared`]), kept for the session's
//! whole life and keyed by canonical origin, method and lower-cased path ([`cap_key`]), so
//! two profiles capping the same route of the same API share one count. Either way a call is
//! charged against every cap it matches, all or nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::grants::{Origin, Profile, Route, Target};

/// One run's route-cap counter.
#[derive(Debug)]
pub enum RouteCaps {
    /// The run's own counts, one per entry of its profile's `route_caps`.
    Own(Mutex<Vec<u32>>),
    /// A session's counts, shared by every run lent to it.
    Shared {
        /// The session's counts.
        counts: Arc<SessionCounts>,
        /// The key of each entry of the profile's `route_caps`.
        keys: Vec<String>,
    },
}

// === impl RouteCaps ===

impl RouteCaps {
    /// Fresh counts of the run's own, for `profile`'s caps.
    pub fn own(profile: &Profile) -> Self {
        Self::Own(Mutex::new(vec![0; profile.route_caps.len()]))
    }

    /// Counts in a session's `counts`, for `profile`'s caps.
    pub fn shared(profile: &Profile, counts: Arc<SessionCounts>) -> Self {
        let keys = profile
            .route_caps
            .iter()
            .map(|(index, _)| cap_key(&profile.origin, &profile.allow[*index]))
            .collect();
        Self::Shared { counts, keys }
    }

    /// Charges one call of `method` to `target` against every cap of `profile` it matches
    /// (case folded, as caps are): `false`, and nothing charged, when any of them is full.
    pub fn charge(&self, profile: &Profile, method: &str, target: &Target<'_>) -> bool {
        let hits: Vec<usize> = profile
            .route_caps
            .iter()
            .enumerate()
            .filter(|(_, (index, _))| profile.allow[*index].matches(method, target, true))
            .map(|(i, _)| i)
            .collect();
        match self {
            Self::Shared { counts, keys } => counts.charge(
                hits.iter()
                    .map(|&i| (keys[i].as_str(), profile.route_caps[i].1)),
            ),
            Self::Own(own) => {
                // Every update is one increment: a poisoned lock still holds honest counts.
                let mut own = own.lock().unwrap_or_else(PoisonError::into_inner);
                let full = hits.iter().any(|&i| own[i] >= profile.route_caps[i].1);
                if !full {
                    for &i in &hits {
                        own[i] += 1;
                    }
                }
                !full
            }
        }
    }
}

/// Route-cap counts shared by every run lent to one session.
#[derive(Debug, Default)]
pub struct SessionCounts {
    counts: Mutex<HashMap<String, u32>>,
}

// === impl SessionCounts ===

impl SessionCounts {
    /// Charges one call against every `(key, cap)` it matched, all or nothing: refused (and
    /// nothing charged) when any key is already at its cap. A key listed twice (two entries
    /// of one profile differing only in case) is charged once and checked against both caps.
    pub fn charge<'a>(&self, hits: impl IntoIterator<Item = (&'a str, u32)>) -> bool {
        let hits: Vec<(&str, u32)> = hits.into_iter().collect();
        // One increment per entry: the lock is never held across a panic that matters.
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if hits
            .iter()
            .any(|(key, cap)| counts.get(*key).copied().unwrap_or(0) >= *cap)
        {
            return false;
        }
        let mut charged: Vec<&str> = Vec::with_capacity(hits.len());
        for (key, _) in hits {
            if !charged.contains(&key) {
                charged.push(key);
                *counts.entry(key.to_owned()).or_default() += 1;
            }
        }
        true
    }
}

/// A capped route's key in [`SessionCounts`]: canonical origin (scheme and host lower-cased,
/// trailing dot dropped, IPs canonical, default port dropped), method and lower-cased path.
pub fn cap_key(origin: &Origin, route: &Route) -> String {
    let scheme = origin.scheme.to_ascii_lowercase();
    let lowered = origin.host.to_ascii_lowercase();
    let host = lowered.strip_suffix('.').unwrap_or(&lowered);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{ip}]"),
        },
        Ok(IpAddr::V4(ip)) => ip.to_string(),
        Err(_) => host.to_owned(),
    };
    let default = match scheme.as_str() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    let port = if default == Some(origin.port) {
        String::new()
    } else {
        format!(":{}", origin.port)
    };
    format!(
        "{scheme}://{host}{port} {} {}",
        route.method().to_ascii_uppercase(),
        route.path().to_ascii_lowercase()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn origin(scheme: &str, host: &str, port: u16) -> Origin {
        Origin {
            scheme: scheme.into(),
            host: host.into(),
            port,
        }
    }

    fn route(entry: &str) -> Route {
        Route::parse(entry).unwrap()
    }

    #[test]
    fn cap_keys_are_canonical() {
        let key = cap_key(
            &origin("https", "API.Example.COM.", 443),
            &route("get /Items/*"),
        );
        assert_eq!(key, "https://api.example.com GET /items/*");
        assert_eq!(
            cap_key(
                &origin("https", "api.example.com", 443),
                &route("GET /items/*")
            ),
            key
        );
        assert_eq!(
            cap_key(
                &origin("https", "api.example.com", 8443),
                &route("GET /items/*")
            ),
            "https://api.example.com:8443 GET /items/*"
        );
        assert_eq!(
            cap_key(&origin("http", "[0:0:0:0:0:0:0:1]", 80), &route("POST /a")),
            "http://[::1] POST /a"
        );
        assert_eq!(
            cap_key(&origin("http", "127.0.0.1", 8080), &route("POST /a")),
            "http://127.0.0.1:8080 POST /a"
        );
        assert_ne!(
            cap_key(
                &origin("https", "api.example.com", 443),
                &route("POST /items/*")
            ),
            key
        );
    }

    #[test]
    fn charges_are_all_or_nothing_and_shared() {
        let counts = SessionCounts::default();
        assert!(counts.charge([("a", 2), ("b", 1)]));
        // `b` is full: `a` is not charged either.
        assert!(!counts.charge([("a", 2), ("b", 1)]));
        assert!(counts.charge([("a", 2)]));
        assert!(!counts.charge([("a", 5), ("a", 2)]));
        // A key named twice is charged once.
        assert!(counts.charge([("c", 5), ("c", 5)]));
        assert!(counts.charge([("c", 2)]));
        assert!(!counts.charge([("c", 2)]));
    }
}
