//! Faults the tests switch on through the admin endpoint: each one makes the simulator
//! answer the way a misbehaving or compromised gateway would, so a client's checks can be
//! proven to refuse it. All are off by default; `PUT /faults` replaces the whole set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::proto::sandbox::v1::{
    EffectiveSetting, GetSandboxConfigResponse, PolicySource, SettingValue, setting_value,
};
use crate::proto::v1::Sandbox;

/// The whole fault set (JSON; every field optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// `GetGatewayInfo` lists a second compute driver (`kubernetes`) beside `docker`.
    pub second_compute_driver: bool,
    /// `GetGatewayInfo` fails with this code instead of answering.
    pub gateway_info_error: Option<GatewayInfoError>,
    /// Sandboxes read back (Create, Get, List) differ from what was stored in these fields.
    pub readback: Vec<ReadbackFault>,
    /// `GetSandboxConfig` answers differ in these ways.
    pub config: Vec<ConfigFault>,
    /// `DeleteSandbox` answers ACCEPTED and the sandbox stays DELETING (its container
    /// stopped) until this is switched off again.
    pub delete_stays_accepted: bool,
    /// The sandbox an exec runs in is killed this many milliseconds after the exec starts
    /// (a sandbox that dies mid-run); it then reads back as ERROR.
    pub die_after_exec_start_ms: Option<u64>,
    /// The gateway's clock runs this many milliseconds ahead of the host (negative: behind).
    pub clock_skew_ms: i64,
    /// A new sandbox stays PROVISIONING at least this long (and a started one STARTING).
    pub provision_delay_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayInfoError {
    PermissionDenied,
    Unauthenticated,
}

/// One field of a sandbox read back that comes back different from what was sent
/// (grants.md §8.4, one fault per checked field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadbackFault {
    /// One label's value changed (or one added when there are none).
    Labels,
    /// Another image.
    Image,
    /// Another memory limit.
    Resources,
    /// The policy gains a read-write path.
    Policy,
    /// A credential provider attached.
    Providers,
    /// The driver config changed (a tmpfs on /var/tmp added).
    DriverConfig,
    /// Another command.
    Command,
    /// Never-set fields that come back set.
    AgentSocket,
    SpecEnvironment,
    TemplateEnvironment,
    RuntimeClassName,
    UserNamespaces,
    TemplateLabels,
    TemplateAnnotations,
}

/// A way `GetSandboxConfig` differs from the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigFault {
    /// `policy_hash` is not the hash of the policy.
    PolicyHash,
    /// The policy differs from the one sent (with its own, consistent hash).
    Policy,
    /// `policy_source` is GLOBAL.
    PolicySource,
    /// `configuration_admitted` is false.
    NotAdmitted,
    /// `agent_policy_proposals_enabled` is set to true.
    ProposalsEnabled,
    /// `agent_policy_proposals_enabled` is missing from the settings.
    ProposalsMissing,
    /// `agent_policy_proposals_enabled` holds a string.
    ProposalsWrongType,
}

/// The key whose presence-with-no-value means "off".
pub const PROPOSALS_KEY: &str = "agent_policy_proposals_enabled";

/// Applies the read-back faults to a sandbox about to be sent.
pub fn tamper_sandbox(sandbox: &mut Sandbox, faults: &[ReadbackFault]) {
    let Some(spec) = sandbox.spec.as_mut() else {
        return;
    };
    for fault in faults {
        let template = spec.template.get_or_insert_with(Default::default);
        match fault {
            ReadbackFault::Labels => {
                if let Some(meta) = sandbox.metadata.as_mut() {
                    match meta.labels.iter_mut().next() {
                        Some((_, value)) => value.push('x'),
                        None => {
                            meta.labels.insert("injected".into(), "1".into());
                        }
                    }
                }
            }
            ReadbackFault::Image => template.image = "plimsoll/not-the-image:latest".into(),
            ReadbackFault::Resources => {
                template.resources = Some(struct_of(&[(
                    "limits",
                    struct_value(&[("memory", "999Mi"), ("cpu", "1")]),
                )]));
            }
            ReadbackFault::Policy => {
                let policy = spec.policy.get_or_insert_with(Default::default);
                policy
                    .filesystem
                    .get_or_insert_with(Default::default)
                    .read_write
                    .push("/usr".into());
            }
            ReadbackFault::Providers => spec.providers.push("github".into()),
            ReadbackFault::DriverConfig => {
                let mount = struct_value(&[("type", "tmpfs"), ("target", "/var/tmp")]);
                let mounts = prost_types::Value {
                    kind: Some(prost_types::value::Kind::ListValue(
                        prost_types::ListValue {
                            values: vec![mount],
                        },
                    )),
                };
                let docker = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StructValue(struct_of(&[(
                        "mounts", mounts,
                    )]))),
                };
                template.driver_config = Some(struct_of(&[("docker", docker)]));
            }
            ReadbackFault::Command => spec.command = vec!["/bin/sh".into()],
            ReadbackFault::AgentSocket => template.agent_socket = "/run/agent.sock".into(),
            ReadbackFault::SpecEnvironment => {
                spec.environment.insert("INJECTED".into(), "1".into());
            }
            ReadbackFault::TemplateEnvironment => {
                template.environment.insert("INJECTED".into(), "1".into());
            }
            ReadbackFault::RuntimeClassName => template.runtime_class_name = "kata".into(),
            ReadbackFault::UserNamespaces => template.user_namespaces = Some(false),
            ReadbackFault::TemplateLabels => {
                template.labels.insert("injected".into(), "1".into());
            }
            ReadbackFault::TemplateAnnotations => {
                template.annotations.insert("injected".into(), "1".into());
            }
        }
    }
}

