//! The container a sandbox runs in, derived from its stored spec the way OpenShell's
//! docker driver reads it: the image, the main command, `resources.limits` (Kubernetes
//! quantities; requests are refused), `driver_config.docker.mounts` (tmpfs only here), the
//! policy's read-write directories as volumes, and the simulator's labels.

use std::collections::HashMap;

use tonic::Status;

use super::{Entry, State};
use crate::docker::{LABEL_INSTANCE, LABEL_SIMULATOR, LABEL_SIMULATOR_VALUE};
use crate::proto::v1::SandboxTemplate;
use sim_support::docker::LockedDown;

/// Keeps a sandbox whose caller gave no command alive (the gateway records its own default
/// main process, `/bin/bash -l`, which the guest images here do not carry).
const IDLE_COMMAND: [&str; 2] = ["sleep", "2147483647"];

fn string_at<'a>(value: &'a prost_types::Struct, path: &[&str]) -> Option<&'a str> {
    use prost_types::value::Kind;
    let (last, inner) = path.split_last()?;
    let mut current = value;
    for key in inner {
        match current.fields.get(*key)?.kind.as_ref()? {
            Kind::StructValue(s) => current = s,
            _ => return None,
        }
    }
    match current.fields.get(*last)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

pub fn precondition(message: impl Into<String>) -> Status {
    Status::failed_precondition(message)
}

/// Kubernetes quantities, as the docker driver reads them.
fn memory_bytes(value: &str) -> Result<i64, Status> {
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    let amount: f64 = number.parse().map_err(|_| {
        precondition(format!(
            "invalid docker memory_limit '{value}'; expected a Kubernetes-style quantity"
        ))
    })?;
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        _ => {
            return Err(precondition(format!(
                "invalid docker memory_limit suffix '{suffix}'"
            )));
        }
    };
    if !(amount.is_finite() && amount > 0.0) {
        return Err(precondition(
            "docker memory_limit must be greater than zero",
        ));
    }
    Ok((amount * multiplier).round() as i64)
}

fn nano_cpus(value: &str) -> Result<i64, Status> {
    let cores = match value.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().map(|m| m / 1000.0),
        None => value.parse::<f64>(),
    }
    .map_err(|_| {
        precondition(format!(
            "invalid docker cpu_limit '{value}'; expected an integer or millicore quantity"
        ))
    })?;
    if !(cores.is_finite() && cores > 0.0) {
        return Err(precondition("docker cpu_limit must be greater than zero"));
    }
    Ok((cores * 1e9).round() as i64)
}

/// `driver_config.docker.mounts`: tmpfs mounts become docker tmpfs options.
fn driver_tmpfs(template: &SandboxTemplate) -> Result<HashMap<String, String>, Status> {
    use prost_types::value::Kind;
    let mut tmpfs = HashMap::new();
    let Some(config) = template.driver_config.as_ref() else {
        return Ok(tmpfs);
    };
    let Some(docker) = config.fields.get("docker") else {
        return Ok(tmpfs);
    };
    let Some(Kind::StructValue(docker)) = docker.kind.as_ref() else {
        return Err(Status::invalid_argument(
            "template.driver_config.docker must be an object",
        ));
    };
    for (key, value) in &docker.fields {
        if key != "mounts" {
            return Err(Status::invalid_argument(format!(
                "invalid docker driver_config: unknown field `{key}`"
            )));
        }
        let Some(Kind::ListValue(list)) = value.kind.as_ref() else {
            return Err(Status::invalid_argument(
                "invalid docker driver_config: mounts must be a list",
            ));
        };
        for mount in &list.values {
            let Some(Kind::StructValue(mount)) = mount.kind.as_ref() else {
                return Err(Status::invalid_argument(
                    "invalid docker driver_config: a mount must be an object",
                ));
            };
            if string_at(mount, &["type"]) != Some("tmpfs") {
                return Err(precondition(
                    "invalid docker driver_config: this gateway simulator supports tmpfs mounts only",
                ));
            }
            let target = string_at(mount, &["target"])
                .filter(|t| t.starts_with('/'))
                .ok_or_else(|| {
                    Status::invalid_argument(
                        "invalid docker driver_config: tmpfs target must be absolute",
                    )
                })?;
            let mut options = vec!["rw".to_owned()];
            for (field, v) in &mount.fields {
                match (field.as_str(), v.kind.as_ref()) {
                    ("type" | "target", _) => {}
                    ("options", Some(Kind::ListValue(list))) => {
                        for o in &list.values {
                            match o.kind.as_ref() {
                                Some(Kind::StringValue(o)) => options.push(o.clone()),
                                _ => {
                                    return Err(Status::invalid_argument(
                                        "invalid docker driver_config: tmpfs options are strings",
                                    ));
                                }
                            }
                        }
                    }
                    ("size_bytes", Some(Kind::NumberValue(n))) if *n > 0.0 && n.fract() == 0.0 => {
                        options.push(format!("size={}", *n as i64));
                    }
                    ("mode", Some(Kind::NumberValue(n))) if *n >= 0.0 && n.fract() == 0.0 => {
                        options.push(format!("mode={:o}", *n as i64));
                    }
                    _ => {
                        return Err(Status::invalid_argument(format!(
                            "invalid docker driver_config: bad tmpfs field `{field}`"
                        )));
                    }
                }
            }
            tmpfs.insert(target.to_owned(), options.join(","));
        }
    }
    Ok(tmpfs)
}

