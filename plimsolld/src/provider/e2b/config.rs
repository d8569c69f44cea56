//! The e2b provider's settings (grants.md §6.1, config.md): the API key, the template, the
//! guard, and where E2B is — `E2B_API_URL`, `E2B_DOMAIN` and `E2B_SANDBOX_URL`, read as E2B's
//! own SDK reads them so a test can point the provider at a simulator.
//!
//! Plain `http://` is accepted only for a loopback host (a simulator on this machine); E2B
//! itself is reached over `https://` only. Tier `vm`: each run is its own E2B microVM.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::E2b;
use crate::config::env::*;
use crate::config::{Config, ConfigProblem, Reader, shown, shown_url};
use crate::provider::config::{ProviderSettings, SharedSettings};
use crate::provider::{Provider, ProviderError};

/// The template when `E2B_TEMPLATE` is unset.
pub const DEFAULT_TEMPLATE: &str = "base";
/// The domain when `E2B_DOMAIN` is unset.
pub const DEFAULT_DOMAIN: &str = "e2b.app";

/// An `http(s)://host[:port]` base URL with no path, query or user information.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BaseUrl {
    /// `true` for `https`.
    pub tls: bool,
    /// The host as written (a name, an IPv4 address or a bracketed IPv6 address).
    pub host: String,
    /// The port (the scheme's default when the URL names none).
    pub port: u16,
}

impl BaseUrl {
    /// Reads `value`; plain `http` only when the host is loopback.
    pub fn parse(value: &str) -> Result<BaseUrl, &'static str> {
        let (tls, rest) = if let Some(rest) = value.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = value.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("must start with https:// (or http:// to a loopback host)");
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err("must have no path, query or fragment");
        }
        if authority.contains('@') {
            return Err("must carry no user information");
        }
        let default_port = if tls { 443 } else { 80 };
        // A bracketed IPv6 host ends at its `]`; otherwise the last `:` starts the port.
        let split = match authority.find(']') {
            Some(end) => (&authority[..=end], &authority[end + 1..]),
            None => match authority.rsplit_once(':') {
                Some((h, _)) => (h, &authority[h.len()..]),
                None => (authority, ""),
            },
        };
        let (host, port_text) = (split.0, split.1.strip_prefix(':').unwrap_or(split.1));
        if !split.1.is_empty() && !split.1.starts_with(':') {
            return Err("must be scheme://host[:port]");
        }
        let port = if port_text.is_empty() && split.1.is_empty() {
            default_port
        } else {
            port_text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or("must have a port in 1..65535")?
        };
        if !valid_host(host) {
            return Err("must have a host name, an IPv4 address or a bracketed IPv6 address");
        }
        let url = BaseUrl {
            tls,
            host: host.to_owned(),
            port,
        };
        if !tls && !url.is_loopback() {
            return Err("plain http:// is allowed only to a loopback host; E2B needs https://");
        }
        Ok(url)
    }

    /// Whether the host is `localhost` or a loopback address.
    pub fn is_loopback(&self) -> bool {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        bare.eq_ignore_ascii_case("localhost")
            || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// The name a server certificate must carry (an IP without brackets).
    pub fn server_name(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    /// `scheme://host:port`.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }
}

fn valid_host(host: &str) -> bool {
    if host.is_empty() {
        return false;
    }
    if host.starts_with('[') && host.ends_with(']') {
        return host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .is_ok();
    }
    host.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
}

/// Where a sandbox's envd is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvdRoute {
    /// `https://49983-<id>.<domain>` (E2B's proxy routes by host).
    Domain(String),
    /// One base for every sandbox, routed by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers.
    Base(BaseUrl),
}

impl Default for EnvdRoute {
    fn default() -> EnvdRoute {
        EnvdRoute::Domain(DEFAULT_DOMAIN.to_owned())
    }
}

/// How a session's granted calls get the guard (grants.md §6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionGrants {
    /// Unset: a granted session call is refused.
    #[default]
    Off,
    /// One session-long token.
    Session,
    /// A fresh token and network update per granted call.
    Call,
}

/// The e2b provider's settings.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct E2bConfig {
    /// `E2B_API_KEY` (never printed: see the `Debug` impl).
    pub api_key: String,
    /// `E2B_TEMPLATE`, or [`DEFAULT_TEMPLATE`].
    pub template: String,
    /// Whether `E2B_TEMPLATE` was set (hardened mode requires it).
    pub template_set: bool,
    /// `E2B_GUARD_URL`.
    pub guard_url: Option<BaseUrl>,
    /// `E2B_GUARD_ADDRESS`; `None`: resolved for each granted VM.
    pub guard_address: Option<Ipv4Addr>,
    /// `E2B_SESSION_GRANTS`.
    pub session_grants: SessionGrants,
    /// The control plane.
    pub api: BaseUrl,
    /// Where envd is.
    pub envd: EnvdRoute,
}

impl std::fmt::Debug for E2bConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bConfig")
            .field("api_key", &"<redacted>")
            .field("template", &self.template)
            .field("guard_url", &self.guard_url)
            .field("guard_address", &self.guard_address)
            .field("session_grants", &self.session_grants)
            .field("api", &self.api)
            .field("envd", &self.envd)
            .finish()
    }
}

