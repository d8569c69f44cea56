//! A sandbox's network configuration, as E2B's API takes and returns it, its validation, and
//! the egress decision the simulator's proxy makes from it.
//!
//! E2B's rule (its egress firewall): an `allowOut` match allows; otherwise a `denyOut` match
//! denies; otherwise the connection is allowed. `allow_internet_access: false` means
//! `denyOut: ["0.0.0.0/0"]`. Domains in `allowOut` need `0.0.0.0/0` in `denyOut`. Rules are
//! per-host header transforms for matching HTTPS (and HTTP) requests; they grant nothing.
//! When `allowOut` holds a domain, the DNS servers in `dnsServers` (E2B's default `8.8.8.8`
//! when the field is left out; `[]` means none) are allowed too, every port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// All IPv4 traffic, E2B's `ALL_TRAFFIC`.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The nameserver E2B allows when `dnsServers` is left out.
pub const DEFAULT_DNS_SERVER: &str = "8.8.8.8";
/// The most `dnsServers` entries E2B takes.
const MAX_DNS_SERVERS: usize = 10;

/// E2B's message when `allowOut` names a domain without `denyOut: ["0.0.0.0/0"]`.
pub const DOMAINS_REQUIRE_BLOCK_ALL: &str = "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";

/// `SandboxNetworkConfig` (create and read-back) and the body of `PUT /sandboxes/{id}/network`
/// (`SandboxNetworkUpdateConfig`, which adds `allow_internet_access`). Fields E2B has that the
/// simulator does not act on (`egressProxy`, `httpsPorts`) are accepted and dropped.
/// `dnsServers` is kept and read back as sent: left out means E2B's default, and an update
/// that leaves it out resets it to that default, as every other field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<BTreeMap<String, Vec<Rule>>>,
    /// Only in update bodies; never returned (the sandbox keeps it beside the config).
    #[serde(
        default,
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
}

/// `SandboxNetworkRule`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
}

/// `SandboxNetworkTransform`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transform {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
}

/// What the proxy does with one connection or request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    Allowed,
    Denied,
}

// === impl NetworkConfig ===

impl NetworkConfig {
    /// Checks the config the way E2B's API does, normalizes rule keys to lower case, and folds
    /// `allow_internet_access: false` into `denyOut`. The error is E2B's 400 message.
    pub fn validated(mut self, allow_internet_access: Option<bool>) -> Result<Self, String> {
        for entry in self.deny_out.iter().flatten() {
            if !is_ip_or_cidr(entry) {
                return Err(format!("invalid denied CIDR {entry}"));
            }
        }
        if allow_internet_access == Some(false) {
            let deny = self.deny_out.get_or_insert_with(Vec::new);
            if !deny.iter().any(|d| d == ALL_TRAFFIC) {
                deny.push(ALL_TRAFFIC.to_owned());
            }
        }
        let mut has_domain = false;
        for entry in self.allow_out.iter().flatten() {
            if is_ip_or_cidr(entry) {
                continue;
            }
            if !is_domain_pattern(entry) {
                return Err(format!("invalid allowed address {entry}"));
            }
            has_domain = true;
        }
        if let Some(servers) = &self.dns_servers {
            if servers.len() > MAX_DNS_SERVERS {
                return Err(format!("at most {MAX_DNS_SERVERS} DNS servers are allowed"));
            }
            if let Some(bad) = servers
                .iter()
                .find(|s| s.parse::<std::net::Ipv4Addr>().is_err())
            {
                return Err(format!("invalid DNS server {bad}: must be an IPv4 address"));
            }
        }
        let blocks_all = self.deny_out.iter().flatten().any(|d| d == ALL_TRAFFIC);
        if has_domain && !blocks_all {
            return Err(DOMAINS_REQUIRE_BLOCK_ALL.to_owned());
        }
        if let Some(rules) = self.rules.take() {
            let mut normalized = BTreeMap::new();
            for (domain, list) in rules {
                if domain.is_empty() {
                    return Err("Rule domain must not be empty.".to_owned());
                }
                let lower = domain.to_ascii_lowercase();
                if lower == "*" || !is_domain_pattern(&lower) {
                    return Err(format!(
                        "Rule domain {domain:?} is not a valid domain name."
                    ));
                }
                normalized.insert(lower, list);
            }
            self.rules = Some(normalized);
        }
        self.allow_internet_access = None;
        Ok(self)
    }

