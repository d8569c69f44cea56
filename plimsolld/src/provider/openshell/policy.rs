//! The sandbox policy plimsoll sends (grants.md §8.3) and OpenShell's deterministic hash of it
//! (§8.4 with correction 3), which `GetSandboxConfig` must report for the policy in force.
//!
//! The policy has no network rules (the gateway's deny-all egress holds), a filesystem that is
//! read-only but for `/tmp` and `/dev/null`, and Landlock as a hard requirement.
//!
//! The hash: the policy's deterministic protobuf encoding with both of its maps emptied,
//! prefixed by its length; then the label `network_policies` (length-prefixed) and its entry
//! count; then `network_middlewares` and its count; every length and count a little-endian
//! u64 (the counts raw, not length-prefixed); SHA-256 in lower-case hex. A policy with map
//! entries is never hashed here: plimsoll never sends one, and [`policy_hash`] refuses it.

use prost::Message;
use sha2::{Digest, Sha256};

use super::proto::sandbox::v1::{FilesystemPolicy, LandlockPolicy, SandboxPolicy};

/// The paths a guest may read.
const READ_ONLY: [&str; 8] = [
    "/bin",
    "/usr",
    "/lib",
    "/etc",
    "/proc",
    "/dev/urandom",
    "/sys/fs/cgroup",
    "/runner.mjs",
];
/// The paths a guest may write.
const READ_WRITE: [&str; 2] = ["/tmp", "/dev/null"];

/// The policy every sandbox is created with.
pub fn sandbox_policy() -> SandboxPolicy {
    let paths = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect();
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: false,
            read_only: paths(&READ_ONLY),
            read_write: paths(&READ_WRITE),
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "hard_requirement".to_owned(),
        }),
        process: None,
        network_policies: Default::default(),
        network_middlewares: Default::default(),
    }
}

fn length_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// OpenShell's hash of a policy without map entries; `None` for one with entries.
pub fn policy_hash(policy: &SandboxPolicy) -> Option<String> {
    if !policy.network_policies.is_empty() || !policy.network_middlewares.is_empty() {
        return None;
    }
    let mut bytes = Vec::new();
    // prost writes fields in number order and omits defaults: the deterministic encoding.
    length_prefixed(&mut bytes, &policy.encode_to_vec());
    for label in [b"network_policies".as_slice(), b"network_middlewares"] {
        length_prefixed(&mut bytes, label);
        bytes.extend_from_slice(&0u64.to_le_bytes());
    }
    Some(hex::encode(Sha256::digest(bytes)))
}

/// How records and `Describe` state the verified policy.
pub fn policy_digest(hash: &str) -> String {
    format!("openshell-policy:sha256:{hash}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::proto::sandbox::v1::NetworkPolicyRule;
    use super::*;

    /// Known vectors, computed with OpenShell's published package's own message classes
    /// (deterministic serialization) and the byte layout above, independently of this code.
    #[test]
    fn matches_the_known_vectors() {
        assert_eq!(
            policy_hash(&sandbox_policy()).unwrap(),
            "d1c56801c3fcf0b1d8473339f3b625b1cbf43d5401c1268026551dd28a39d871"
        );
        assert_eq!(
            policy_hash(&SandboxPolicy::default()).unwrap(),
            "79fbe53f9ea97345bd1de5c9321294f25f7d7aea914fd02db9b59dc4c4c6774a"
        );
    }

    #[test]
    fn a_changed_path_changes_the_hash_and_map_entries_are_never_hashed() {
        let mut other = sandbox_policy();
        if let Some(f) = other.filesystem.as_mut() {
            f.read_write.push("/work".into());
        }
        assert_ne!(policy_hash(&other), policy_hash(&sandbox_policy()));
        let mut ruled = sandbox_policy();
        ruled
            .network_policies
            .insert("api".into(), NetworkPolicyRule::default());
        assert_eq!(policy_hash(&ruled), None);
    }
}
