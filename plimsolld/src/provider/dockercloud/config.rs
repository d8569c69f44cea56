//! The dockercloud provider's settings (grants.md §7.1, config.md §2.6): the account's
//! credentials, the transport (`connect` or `rest`, never switched at run time), where the
//! token exchange, the API and the policy API are, the image, and the guard.
//!
//! Every URL is `https://`; plain `http://` only to a loopback host (a simulator on this
//! machine). Tier `vm`: each run is its own Docker Cloud microVM.

use std::sync::Arc;

use plimsoll::tier::IsolationTier;

use super::DockerCloud;
use crate::config::env::*;
use crate::config::{Config, ConfigProblem, Reader, shown, shown_url};
use crate::provider::config::{ProviderSettings, SharedSettings};
use crate::provider::e2b::config::BaseUrl;
use crate::provider::{Provider, ProviderError};

/// The token exchange when `SANDBOX_DOCKERCLOUD_AUTH_URL` is unset.
pub const DEFAULT_AUTH_URL: &str = "https://hub.docker.com/v2/auth/token";
/// The REST API when `SANDBOX_DOCKERCLOUD_API_URL` is unset (rest only).
pub const DEFAULT_REST_URL: &str = "https://connect.docker.com/sandboxes";
/// The network-policy API when `SANDBOX_DOCKERCLOUD_POLICY_URL` is unset.
pub const DEFAULT_POLICY_URL: &str = "https://api.sandboxes-cloud.docker.com/v1";

/// An `http(s)://host[:port][/path]` URL: an origin and a path prefix (no trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Url {
    pub base: BaseUrl,
    pub path: String,
}

impl Url {
    /// Reads `value`; plain `http` only to a loopback host; no query, fragment or userinfo.
    pub fn parse(value: &str) -> Result<Url, &'static str> {
        let rest = value
            .strip_prefix("https://")
            .or_else(|| value.strip_prefix("http://"))
            .ok_or("must start with https:// (or http:// to a loopback host)")?;
        if value.contains(['?', '#', '%', '\\']) {
            return Err("must have no query, fragment, escapes or backslashes");
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if path.split('/').any(|s| s == "." || s == "..") {
            return Err("must have a clean path");
        }
        let origin = &value[..value.len() - rest.len() + authority.len()];
        let base = BaseUrl::parse(origin).map_err(|e| {
            if e.starts_with("plain http") {
                "plain http:// is allowed only to a loopback host; Docker's service needs https://"
            } else {
                e
            }
        })?;
        Ok(Url {
            base,
            path: path.to_owned(),
        })
    }

    /// The URL as an operator wrote it (without a trailing slash).
    pub fn shown(&self) -> String {
        format!("{}{}", self.base.origin(), self.path)
    }
}

/// Which of Docker's APIs the provider speaks (grants.md §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Connect JSON (`docker.sbx.v1`): grants, booted-digest evidence, hardened mode.
    #[default]
    Connect,
    /// The REST API: no grants, runs capped at 270 s.
    Rest,
}

/// The dockercloud provider's settings.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DockerCloudConfig {
    /// `DOCKER_SBX_USERNAME`.
    pub username: String,
    /// `DOCKER_SBX_TOKEN` (never printed: see the `Debug` impl).
    pub token: String,
    pub auth_url: Url,
    pub transport: Transport,
    /// Whether `SANDBOX_DOCKERCLOUD_API` was spelled out as `connect` (hardened mode).
    pub connect_spelled: bool,
    pub api_url: Url,
    /// `SANDBOX_DOCKERCLOUD_IMAGE`, or "".
    pub image: String,
    /// `SANDBOX_DOCKERCLOUD_STORE_IMAGE`, or "".
    pub store_image: String,
    pub guard_url: Option<BaseUrl>,
    pub policy_url: Url,
    /// Whole CPUs a sandbox asks for (0 = the "Micro" size's 1).
    pub cpus: u32,
}

