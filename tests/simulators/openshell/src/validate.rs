//! Request checks the gateway makes before it touches anything, with the gateway's own
//! limits and INVALID_ARGUMENT messages.

use std::collections::BTreeMap;

use prost::Message;
use tonic::Status;

use crate::proto::sandbox::v1::SandboxPolicy;

/// A sandbox name: the gateway routes by it, so at most 19 characters.
pub const MAX_NAME_LEN: usize = 19;
const MAX_POLICY_BYTES: usize = 262_144;
const MAX_SELECTOR_PAIRS: usize = 64;
const MAX_POLICY_PATHS: usize = 256;
const MAX_PATH_LEN: usize = 4096;
pub const MAX_EXEC_ARGS: usize = 1024;
pub const MAX_EXEC_ARG_LEN: usize = 32 * 1024;
pub const MAX_COMMAND_LEN: usize = 256 * 1024;

fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message)
}

/// Lower-case letters, digits and single inner hyphens; empty means "choose one".
pub fn sandbox_name(name: &str) -> Result<(), Status> {
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "name exceeds maximum length ({} > {MAX_NAME_LEN})",
            name.len()
        )));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(invalid(
            "name must contain only lowercase alphanumeric characters or hyphens",
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(invalid("name must not start or end with a hyphen"));
    }
    if name.contains("--") {
        return Err(invalid("name must not contain consecutive hyphens"));
    }
    Ok(())
}

fn label_segment(segment: &str, what: &str, whole: &str) -> Result<(), Status> {
    if segment.len() > 63 {
        return Err(invalid(format!("{what} exceeds 63 characters: '{whole}'")));
    }
    if !segment
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(invalid(format!(
            "{what} contains invalid characters (must be alphanumeric, '-', '_', or '.'): '{whole}'"
        )));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    if !edge_ok(segment.chars().next()) || !edge_ok(segment.chars().last()) {
        return Err(invalid(format!(
            "{what} must start and end with an alphanumeric character: '{whole}'"
        )));
    }
    Ok(())
}

/// A Kubernetes label key: optional DNS-subdomain prefix and `/`, then a name.
pub fn label_key(key: &str) -> Result<(), Status> {
    if key.is_empty() {
        return Err(invalid("label key cannot be empty"));
    }
    if key.len() > 253 {
        return Err(invalid(format!(
            "label key exceeds 253 characters: '{key}'"
        )));
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err(invalid(format!(
            "label key name segment cannot be empty: '{key}'"
        )));
    }
    label_segment(name, "label key name segment", key)?;
    if let Some(prefix) = prefix {
        let dns = prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if prefix.is_empty()
            || !dns
            || prefix.starts_with(['-', '.'])
            || prefix.ends_with(['-', '.'])
            || prefix.contains("..")
        {
            return Err(invalid(format!(
                "label key prefix must be a DNS subdomain (lowercase alphanumeric, '-', '.'): '{key}'"
            )));
        }
    }
    Ok(())
}

/// A Kubernetes label value (may be empty).
pub fn label_value(value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Ok(());
    }
    label_segment(value, "label value", value)
}

pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), Status> {
    for (key, value) in labels {
        label_key(key)?;
        label_value(value)?;
    }
    Ok(())
}

/// Parses `k=v,k2=v2` (blank pairs ignored) into the pairs that must all match.
pub fn label_selector(selector: &str) -> Result<Vec<(String, String)>, Status> {
    let mut pairs = Vec::new();
    for pair in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if pairs.len() == MAX_SELECTOR_PAIRS {
            return Err(invalid(format!(
                "label selector exceeds {MAX_SELECTOR_PAIRS} pair limit"
            )));
        }
        let Some((key, value)) = pair.split_once('=') else {
            return Err(invalid(format!(
                "invalid label selector: expected 'key=value', got '{pair}'"
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err(invalid(format!(
                "invalid label selector: key cannot be empty in '{pair}'"
            )));
        }
        label_key(key)?;
        label_value(value)?;
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

/// The gateway's policy safety rules: size, process identity, absolute paths without
/// `..`, and never `/` read-write.
pub fn policy(policy: &SandboxPolicy) -> Result<(), Status> {
    let size = policy.encoded_len();
    if size > MAX_POLICY_BYTES {
        return Err(invalid(format!(
            "policy serialized size exceeds maximum ({size} > {MAX_POLICY_BYTES})"
        )));
    }
    let mut violations = Vec::new();
    if let Some(process) = &policy.process {
        for (field, value) in [
            ("run_as_user", &process.run_as_user),
            ("run_as_group", &process.run_as_group),
        ] {
            let ok = value.is_empty()
                || value == "sandbox"
                || value
                    .parse::<u32>()
                    .is_ok_and(|id| (1..u32::MAX).contains(&id));
            if !ok {
                violations.push(format!("invalid process identity {field}='{value}'"));
            }
        }
    }
    if let Some(fs) = &policy.filesystem {
        if fs.read_only.len() + fs.read_write.len() > MAX_POLICY_PATHS {
            violations.push("too many filesystem paths".to_owned());
        }
        for path in fs.read_only.iter().chain(&fs.read_write) {
            if path.len() > MAX_PATH_LEN {
                violations.push("filesystem path too long".to_owned());
            } else if !path.starts_with('/') {
                violations.push(format!("relative path '{path}'"));
            } else if path.split('/').any(|c| c == "..") {
                violations.push(format!("path traversal in '{path}'"));
            }
        }
        for path in &fs.read_write {
            if path.trim_end_matches('/').is_empty() {
                violations.push(format!("overly broad read-write path '{path}'"));
            }
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(invalid(format!(
            "policy contains unsafe content: {}",
            violations.join("; ")
        )))
    }
}

/// An environment variable name the gateway accepts for exec.
pub fn env_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_gateway() {
        assert!(sandbox_name("plp-0123456789abcd").is_ok());
        assert!(sandbox_name("a234567890123456789").is_ok());
        assert!(sandbox_name("a2345678901234567890").is_err());
        for bad in ["Upper", "-lead", "trail-", "two--hyphens", "under_score"] {
            assert!(sandbox_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selectors_parse_pairs_and_refuse_the_rest() {
        assert_eq!(
            label_selector("plimsoll.run=1, plimsoll.instance=ab12,").unwrap(),
            vec![
                ("plimsoll.run".into(), "1".into()),
                ("plimsoll.instance".into(), "ab12".into())
            ]
        );
        assert!(label_selector("plimsoll.run").is_err());
        assert!(label_selector("=1").is_err());
        assert!(label_selector("Bad/Prefix=1").is_err());
        assert!(label_selector("").unwrap().is_empty());
    }

    #[test]
    fn unsafe_policies_are_refused() {
        use crate::proto::sandbox::v1::{FilesystemPolicy, ProcessPolicy};
        let fs = |rw: &str| SandboxPolicy {
            filesystem: Some(FilesystemPolicy {
                read_write: vec![rw.into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(policy(&fs("/tmp")).is_ok());
        assert!(policy(&fs("/")).is_err());
        assert!(policy(&fs("tmp")).is_err());
        assert!(policy(&fs("/tmp/../etc")).is_err());
        let root = SandboxPolicy {
            process: Some(ProcessPolicy {
                run_as_user: "root".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(policy(&root).is_err());
    }
}
