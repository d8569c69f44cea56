//! The openshell provider's settings (config.md §2.7, grants.md §8.1): the gateway's URL, the
//! mutual-TLS files and the sandbox image, all five required.
//!
//! Everything that needs no outside world is checked here: the URL's shape (`https`, a host
//! and a port, nothing else), that each file is named, the image reference (pinned when
//! pinning is required). The files are read when the provider is built; the gateway is first
//! asked at preflight. Tier `container` at best, so hardened mode always refuses it.

use std::path::PathBuf;
use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::OpenShell;
use crate::config::env::*;
use crate::config::{Config, ConfigProblem, Reader, shown, shown_url};
use crate::provider::config::{ProviderSettings, SharedSettings};
use crate::provider::docker::config::{image_reference_problem, is_pinned};
use crate::provider::{Provider, ProviderError};

/// The gateway's address, from `https://host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayUrl {
    /// The host as written (a name, an IPv4 address or a bracketed IPv6 address).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl GatewayUrl {
    /// Reads `https://host:port` (a trailing `/` allowed); anything else is refused with the
    /// reason.
    pub fn parse(value: &str) -> Result<GatewayUrl, &'static str> {
        let rest = value
            .strip_prefix("https://")
            .ok_or("must start with https:// (the gateway is reached over mutual TLS only)")?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err("must have no path, query or fragment: https://host:port");
        }
        if authority.contains('@') {
            return Err("must carry no user information");
        }
        let (host, port) = authority
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .ok_or("must name a port: https://host:port")?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("must have a port in 1..65535")?;
        let bracketed = host.starts_with('[') && host.ends_with(']');
        let ok = if bracketed {
            host[1..host.len() - 1]
                .parse::<std::net::Ipv6Addr>()
                .is_ok()
        } else {
            host.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        };
        if !ok {
            return Err("must have a host name, an IPv4 address or a bracketed IPv6 address");
        }
        Ok(GatewayUrl {
            host: host.to_owned(),
            port,
        })
    }

    /// The URL tonic dials.
    pub fn uri(&self) -> String {
        format!("https://{}:{}", self.host, self.port)
    }

    /// The name the gateway's certificate must carry (an IP without brackets).
    pub fn server_name(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// The openshell provider's settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenShellConfig {
    /// `SANDBOX_OPENSHELL_GATEWAY_URL`.
    pub gateway: GatewayUrl,
    /// `SANDBOX_OPENSHELL_CA_FILE`.
    pub ca_file: PathBuf,
    /// `SANDBOX_OPENSHELL_CERT_FILE`.
    pub cert_file: PathBuf,
    /// `SANDBOX_OPENSHELL_KEY_FILE`.
    pub key_file: PathBuf,
    /// `SANDBOX_OPENSHELL_IMAGE`, exactly as written.
    pub image: String,
    /// `SANDBOX_REQUIRE_PINNED_IMAGES`.
    pub require_pinned_images: bool,
}

fn required(r: &mut Reader<'_>, var: &'static str) -> Option<String> {
    let value = r.trimmed(var);
    if value.is_empty() {
        r.problems.push(ConfigProblem::ProviderSetting {
            var,
            value: String::new(),
            reason: "is required with SANDBOX_PROVIDER=openshell".into(),
        });
        return None;
    }
    Some(value)
}

// === impl ProviderSettings for OpenShellConfig ===

impl ProviderSettings for OpenShellConfig {
    fn read(r: &mut Reader<'_>, shared: &SharedSettings) -> OpenShellConfig {
        let mut config = OpenShellConfig {
            require_pinned_images: shared.require_pinned_images,
            ..OpenShellConfig::default()
        };
        if let Some(url) = required(r, ENV_OPENSHELL_GATEWAY_URL) {
            match GatewayUrl::parse(&url) {
                Ok(gateway) => config.gateway = gateway,
                Err(reason) => r.problems.push(ConfigProblem::ProviderSetting {
                    var: ENV_OPENSHELL_GATEWAY_URL,
                    value: shown_url(&url),
                    reason: reason.to_owned(),
                }),
            }
        }
        for (var, slot) in [
            (ENV_OPENSHELL_CA_FILE, &mut config.ca_file),
            (ENV_OPENSHELL_CERT_FILE, &mut config.cert_file),
            (ENV_OPENSHELL_KEY_FILE, &mut config.key_file),
        ] {
            if let Some(path) = required(r, var) {
                *slot = PathBuf::from(path);
            }
        }
        // Not trimmed: a reference with stray whitespace is refused, never repaired.
        let image = r.raw(ENV_OPENSHELL_IMAGE);
        if image.is_empty() {
            required(r, ENV_OPENSHELL_IMAGE);
        } else if let Some(reason) = image_reference_problem(&image, config.require_pinned_images) {
            r.problems.push(ConfigProblem::ProviderSetting {
                var: ENV_OPENSHELL_IMAGE,
                value: shown(&image),
                reason: reason.to_owned(),
            });
        }
        config.image = image;
        config
    }