impl std::fmt::Debug for DockerCloudConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerCloudConfig")
            .field("username", &self.username)
            .field("token", &"<redacted>")
            .field("auth_url", &self.auth_url)
            .field("transport", &self.transport)
            .field("api_url", &self.api_url)
            .field("image", &self.image)
            .field("store_image", &self.store_image)
            .field("guard_url", &self.guard_url)
            .field("policy_url", &self.policy_url)
            .finish()
    }
}

impl DockerCloudConfig {
    /// The configured linux/amd64 manifest digest (`sha256:…`) of a pinned image, if any.
    pub fn pinned_digest(&self) -> Option<String> {
        pinned(&self.image).map(str::to_owned)
    }
}

/// The `sha256:<64 hex>` an image reference is pinned to.
fn pinned(image: &str) -> Option<&str> {
    let (_, digest) = image.rsplit_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
}

fn problem(r: &mut Reader<'_>, var: &'static str, value: &str, reason: &str) {
    r.problems.push(ConfigProblem::ProviderSetting {
        var,
        value: shown(value),
        reason: reason.to_owned(),
    });
}

fn url(r: &mut Reader<'_>, var: &'static str, default: Option<&str>) -> Url {
    let value = r.trimmed(var);
    let (value, default_used) = match (value.is_empty(), default) {
        (true, Some(d)) => (d.to_owned(), true),
        _ => (value, false),
    };
    if value.is_empty() {
        return Url::default();
    }
    match Url::parse(&value) {
        Ok(url) => url,
        Err(reason) if !default_used => {
            problem(r, var, &shown_url(&value), reason);
            Url::default()
        }
        Err(_) => Url::default(),
    }
}

fn image_chars(image: &str) -> bool {
    !image.is_empty()
        && image.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b'@')
        })
}

// === impl ProviderSettings for DockerCloudConfig ===