    /// E2B's egress decision for a destination named `host` (a TLS server name, an HTTP Host
    /// or an IP literal). A domain is never matched against `denyOut` CIDRs other than
    /// `0.0.0.0/0`: the simulator does not resolve names (see docs/e2b-simulator.md).
    pub fn egress(&self, host: &str) -> Egress {
        let host = normalize_host(host);
        if self
            .allow_out
            .iter()
            .flatten()
            .any(|entry| matches_entry(entry, &host))
        {
            return Egress::Allowed;
        }
        let ip: Option<IpAddr> = host.parse().ok();
        if let Some(ip) = ip
            && self
                .dns_servers_reachable()
                .iter()
                .any(|s| s.parse() == Ok(ip))
        {
            return Egress::Allowed;
        }
        for entry in self.deny_out.iter().flatten() {
            if entry == ALL_TRAFFIC {
                return Egress::Denied;
            }
            if let Some(ip) = ip
                && cidr_contains(entry, ip)
            {
                return Egress::Denied;
            }
        }
        Egress::Allowed
    }

    /// The DNS servers this config opens: `dnsServers` (or E2B's default) when `allowOut`
    /// holds a domain, none otherwise.
    pub fn dns_servers_reachable(&self) -> Vec<String> {
        let has_domain = self
            .allow_out
            .iter()
            .flatten()
            .any(|entry| !is_ip_or_cidr(entry));
        if !has_domain {
            return Vec::new();
        }
        self.dns_servers
            .clone()
            .unwrap_or_else(|| vec![DEFAULT_DNS_SERVER.to_owned()])
    }

    /// Whether names resolve in a VM with this config: its `/etc/resolv.conf` names E2B's
    /// default nameserver whatever `dnsServers` says, so only when that one is reachable.
    pub fn resolves_names(&self) -> bool {
        self.egress(DEFAULT_DNS_SERVER) == Egress::Allowed
    }

    /// The header transforms for `host`: the exact rule, else the longest matching wildcard.
    pub fn headers_for(&self, host: &str) -> Option<BTreeMap<String, String>> {
        let host = normalize_host(host);
        let rules = self.rules.as_ref()?;
        let chosen = rules.get(&host).or_else(|| {
            rules
                .iter()
                .filter(|(pattern, _)| wildcard_matches(pattern, &host))
                .max_by_key(|(pattern, _)| pattern.len())
                .map(|(_, list)| list)
        })?;
        let mut headers = BTreeMap::new();
        for rule in chosen {
            if let Some(set) = rule.transform.as_ref().and_then(|t| t.headers.as_ref()) {
                headers.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        Some(headers)
    }
}

fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn matches_entry(entry: &str, host: &str) -> bool {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return entry.parse::<IpAddr>().is_ok_and(|e| e == ip) || cidr_contains(entry, ip);
    }
    let entry = normalize_host(entry);
    entry == host || wildcard_matches(&entry, host)
}

/// `*.example.com` matches subdomains at any depth, never `example.com` itself.
fn wildcard_matches(pattern: &str, host: &str) -> bool {
    pattern.strip_prefix("*.").is_some_and(|suffix| {
        host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}"))
    })
}

