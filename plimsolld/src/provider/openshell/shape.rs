//! What a sandbox is created with (grants.md §8.3), kept so the read-back can compare what
//! came back with exactly what was sent.

use std::collections::BTreeMap;
use std::time::Duration;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use super::gateway::workspace;
use super::proto::sandbox::v1::SandboxPolicy;
use super::proto::v1::{CreateSandboxRequest, SandboxSpec, SandboxTemplate};

/// Label: the daemon that made the sandbox (16 hex).
pub const LABEL_INSTANCE: &str = "plimsoll.instance";
/// Label: a plimsoll sandbox at all (`1`); the orphan sweep lists by it.
pub const LABEL_RUN: &str = "plimsoll.run";
/// Label: seconds from creation to the run's deadline, rounded up, at least 1.
pub const LABEL_LIFETIME: &str = "plimsoll.lifetime";
/// The prefix of every sandbox name (then 14 hex: the gateway allows 19 characters).
pub const NAME_PREFIX: &str = "plp-";
/// The main process: it only keeps the sandbox up; code runs through execs.
pub const IDLE_COMMAND: [&str; 2] = ["sleep", "2147483647"];

/// A sandbox's shape: every field the read-back checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// `plp-` + 14 hex.
    pub name: String,
    /// The `plimsoll.*` labels.
    pub labels: BTreeMap<String, String>,
    /// The image, exactly as configured.
    pub image: String,
    /// `{limits: {memory: "<MB>Mi", cpu: "<n>"}}`.
    pub resources: Struct,
    /// `{docker: {mounts: [a noexec tmpfs on /tmp]}}` with `SANDBOX_DISK_MB`, else none.
    pub driver_config: Option<Struct>,
    /// The policy.
    pub policy: SandboxPolicy,
    /// The main process.
    pub command: Vec<String>,
}

/// The envelope every sandbox of a daemon gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The image.
    pub image: String,
    /// Memory in MiB (256 when unset).
    pub memory_mb: u32,
    /// CPUs (1 when unset).
    pub cpus: f64,
    /// The `/tmp` tmpfs in MiB; 0 = no driver config.
    pub disk_mb: u32,
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn object(fields: Vec<(&str, Value)>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

/// A CPU count as a Kubernetes quantity: `1`, `2`, `0.5`.
pub fn cpu_quantity(cpus: f64) -> String {
    format!("{cpus}")
}

impl Envelope {
    /// The template's resources (OpenShell's own default is unlimited, so always sent).
    pub fn resources(&self) -> Struct {
        Struct {
            fields: [(
                "limits".to_owned(),
                object(vec![
                    ("memory", string(&format!("{}Mi", self.memory_mb))),
                    ("cpu", string(&cpu_quantity(self.cpus))),
                ]),
            )]
            .into_iter()
            .collect(),
        }
    }

    /// The docker driver's config: a `/tmp` tmpfs of exactly `disk_mb`, noexec, nosuid, nodev.
    pub fn driver_config(&self) -> Option<Struct> {
        if self.disk_mb == 0 {
            return None;
        }
        let bytes = f64::from(self.disk_mb) * 1024.0 * 1024.0;
        let tmpfs = object(vec![
            ("type", string("tmpfs")),
            ("target", string("/tmp")),
            (
                "size_bytes",
                Value {
                    kind: Some(Kind::NumberValue(bytes)),
                },
            ),
            (
                "options",
                list(vec![string("noexec"), string("nosuid"), string("nodev")]),
            ),
        ]);
        Some(Struct {
            fields: [(
                "docker".to_owned(),
                object(vec![("mounts", list(vec![tmpfs]))]),
            )]
            .into_iter()
            .collect(),
        })
    }

    /// The shape of a new sandbox for this daemon (`instance`) that lives `lifetime`.
    pub fn shape(&self, instance: &str, lifetime: Duration, policy: &SandboxPolicy) -> Shape {
        let seconds = lifetime.as_secs() + u64::from(lifetime.subsec_nanos() > 0);
        let labels = [
            (LABEL_INSTANCE, instance.to_owned()),
            (LABEL_RUN, "1".to_owned()),
            (LABEL_LIFETIME, seconds.max(1).to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Shape {
            name: format!("{NAME_PREFIX}{}", hex::encode(rand::random::<[u8; 7]>())),
            labels,
            image: self.image.clone(),
            resources: self.resources(),
            driver_config: self.driver_config(),
            policy: policy.clone(),
            command: IDLE_COMMAND.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

impl Shape {
    /// The `CreateSandbox` request. Nothing the read-back expects empty is set.
    pub fn request(&self) -> CreateSandboxRequest {
        CreateSandboxRequest {
            workspace_scope: workspace(),
            spec: Some(SandboxSpec {
                template: Some(SandboxTemplate {
                    image: self.image.clone(),
                    resources: Some(self.resources.clone()),
                    driver_config: self.driver_config.clone(),
                    ..SandboxTemplate::default()
                }),
                policy: Some(self.policy.clone()),
                command: self.command.clone(),
                ..SandboxSpec::default()
            }),
            name: self.name.clone(),
            labels: self.labels.clone().into_iter().collect(),
            ..CreateSandboxRequest::default()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn envelope(disk_mb: u32) -> Envelope {
        Envelope {
            image: "plimsoll/sandbox:latest".into(),
            memory_mb: 256,
            cpus: 1.0,
            disk_mb,
        }
    }

    #[test]
    fn names_fit_the_gateway_and_labels_state_the_lifetime_rounded_up() {
        let shape = envelope(0).shape(
            "0123456789abcdef",
            Duration::from_millis(30_001),
            &SandboxPolicy::default(),
        );
        assert_eq!(shape.name.len(), 18);
        assert!(shape.name.starts_with("plp-"));
        assert_eq!(shape.labels[LABEL_LIFETIME], "31");
        assert_eq!(shape.labels[LABEL_RUN], "1");
        assert_eq!(shape.labels[LABEL_INSTANCE], "0123456789abcdef");
        let tiny = envelope(0).shape("i", Duration::ZERO, &SandboxPolicy::default());
        assert_eq!(tiny.labels[LABEL_LIFETIME], "1");
        assert!(shape.driver_config.is_none());
        let request = shape.request();
        let spec = request.spec.unwrap();
        assert_eq!(spec.command, ["sleep", "2147483647"]);
        assert!(spec.environment.is_empty() && spec.providers.is_empty());
    }

    #[test]
    fn resources_and_the_disk_are_kubernetes_quantities_and_a_tmpfs() {
        let e = Envelope {
            cpus: 0.5,
            memory_mb: 512,
            ..envelope(64)
        };
        let limits = match &e.resources().fields["limits"].kind {
            Some(Kind::StructValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(limits.fields["memory"], string("512Mi"));
        assert_eq!(limits.fields["cpu"], string("0.5"));
        assert_eq!(cpu_quantity(2.0), "2");
        let config = e.driver_config().unwrap();
        let text = format!("{config:?}");
        assert!(text.contains("67108864") && text.contains("noexec") && text.contains("/tmp"));
    }
}