/// Applies the config faults to a `GetSandboxConfig` answer about to be sent.
pub fn tamper_config(config: &mut GetSandboxConfigResponse, faults: &[ConfigFault]) {
    for fault in faults {
        match fault {
            ConfigFault::PolicyHash => {
                config.policy_hash = crate::policy_hash::policy_hash(&Default::default());
            }
            ConfigFault::Policy => {
                let policy = config.policy.get_or_insert_with(Default::default);
                policy
                    .filesystem
                    .get_or_insert_with(Default::default)
                    .read_only
                    .push("/home".into());
                config.policy_hash = crate::policy_hash::policy_hash(policy);
            }
            ConfigFault::PolicySource => config.policy_source = PolicySource::Global.into(),
            ConfigFault::NotAdmitted => config.configuration_admitted = false,
            ConfigFault::ProposalsEnabled => set_proposals(
                &mut config.settings,
                Some(setting_value::Value::BoolValue(true)),
            ),
            ConfigFault::ProposalsMissing => {
                config.settings.remove(PROPOSALS_KEY);
            }
            ConfigFault::ProposalsWrongType => set_proposals(
                &mut config.settings,
                Some(setting_value::Value::StringValue("false".into())),
            ),
        }
    }
}

fn set_proposals(
    settings: &mut BTreeMap<String, EffectiveSetting>,
    value: Option<setting_value::Value>,
) {
    settings.insert(
        PROPOSALS_KEY.into(),
        EffectiveSetting {
            value: Some(SettingValue { value }),
            scope: crate::proto::sandbox::v1::SettingScope::Sandbox.into(),
        },
    );
}

fn struct_of(fields: &[(&str, prost_types::Value)]) -> prost_types::Struct {
    prost_types::Struct {
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    }
}

fn struct_value(fields: &[(&str, &str)]) -> prost_types::Value {
    let text = |s: &str| prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s.to_owned())),
    };
    let fields: Vec<(&str, prost_types::Value)> =
        fields.iter().map(|(k, v)| (*k, text(v))).collect();
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(struct_of(&fields))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_names_are_snake_case_json() {
        let faults: Faults = serde_json::from_str(
            r#"{"readback":["template_annotations","user_namespaces"],"config":["proposals_wrong_type"],"gateway_info_error":"permission_denied"}"#,
        )
        .unwrap();
        assert_eq!(
            faults.readback,
            vec![
                ReadbackFault::TemplateAnnotations,
                ReadbackFault::UserNamespaces
            ]
        );
        assert!(serde_json::from_str::<Faults>(r#"{"no_such_fault":true}"#).is_err());
    }

    #[test]
    fn every_readback_fault_changes_the_sandbox() {
        use ReadbackFault::*;
        let all = [
            Labels,
            Image,
            Resources,
            Policy,
            Providers,
            DriverConfig,
            Command,
            AgentSocket,
            SpecEnvironment,
            TemplateEnvironment,
            RuntimeClassName,
            UserNamespaces,
            TemplateLabels,
            TemplateAnnotations,
        ];
        let base = Sandbox {
            metadata: Some(Default::default()),
            spec: Some(Default::default()),
            ..Default::default()
        };
        for fault in all {
            let mut changed = base.clone();
            tamper_sandbox(&mut changed, &[fault]);
            assert_ne!(changed, base, "{fault:?} changed nothing");
        }
    }
}
