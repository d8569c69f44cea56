//! The gateway's deterministic policy hash, as `GetSandboxConfig` reports it.
//!
//! Canonical bytes: the policy's protobuf encoding with both maps emptied, prefixed by its
//! length; then the label `network_policies` (length-prefixed), the number of entries as a
//! raw little-endian u64, and per entry (sorted by key) the key and the rule's canonical
//! bytes, each length-prefixed; then the same for `network_middlewares`. SHA-256, in hex.
//! Every length is a little-endian u64. A rule's and a middleware's canonical bytes empty
//! their own maps the same way and add the entries after, in order (see `rule_bytes`).
//! The map-free part matches OpenShell's published behaviour (grants.md §8, correction 3)
//! and the known vector below; entries follow the gateway's source.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::proto::sandbox::v1::{NetworkMiddlewareConfig, NetworkPolicyRule, SandboxPolicy};

/// The hash the gateway reports for `policy`.
pub fn policy_hash(policy: &SandboxPolicy) -> String {
    hex::encode(Sha256::digest(policy_bytes(policy)))
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn count(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn policy_bytes(policy: &SandboxPolicy) -> Vec<u8> {
    let mut map_free = policy.clone();
    map_free.network_policies.clear();
    map_free.network_middlewares.clear();
    let mut out = Vec::new();
    put(&mut out, &map_free.encode_to_vec());
    // BTreeMap: iteration is already sorted by key.
    put(&mut out, b"network_policies");
    count(&mut out, policy.network_policies.len());
    for (key, rule) in &policy.network_policies {
        put(&mut out, key.as_bytes());
        put(&mut out, &rule_bytes(rule));
    }
    put(&mut out, b"network_middlewares");
    count(&mut out, policy.network_middlewares.len());
    for (key, middleware) in &policy.network_middlewares {
        put(&mut out, key.as_bytes());
        put(&mut out, &middleware_bytes(middleware));
    }
    out
}

fn sorted_map<M: Message>(
    out: &mut Vec<u8>,
    label: &[u8],
    map: &std::collections::BTreeMap<String, M>,
) {
    put(out, label);
    count(out, map.len());
    for (key, value) in map {
        put(out, key.as_bytes());
        put(out, &value.encode_to_vec());
    }
}

fn rule_bytes(rule: &NetworkPolicyRule) -> Vec<u8> {
    let mut map_free = rule.clone();
    for endpoint in &mut map_free.endpoints {
        endpoint.graphql_persisted_queries.clear();
        for allow in endpoint.rules.iter_mut().filter_map(|r| r.allow.as_mut()) {
            allow.query.clear();
            allow.params.clear();
        }
        for deny in &mut endpoint.deny_rules {
            deny.query.clear();
            deny.params.clear();
        }
    }
    let mut out = Vec::new();
    put(&mut out, &map_free.encode_to_vec());
    for (i, endpoint) in rule.endpoints.iter().enumerate() {
        count(&mut out, i);
        sorted_map(
            &mut out,
            b"graphql_persisted_queries",
            &endpoint.graphql_persisted_queries,
        );
        for (j, r) in endpoint.rules.iter().enumerate() {
            count(&mut out, j);
            if let Some(allow) = &r.allow {
                sorted_map(&mut out, b"allow_query", &allow.query);
                sorted_map(&mut out, b"allow_params", &allow.params);
            }
        }
        for (j, deny) in endpoint.deny_rules.iter().enumerate() {
            count(&mut out, j);
            sorted_map(&mut out, b"deny_query", &deny.query);
            sorted_map(&mut out, b"deny_params", &deny.params);
        }
    }
    out
}

fn middleware_bytes(middleware: &NetworkMiddlewareConfig) -> Vec<u8> {
    let mut map_free = middleware.clone();
    map_free.config = None;
    let mut out = Vec::new();
    put(&mut out, &map_free.encode_to_vec());
    if let Some(config) = &middleware.config {
        put(&mut out, &struct_bytes(config));
    }
    out
}

fn struct_bytes(value: &prost_types::Struct) -> Vec<u8> {
    let mut out = Vec::new();
    count(&mut out, value.fields.len());
    for (key, v) in &value.fields {
        put(&mut out, key.as_bytes());
        put(&mut out, &value_bytes(v));
    }
    out
}

fn value_bytes(value: &prost_types::Value) -> Vec<u8> {
    use prost_types::value::Kind;
    let mut out = Vec::new();
    match &value.kind {
        None => out.push(0),
        Some(Kind::NullValue(v)) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
        Some(Kind::NumberValue(v)) => {
            out.push(2);
            out.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        Some(Kind::StringValue(v)) => {
            out.push(3);
            put(&mut out, v.as_bytes());
        }
        Some(Kind::BoolValue(v)) => {
            out.push(4);
            out.push(u8::from(*v));
        }
        Some(Kind::StructValue(v)) => {
            out.push(5);
            put(&mut out, &struct_bytes(v));
        }
        Some(Kind::ListValue(v)) => {
            out.push(6);
            count(&mut out, v.values.len());
            for item in &v.values {
                put(&mut out, &value_bytes(item));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::sandbox::v1::{FilesystemPolicy, LandlockPolicy};

    /// The policy plimsoll sends (grants.md §8.3).
    fn plimsoll_policy() -> SandboxPolicy {
        let paths = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect();
        SandboxPolicy {
            version: 1,
            filesystem: Some(FilesystemPolicy {
                include_workdir: false,
                read_only: paths(&[
                    "/bin",
                    "/usr",
                    "/lib",
                    "/etc",
                    "/proc",
                    "/dev/urandom",
                    "/sys/fs/cgroup",
                    "/runner.mjs",
                ]),
                read_write: paths(&["/tmp", "/dev/null"]),
            }),
            landlock: Some(LandlockPolicy {
                compatibility: "hard_requirement".into(),
            }),
            ..Default::default()
        }
    }

    /// Known vectors, computed independently with the published package's own message
    /// classes (deterministic serialization) and the byte layout above.
    #[test]
    fn matches_known_vectors() {
        assert_eq!(
            policy_hash(&plimsoll_policy()),
            "d1c56801c3fcf0b1d8473339f3b625b1cbf43d5401c1268026551dd28a39d871"
        );
        assert_eq!(
            policy_hash(&SandboxPolicy::default()),
            "79fbe53f9ea97345bd1de5c9321294f25f7d7aea914fd02db9b59dc4c4c6774a"
        );
    }

    #[test]
    fn any_change_changes_the_hash() {
        let mut other = plimsoll_policy();
        if let Some(f) = other.filesystem.as_mut() {
            f.read_write.push("/work".into());
        }
        assert_ne!(policy_hash(&other), policy_hash(&plimsoll_policy()));
        let mut with_rule = plimsoll_policy();
        with_rule
            .network_policies
            .insert("api".into(), NetworkPolicyRule::default());
        assert_ne!(policy_hash(&with_rule), policy_hash(&plimsoll_policy()));
    }
}