/// The container a stored sandbox runs in.
pub fn plan(state: &State, entry: &Entry) -> Result<LockedDown, Status> {
    let meta = entry.sandbox.metadata.clone().unwrap_or_default();
    let spec = entry.sandbox.spec.clone().unwrap_or_default();
    let template = spec.template.clone().unwrap_or_default();
    let limit = |key| {
        template
            .resources
            .as_ref()
            .and_then(|r| string_at(r, &["limits", key]))
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.trim().to_owned())
    };
    for key in ["cpu", "memory"] {
        if template
            .resources
            .as_ref()
            .and_then(|r| string_at(r, &["requests", key]))
            .is_some_and(|v| !v.trim().is_empty())
        {
            return Err(precondition(format!(
                "docker compute driver does not support resources.requests.{key}"
            )));
        }
    }
    let memory = limit("memory").map(|v| memory_bytes(&v)).transpose()?;
    let cpus = limit("cpu").map(|v| nano_cpus(&v)).transpose()?;
    let tmpfs = driver_tmpfs(&template)?;
    // The policy's writable directories, over a read-only root (OpenShell enforces them
    // with Landlock inside the sandbox instead). /dev entries are devices, not dirs.
    let volumes = spec
        .policy
        .as_ref()
        .and_then(|p| p.filesystem.as_ref())
        .map(|f| f.read_write.clone())
        .unwrap_or_else(|| vec!["/tmp".to_owned()])
        .into_iter()
        .filter(|p| !p.starts_with("/dev/") && p != "/dev" && !tmpfs.contains_key(p))
        .collect();
    let mut labels: HashMap<String, String> = template.labels.clone().into_iter().collect();
    labels.insert(LABEL_SIMULATOR.into(), LABEL_SIMULATOR_VALUE.into());
    labels.insert(LABEL_INSTANCE.into(), state.settings.instance.clone());
    labels.insert("openshell.ai/sandbox-id".into(), meta.id.clone());
    labels.insert("openshell.ai/sandbox-name".into(), meta.name.clone());
    let env = spec
        .environment
        .iter()
        .chain(&template.environment)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let cmd = if entry.command_given {
        spec.command.clone()
    } else {
        IDLE_COMMAND.iter().map(|s| (*s).to_owned()).collect()
    };
    Ok(LockedDown {
        name: format!("openshell-sim-{}-{}", state.settings.instance, meta.name),
        image: template.image,
        cmd,
        env,
        tty: entry.command_given && spec.tty,
        labels,
        memory_bytes: memory,
        nano_cpus: cpus,
        tmpfs,
        volumes,
        user: state.settings.sandbox_user.clone(),
        pids_limit: state.settings.pids_limit,
        runtime: state.settings.runtime.clone(),
        // No /dev/shm: OpenShell's Landlock policy allows writes only to its read-write
        // paths, and docker's shared-memory tmpfs would be one more writable place.
        ipc_mode: Some("none".into()),
        ..LockedDown::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_docker_driver_does() {
        assert_eq!(memory_bytes("256Mi").unwrap(), 256 << 20);
        assert_eq!(memory_bytes("1G").unwrap(), 1_000_000_000);
        assert!(memory_bytes("12Qi").is_err());
        assert_eq!(nano_cpus("1").unwrap(), 1_000_000_000);
        assert_eq!(nano_cpus("500m").unwrap(), 500_000_000);
        assert!(nano_cpus("0").is_err());
    }
}