fn problem(r: &mut Reader<'_>, var: &'static str, value: &str, reason: &str) {
    r.problems.push(ConfigProblem::ProviderSetting {
        var,
        value: shown(value),
        reason: reason.to_owned(),
    });
}

fn url(r: &mut Reader<'_>, var: &'static str) -> Option<BaseUrl> {
    let value = r.trimmed(var);
    if value.is_empty() {
        return None;
    }
    match BaseUrl::parse(&value) {
        Ok(url) => Some(url),
        Err(reason) => {
            problem(r, var, &shown_url(&value), reason);
            None
        }
    }
}

// === impl ProviderSettings for E2bConfig ===

impl ProviderSettings for E2bConfig {
    /// One VM per session, paused while idle (grants.md §6.7).
    fn keeps_sessions(&self) -> bool {
        true
    }

    fn read(r: &mut Reader<'_>, _shared: &SharedSettings) -> E2bConfig {
        let mut config = E2bConfig::default();
        let key = r.trimmed(ENV_E2B_API_KEY);
        if key.is_empty() {
            problem(
                r,
                ENV_E2B_API_KEY,
                "",
                "is required with SANDBOX_PROVIDER=e2b",
            );
        } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
            // The key goes into a header: refuse what cannot, and never echo it.
            problem(r, ENV_E2B_API_KEY, "<redacted>", "must be printable ASCII");
        } else {
            config.api_key = key;
        }
        let template = r.trimmed(ENV_E2B_TEMPLATE);
        config.template_set = !template.is_empty();
        config.template = if template.is_empty() {
            DEFAULT_TEMPLATE.to_owned()
        } else if template
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':'))
        {
            template
        } else {
            problem(
                r,
                ENV_E2B_TEMPLATE,
                &template,
                "must be a template id or alias ([A-Za-z0-9._:/-])",
            );
            DEFAULT_TEMPLATE.to_owned()
        };
        let domain = r.trimmed(ENV_E2B_DOMAIN);
        let domain = if domain.is_empty() {
            DEFAULT_DOMAIN.to_owned()
        } else if valid_host(&domain) && !domain.starts_with('[') && domain.contains('.') {
            domain
        } else {
            problem(r, ENV_E2B_DOMAIN, &domain, "must be a DNS domain");
            DEFAULT_DOMAIN.to_owned()
        };
        config.api = url(r, ENV_E2B_API_URL).unwrap_or_else(|| BaseUrl {
            tls: true,
            host: format!("api.{domain}"),
            port: 443,
        });
        config.envd = match url(r, ENV_E2B_SANDBOX_URL) {
            Some(base) => EnvdRoute::Base(base),
            None => EnvdRoute::Domain(domain),
        };
        config.guard_url = url(r, ENV_E2B_GUARD_URL);
        // config.md: https on 443 and a host name (E2B's egress rules match names).
        let bad_guard = config
            .guard_url
            .as_ref()
            .filter(|g| !g.tls || g.port != 443 || g.server_name().parse::<IpAddr>().is_ok())
            .map(BaseUrl::origin);
        if let Some(origin) = bad_guard {
            problem(
                r,
                ENV_E2B_GUARD_URL,
                &origin,
                "must be https://<host name> on port 443 (VMs reach the guard by name over the internet)",
            );
            config.guard_url = None;
        }
        let address = r.trimmed(ENV_E2B_GUARD_ADDRESS);
        if !address.is_empty() {
            match address.parse::<Ipv4Addr>() {
                _ if r.trimmed(ENV_E2B_GUARD_URL).is_empty() => {
                    problem(
                        r,
                        ENV_E2B_GUARD_ADDRESS,
                        &address,
                        "is set but E2B_GUARD_URL is not",
                    );
                }
                Ok(ip) if !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast()) => {
                    config.guard_address = Some(ip);
                }
                _ => problem(
                    r,
                    ENV_E2B_GUARD_ADDRESS,
                    &address,
                    "must be an IPv4 unicast address",
                ),
            }
        }
        let grants = r.trimmed(ENV_E2B_SESSION_GRANTS);
        config.session_grants = match grants.as_str() {
            "" => SessionGrants::Off,
            "session" => SessionGrants::Session,
            "call" => SessionGrants::Call,
            other => {
                problem(
                    r,
                    ENV_E2B_SESSION_GRANTS,
                    other,
                    "must be session, call or unset",
                );
                SessionGrants::Off
            }
        };
        if config.session_grants != SessionGrants::Off && r.trimmed(ENV_E2B_GUARD_URL).is_empty() {
            problem(
                r,
                ENV_E2B_SESSION_GRANTS,
                &grants,
                "needs E2B_GUARD_URL (granted calls reach the broker through the guard)",
            );
        }
        config
    }

    fn highest_tier(&self) -> IsolationTier {
        // Each run is its own E2B microVM.
        IsolationTier::Vm
    }

    fn enforces_pids(&self) -> bool {
        // E2B has no process limit to ask for.
        false
    }

    fn metered(&self) -> bool {
        // E2B bills every second a VM lives.
        true
    }

    fn enforces_disk(&self) -> bool {
        // Checked by the read-back of every VM, never requested (E2B sizes per template).
        true
    }

    fn guard_url(&self) -> Option<String> {
        self.guard_url.as_ref().map(BaseUrl::origin)
    }

    /// `E2B_TEMPLATE` set explicitly.
    fn surface_violations(&self) -> Vec<String> {
        if self.template_set {
            return Vec::new();
        }
        vec![format!(
            "immutable surface: {ENV_E2B_TEMPLATE} must be set explicitly with the e2b provider"
        )]
    }

    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(
            E2b::new(self, config).map_err(ProviderError::from)?,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(pairs: &[(&str, &str)]) -> (E2bConfig, Vec<String>) {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut r = Reader::new(&env);
        let config = E2bConfig::read(&mut r, &SharedSettings::default());
        let problems = r.problems.iter().map(ToString::to_string).collect();
        (config, problems)
    }

    #[test]
    fn the_key_is_required_and_never_echoed() {
        let (_, problems) = read(&[]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with(ENV_E2B_API_KEY));
        let (_, problems) = read(&[(ENV_E2B_API_KEY, "e2b_secret\u{7}")]);
        assert!(!problems[0].contains("e2b_secret"), "{problems:?}");
        let (config, problems) = read(&[(ENV_E2B_API_KEY, "e2b_secret")]);
        assert!(problems.is_empty());
        assert!(!format!("{config:?}").contains("e2b_secret"));
        assert_eq!(config.api.origin(), "https://api.e2b.app:443");
        assert_eq!(config.envd, EnvdRoute::Domain("e2b.app".into()));
        assert_eq!(config.template, "base");
        assert_eq!(config.surface_violations().len(), 1);
    }

    #[test]
    fn plain_http_only_reaches_loopback() {
        for ok in [
            "http://127.0.0.1:3000",
            "http://localhost:9",
            "http://[::1]:8/",
        ] {
            let u = BaseUrl::parse(ok).unwrap();
            assert!(!u.tls && u.is_loopback(), "{ok}");
        }
        let u = BaseUrl::parse("https://api.example.com").unwrap();
        assert_eq!((u.port, u.tls), (443, true));
        for bad in [
            "http://api.e2b.app",
            "http://10.0.0.1:80",
            "ftp://x",
            "https://a/b",
            "https://u@a",
            "https://a:0",
            "https://a b",
        ] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
        let (config, problems) = read(&[
            (ENV_E2B_API_KEY, "k"),
            (ENV_E2B_API_URL, "http://127.0.0.1:4000"),
            (ENV_E2B_SANDBOX_URL, "http://127.0.0.1:4001"),
            (ENV_E2B_TEMPLATE, "base"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.api.origin(), "http://127.0.0.1:4000");
        assert!(matches!(config.envd, EnvdRoute::Base(_)));
        assert!(config.surface_violations().is_empty());
    }

    #[test]
    fn session_grants_need_the_guard_and_the_guard_needs_https() {
        let (_, problems) = read(&[(ENV_E2B_API_KEY, "k"), (ENV_E2B_SESSION_GRANTS, "call")]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (_, problems) = read(&[(ENV_E2B_API_KEY, "k"), (ENV_E2B_SESSION_GRANTS, "always")]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        for bad in [
            "http://127.0.0.1:1",
            "https://127.0.0.1",
            "https://guard.example.com:8443",
        ] {
            let (_, problems) = read(&[(ENV_E2B_API_KEY, "k"), (ENV_E2B_GUARD_URL, bad)]);
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        }
        let (config, problems) = read(&[
            (ENV_E2B_API_KEY, "k"),
            (ENV_E2B_GUARD_URL, "https://guard.example.com"),
            (ENV_E2B_SESSION_GRANTS, "session"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.session_grants, SessionGrants::Session);
        assert_eq!(config.guard_address, None);
    }

    #[test]
    fn the_guard_address_is_an_ipv4_unicast_address_beside_a_guard_url() {
        let guard = (ENV_E2B_GUARD_URL, "https://guard.example.com");
        let (config, problems) = read(&[
            (ENV_E2B_API_KEY, "k"),
            guard,
            (ENV_E2B_GUARD_ADDRESS, "203.0.113.9"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.guard_address, Some(Ipv4Addr::new(203, 0, 113, 9)));
        for bad in [
            "guard.example.com",
            "::1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
        ] {
            let (config, problems) =
                read(&[(ENV_E2B_API_KEY, "k"), guard, (ENV_E2B_GUARD_ADDRESS, bad)]);
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
            assert!(
                problems[0].starts_with(ENV_E2B_GUARD_ADDRESS),
                "{problems:?}"
            );
            assert_eq!(config.guard_address, None);
        }
        let (_, problems) = read(&[
            (ENV_E2B_API_KEY, "k"),
            (ENV_E2B_GUARD_ADDRESS, "203.0.113.9"),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