impl ProviderSettings for DockerCloudConfig {
    fn read(r: &mut Reader<'_>, shared: &SharedSettings) -> DockerCloudConfig {
        let mut config = DockerCloudConfig::default();
        for (var, slot) in [
            (ENV_DOCKERCLOUD_USERNAME, &mut config.username),
            (ENV_DOCKERCLOUD_TOKEN, &mut config.token),
        ] {
            let value = r.trimmed(var);
            if value.is_empty() {
                problem(r, var, "", "is required with SANDBOX_PROVIDER=dockercloud");
            } else if !value.bytes().all(|b| b.is_ascii_graphic()) {
                // It goes into a JSON body and a header: refuse what cannot; never echo it.
                problem(r, var, "<redacted>", "must be printable ASCII");
            } else {
                *slot = value;
            }
        }
        let api = r.trimmed(ENV_DOCKERCLOUD_API);
        config.connect_spelled = api == "connect";
        config.transport = match api.as_str() {
            "" | "connect" => Transport::Connect,
            "rest" => Transport::Rest,
            other => {
                problem(r, ENV_DOCKERCLOUD_API, other, "must be connect or rest");
                Transport::Connect
            }
        };
        config.auth_url = url(r, ENV_DOCKERCLOUD_AUTH_URL, Some(DEFAULT_AUTH_URL));
        let api_default = (config.transport == Transport::Rest).then_some(DEFAULT_REST_URL);
        config.api_url = url(r, ENV_DOCKERCLOUD_API_URL, api_default);
        if config.transport == Transport::Connect && r.trimmed(ENV_DOCKERCLOUD_API_URL).is_empty() {
            problem(
                r,
                ENV_DOCKERCLOUD_API_URL,
                "",
                "is required with the connect transport (e.g. https://sandboxes.connect.docker.com/sbx)",
            );
        }
        config.policy_url = url(r, ENV_DOCKERCLOUD_POLICY_URL, Some(DEFAULT_POLICY_URL));
        config.image = r.trimmed(ENV_DOCKERCLOUD_IMAGE);
        config.store_image = r.trimmed(ENV_DOCKERCLOUD_STORE_IMAGE);
        match (config.image.is_empty(), config.store_image.is_empty()) {
            (true, true) => problem(
                r,
                ENV_DOCKERCLOUD_IMAGE,
                "",
                "is required (or SANDBOX_DOCKERCLOUD_STORE_IMAGE)",
            ),
            (false, false) => problem(
                r,
                ENV_DOCKERCLOUD_STORE_IMAGE,
                &config.store_image.clone(),
                "cannot be set together with SANDBOX_DOCKERCLOUD_IMAGE",
            ),
            (false, true) if !image_chars(&config.image) => {
                problem(
                    r,
                    ENV_DOCKERCLOUD_IMAGE,
                    &config.image.clone(),
                    "must be an image reference",
                );
            }
            (false, true) if shared.require_pinned_images && pinned(&config.image).is_none() => {
                problem(
                    r,
                    ENV_DOCKERCLOUD_IMAGE,
                    &config.image.clone(),
                    "must be pinned by @sha256:<digest of the linux/amd64 manifest> (SANDBOX_REQUIRE_PINNED_IMAGES=1)",
                );
            }
            (true, false) if pinned(&config.store_image).is_none() => problem(
                r,
                ENV_DOCKERCLOUD_STORE_IMAGE,
                &config.store_image.clone(),
                "must be <image id>@sha256:<digest>",
            ),
            (true, false) if config.transport == Transport::Rest => problem(
                r,
                ENV_DOCKERCLOUD_STORE_IMAGE,
                &config.store_image.clone(),
                "needs the connect transport",
            ),
            _ => {}
        }
        let guard = r.trimmed(ENV_DOCKERCLOUD_GUARD_URL);
        if !guard.is_empty() {
            match BaseUrl::parse(&guard) {
                Ok(g) if g.tls && g.port == 443 && !g.is_loopback() => {
                    if config.transport == Transport::Rest {
                        // REST cannot show the policy after a guard rule (grants.md §7.3).
                        problem(
                            r,
                            ENV_DOCKERCLOUD_GUARD_URL,
                            &guard,
                            "grants need the connect transport (SANDBOX_DOCKERCLOUD_API=rest cannot read the guard rule back)",
                        );
                    } else {
                        config.guard_url = Some(g);
                    }
                }
                _ => problem(
                    r,
                    ENV_DOCKERCLOUD_GUARD_URL,
                    &guard,
                    "must be https://<host> on port 443, not loopback, with no path",
                ),
            }
        }
        // Docker Cloud sizes sandboxes in whole CPUs (config.md §2.3).
        let cpus = r.trimmed(ENV_CPUS);
        if let Ok(value) = cpus.parse::<f64>()
            && value.is_finite()
            && value >= 0.0
        {
            if value.fract() != 0.0 {
                problem(
                    r,
                    ENV_CPUS,
                    &cpus,
                    "must be whole CPUs with the dockercloud provider",
                );
            } else {
                config.cpus = value as u32;
            }
        }
        config
    }

    fn highest_tier(&self) -> IsolationTier {
        // Each run is its own Docker Cloud microVM.
        IsolationTier::Vm
    }

    fn enforces_pids(&self) -> bool {
        false
    }

    fn enforces_disk(&self) -> bool {
        false
    }

    fn metered(&self) -> bool {
        true
    }

    fn guard_url(&self) -> Option<String> {
        self.guard_url.as_ref().map(BaseUrl::origin)
    }