    fn highest_tier(&self) -> IsolationTier {
        // A container on the gateway's docker driver; nothing here can prove more.
        IsolationTier::Container
    }

    fn enforces_pids(&self) -> bool {
        // The gateway has no process limit to ask for.
        false
    }

    fn enforces_disk(&self) -> bool {
        // A tmpfs of that size on /tmp, through the docker driver's config.
        true
    }

    fn keeps_sessions(&self) -> bool {
        // One gateway sandbox per session, stopped while idle.
        true
    }

    /// The image pinned by digest.
    fn surface_violations(&self) -> Vec<String> {
        if self.require_pinned_images && is_pinned(&self.image) {
            return Vec::new();
        }
        vec![format!(
            "immutable surface: {ENV_REQUIRE_PINNED_IMAGES}=1 and a pinned {ENV_OPENSHELL_IMAGE} are required with the openshell provider"
        )]
    }

    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(OpenShell::new(self, config)?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(pairs: &[(&str, &str)]) -> (OpenShellConfig, Vec<String>) {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut r = Reader::new(&env);
        let config = OpenShellConfig::read(&mut r, &SharedSettings::default());
        let problems = r.problems.iter().map(ToString::to_string).collect();
        (config, problems)
    }

    #[test]
    fn all_five_settings_are_required_and_each_missing_one_is_named() {
        let (_, problems) = read(&[]);
        assert_eq!(problems.len(), 5, "{problems:?}");
        for var in [
            ENV_OPENSHELL_GATEWAY_URL,
            ENV_OPENSHELL_CA_FILE,
            ENV_OPENSHELL_CERT_FILE,
            ENV_OPENSHELL_KEY_FILE,
            ENV_OPENSHELL_IMAGE,
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(var)),
                "{var}: {problems:?}"
            );
        }
        let (config, problems) = read(&[
            (ENV_OPENSHELL_GATEWAY_URL, "https://127.0.0.1:8443"),
            (ENV_OPENSHELL_CA_FILE, "/c/ca.crt"),
            (ENV_OPENSHELL_CERT_FILE, "/c/tls.crt"),
            (ENV_OPENSHELL_KEY_FILE, "/c/tls.key"),
            (ENV_OPENSHELL_IMAGE, "plimsoll/sandbox:latest"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.gateway.uri(), "https://127.0.0.1:8443");
        assert_eq!(config.key_file, PathBuf::from("/c/tls.key"));
    }

    #[test]
    fn the_gateway_url_is_https_host_and_port_and_nothing_else() {
        let ok = GatewayUrl::parse("https://gw.example:443/").unwrap();
        assert_eq!((ok.host.as_str(), ok.port), ("gw.example", 443));
        let v6 = GatewayUrl::parse("https://[::1]:9000").unwrap();
        assert_eq!(v6.server_name(), "::1");
        for bad in [
            "http://gw:443",
            "gw:443",
            "https://gw",
            "https://gw:0",
            "https://gw:99999",
            "https://gw:443/v1",
            "https://gw:443?x=1",
            "https://user@gw:443",
            "https://:443",
            "https://g w:443",
            "https://[zz]:443",
        ] {
            assert!(GatewayUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hardened_mode_needs_a_pinned_image() {
        let pinned = OpenShellConfig {
            image: format!("plimsoll/sandbox@sha256:{}", "a".repeat(64)),
            require_pinned_images: true,
            ..OpenShellConfig::default()
        };
        assert!(pinned.surface_violations().is_empty());
        let tag = OpenShellConfig {
            image: "plimsoll/sandbox:latest".into(),
            ..pinned.clone()
        };
        assert_eq!(tag.surface_violations().len(), 1);
        assert_eq!(pinned.highest_tier(), IsolationTier::Container);
    }
}