fn is_domain_pattern(entry: &str) -> bool {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_ip_or_cidr(entry: &str) -> bool {
    parse_cidr(entry).is_some()
}

fn parse_cidr(entry: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match entry.split_once('/') {
        Some((addr, len)) => (addr, Some(len.parse::<u8>().ok()?)),
        None => (entry, None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((ip, len))
}

fn cidr_contains(entry: &str, ip: IpAddr) -> bool {
    let Some((net, len)) = parse_cidr(entry) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(net), IpAddr::V4(ip)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(net) & mask == u32::from(ip) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(ip)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(net) & mask == u128::from(ip) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> NetworkConfig {
        serde_json::from_value::<NetworkConfig>(json)
            .unwrap()
            .validated(None)
            .unwrap()
    }

    #[test]
    fn deny_all_with_one_allowed_domain() {
        let c = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["guard.example.test"]
        }));
        assert_eq!(c.egress("guard.example.test"), Egress::Allowed);
        assert_eq!(c.egress("GUARD.example.test."), Egress::Allowed);
        assert_eq!(c.egress("example.com"), Egress::Denied);
        assert_eq!(c.egress("1.1.1.1"), Egress::Denied);
    }

    #[test]
    fn an_allowed_domain_opens_the_dns_servers_unless_they_are_none() {
        let default = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["guard.example.test"]
        }));
        assert_eq!(default.egress(DEFAULT_DNS_SERVER), Egress::Allowed);
        assert!(default.resolves_names());
        let none = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["guard.example.test"], "dnsServers": []
        }));
        assert_eq!(none.egress(DEFAULT_DNS_SERVER), Egress::Denied);
        assert_eq!(none.egress("guard.example.test"), Egress::Allowed);
        assert!(!none.resolves_names());
        let own = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["a.example"], "dnsServers": ["1.1.1.1"]
        }));
        assert_eq!(own.egress("1.1.1.1"), Egress::Allowed);
        assert_eq!(own.egress(DEFAULT_DNS_SERVER), Egress::Denied);
        // resolv.conf still names 8.8.8.8: another server opens nothing that resolves.
        assert!(!own.resolves_names());
        // Without a domain in allowOut, dnsServers opens nothing.
        let ips_only = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["10.1.2.3"], "dnsServers": ["1.1.1.1"]
        }));
        assert_eq!(ips_only.egress("1.1.1.1"), Egress::Denied);
        assert!(!ips_only.resolves_names());
        assert!(!config(serde_json::json!({"denyOut": ["0.0.0.0/0"]})).resolves_names());
        assert!(NetworkConfig::default().resolves_names());
        let bad: NetworkConfig =
            serde_json::from_value(serde_json::json!({"dnsServers": ["dns.example"]})).unwrap();
        assert!(bad.validated(None).unwrap_err().contains("IPv4"));
    }

    #[test]
    fn no_config_allows_everything_and_allow_internet_false_denies() {
        assert_eq!(
            NetworkConfig::default().egress("example.com"),
            Egress::Allowed
        );
        let c = NetworkConfig::default().validated(Some(false)).unwrap();
        assert_eq!(c.deny_out.as_deref(), Some(&[ALL_TRAFFIC.to_owned()][..]));
        assert_eq!(c.egress("example.com"), Egress::Denied);
    }

    #[test]
    fn domains_need_block_all_and_cidrs_must_parse() {
        let domain_only: NetworkConfig =
            serde_json::from_value(serde_json::json!({"allowOut": ["a.example"]})).unwrap();
        assert_eq!(
            domain_only.validated(None).unwrap_err(),
            DOMAINS_REQUIRE_BLOCK_ALL
        );
        let bad: NetworkConfig =
            serde_json::from_value(serde_json::json!({"denyOut": ["example.com"]})).unwrap();
        assert_eq!(
            bad.validated(None).unwrap_err(),
            "invalid denied CIDR example.com"
        );
        let ips = config(serde_json::json!({"denyOut": ["10.0.0.0/8"], "allowOut": ["10.1.2.3"]}));
        assert_eq!(ips.egress("10.1.2.3"), Egress::Allowed);
        assert_eq!(ips.egress("10.9.9.9"), Egress::Denied);
        assert_eq!(ips.egress("11.0.0.1"), Egress::Allowed);
    }

    #[test]
    fn wildcards_match_subdomains_not_the_apex_and_exact_rules_win() {
        let c = config(serde_json::json!({
            "denyOut": ["0.0.0.0/0"], "allowOut": ["*.example.test"],
            "rules": {
                "*.example.test": [{"transform": {"headers": {"X-A": "wild"}}}],
                "API.example.test": [{"transform": {"headers": {"X-A": "exact"}}}]
            }
        }));
        assert_eq!(c.egress("a.b.example.test"), Egress::Allowed);
        assert_eq!(c.egress("example.test"), Egress::Denied);
        assert_eq!(c.headers_for("api.example.test").unwrap()["X-A"], "exact");
        assert_eq!(c.headers_for("x.example.test").unwrap()["X-A"], "wild");
        assert!(c.headers_for("other.test").is_none());
    }
}