    /// Pinning or a store image, and `SANDBOX_DOCKERCLOUD_API=connect` spelled out.
    fn surface_violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.store_image.is_empty() && pinned(&self.image).is_none() {
            out.push(format!(
                "immutable surface: {ENV_DOCKERCLOUD_IMAGE} must be pinned by @sha256: (or use {ENV_DOCKERCLOUD_STORE_IMAGE})"
            ));
        }
        if !self.connect_spelled {
            out.push(format!(
                "immutable surface: {ENV_DOCKERCLOUD_API}=connect must be set explicitly"
            ));
        }
        out
    }

    fn build(&self, config: &Config) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(Arc::new(
            DockerCloud::new(self, config).map_err(ProviderError::from)?,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(pairs: &[(&str, &str)]) -> (DockerCloudConfig, Vec<String>) {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut r = Reader::new(&env);
        let config = DockerCloudConfig::read(&mut r, &SharedSettings::default());
        let problems = r.problems.iter().map(ToString::to_string).collect();
        (config, problems)
    }

    const BASE: [(&str, &str); 4] = [
        (ENV_DOCKERCLOUD_USERNAME, "me"),
        (ENV_DOCKERCLOUD_TOKEN, "dckr_pat_secret"),
        (
            ENV_DOCKERCLOUD_API_URL,
            "https://sandboxes.connect.docker.com/sbx",
        ),
        (ENV_DOCKERCLOUD_IMAGE, "docker/sandbox:latest"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut env: Vec<_> = BASE.to_vec();
        for (k, v) in extra {
            env.retain(|(n, _)| n != k);
            env.push((k, v));
        }
        env
    }

    #[test]
    fn credentials_api_url_and_image_are_required_and_the_token_never_shows() {
        let (_, problems) = read(&[]);
        assert_eq!(problems.len(), 4, "{problems:?}");
        let (config, problems) = read(&BASE);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(!format!("{config:?}").contains("dckr_pat_secret"));
        assert_eq!(config.transport, Transport::Connect);
        assert_eq!(config.api_url.path, "/sbx");
        assert_eq!(config.auth_url.path, "/v2/auth/token");
        assert_eq!(config.surface_violations().len(), 2);
        let (_, problems) = read(&[(ENV_DOCKERCLOUD_TOKEN, "dckr_pat_x\u{7}")]);
        assert!(
            problems.iter().all(|p| !p.contains("dckr_pat_x")),
            "{problems:?}"
        );
    }

    #[test]
    fn rest_has_a_default_url_and_refuses_a_guard_and_store_images() {
        let (config, problems) = read(&[
            (ENV_DOCKERCLOUD_USERNAME, "me"),
            (ENV_DOCKERCLOUD_TOKEN, "t"),
            (ENV_DOCKERCLOUD_API, "rest"),
            (ENV_DOCKERCLOUD_IMAGE, "a/b"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            config.api_url.shown(),
            "https://connect.docker.com:443/sandboxes"
        );
        let (_, problems) = read(&with(&[
            (ENV_DOCKERCLOUD_API, "rest"),
            (ENV_DOCKERCLOUD_GUARD_URL, "https://guard.example.com"),
        ]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(ENV_DOCKERCLOUD_GUARD_URL),
            "{problems:?}"
        );
        let (_, problems) = read(&with(&[(ENV_DOCKERCLOUD_API, "grpc")]));
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn urls_are_https_but_for_loopback_and_cpus_are_whole() {
        for bad in [
            "http://api.docker.com/sbx",
            "https://a/b?c",
            "ftp://x",
            "https://u@a/x",
        ] {
            let (_, problems) = read(&with(&[(ENV_DOCKERCLOUD_API_URL, bad)]));
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        }
        let (config, problems) = read(&with(&[(
            ENV_DOCKERCLOUD_API_URL,
            "http://127.0.0.1:9/sbx/",
        )]));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.api_url.path, "/sbx");
        for bad in [
            "https://127.0.0.1",
            "http://guard.example.com",
            "https://g.example.com:8443",
        ] {
            let (_, problems) = read(&with(&[(ENV_DOCKERCLOUD_GUARD_URL, bad)]));
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        }
        let (_, problems) = read(&with(&[(ENV_CPUS, "1.5")]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (config, problems) = read(&with(&[(ENV_CPUS, "2")]));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.cpus, 2);
    }

    #[test]
    fn pinning_and_hardened_surface() {
        let digest = "a".repeat(64);
        let image = format!("docker/sandbox@sha256:{digest}");
        let env: HashMap<String, String> = with(&[(ENV_DOCKERCLOUD_API, "connect")])
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .chain([(ENV_DOCKERCLOUD_IMAGE.to_owned(), image.clone())])
            .collect();
        let mut r = Reader::new(&env);
        let shared = SharedSettings {
            require_pinned_images: true,
        };
        let config = DockerCloudConfig::read(&mut r, &shared);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(config.pinned_digest(), Some(format!("sha256:{digest}")));
        assert!(config.surface_violations().is_empty());
        let env: HashMap<String, String> = BASE
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut r = Reader::new(&env);
        DockerCloudConfig::read(&mut r, &shared);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    }
}
