//! The read-back before any code runs (grants.md §8.4): the sandbox the gateway made must be
//! exactly the one that was asked for, field by field, and its configuration must be the
//! policy sent, verified by OpenShell's own hash computed here.
//!
//! The gateway fills in fields the caller never sent (correction 4: an attachment epoch, a
//! default `tty`, `internal.openshell.ai/*` annotations), so what is compared is what was
//! sent, and what must stay empty. Each check has its own [`Mismatch`], so a refusal names the
//! field; no value the gateway sent is quoted (the log gets the field name only).

use super::policy::policy_hash;
use super::proto::sandbox::v1::{
    GetSandboxConfigResponse, PolicySource, SettingValue, setting_value,
};
use super::proto::v1::Sandbox;
use super::shape::Shape;

/// The setting that must be provably off.
pub const PROPOSALS_KEY: &str = "agent_policy_proposals_enabled";

/// One field that did not come back as sent (or as it must be).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The answer carried no metadata, spec or template.
    #[error("the sandbox came back without its metadata, spec or template")]
    Incomplete,
    /// The name differs.
    #[error("the sandbox came back under another name")]
    Name,
    /// The id is empty.
    #[error("the sandbox came back without an id")]
    Id,
    /// A label sent came back different (or not at all).
    #[error("a label came back different from the one sent")]
    Labels,
    /// The image differs.
    #[error("the image came back different from the configured one")]
    Image,
    /// `resources` differ.
    #[error("the resource limits came back different from those sent")]
    Resources,
    /// The policy differs.
    #[error("the policy came back different from the one sent")]
    Policy,
    /// The driver config differs.
    #[error("the driver config came back different from the one sent")]
    DriverConfig,
    /// A credential provider is attached.
    #[error("a credential provider is attached")]
    Providers,
    /// The main command differs.
    #[error("the command came back different from the one sent")]
    Command,
    /// `agent_socket` is set.
    #[error("agent_socket is set")]
    AgentSocket,
    /// The spec's environment is set.
    #[error("the spec's environment is set")]
    SpecEnvironment,
    /// The template's environment is set.
    #[error("the template's environment is set")]
    TemplateEnvironment,
    /// `runtime_class_name` is set.
    #[error("runtime_class_name is set")]
    RuntimeClassName,
    /// `user_namespaces` is set.
    #[error("user_namespaces is set")]
    UserNamespaces,
    /// The template carries labels.
    #[error("the template carries labels")]
    TemplateLabels,
    /// The template carries annotations.
    #[error("the template carries annotations")]
    TemplateAnnotations,
    /// The policy in force is not the sandbox's own.
    #[error("the policy in force is not the sandbox's own (policy_source)")]
    PolicySource,
    /// The reported hash is not the locally computed hash of the policy sent.
    #[error("the policy hash differs from the one computed here")]
    PolicyHash,
    /// The configuration's policy differs from the one sent.
    #[error("the configuration's policy differs from the one sent")]
    ConfigPolicy,
    /// The configuration is not admitted.
    #[error("the configuration is not admitted")]
    NotAdmitted,
    /// Agent policy proposals are not provably off.
    #[error("agent policy proposals are not provably off")]
    Proposals,
}

/// Checks a sandbox read back against `shape`.
pub fn sandbox(shape: &Shape, got: &Sandbox) -> Result<(), Mismatch> {
    let meta = got.metadata.as_ref().ok_or(Mismatch::Incomplete)?;
    let spec = got.spec.as_ref().ok_or(Mismatch::Incomplete)?;
    let template = spec.template.as_ref().ok_or(Mismatch::Incomplete)?;
    if meta.name != shape.name {
        return Err(Mismatch::Name);
    }
    if meta.id.is_empty() {
        return Err(Mismatch::Id);
    }
    if shape
        .labels
        .iter()
        .any(|(k, v)| meta.labels.get(k) != Some(v))
    {
        return Err(Mismatch::Labels);
    }
    if template.image != shape.image {
        return Err(Mismatch::Image);
    }
    if template.resources.as_ref() != Some(&shape.resources) {
        return Err(Mismatch::Resources);
    }
    if spec.policy.as_ref() != Some(&shape.policy) {
        return Err(Mismatch::Policy);
    }
    // Empty means absent.
    let driver = template
        .driver_config
        .as_ref()
        .filter(|s| !s.fields.is_empty());
    if driver != shape.driver_config.as_ref() {
        return Err(Mismatch::DriverConfig);
    }
    if !spec.providers.is_empty() {
        return Err(Mismatch::Providers);
    }
    if !template.agent_socket.is_empty() {
        return Err(Mismatch::AgentSocket);
    }
    if !spec.environment.is_empty() {
        return Err(Mismatch::SpecEnvironment);
    }
    if !template.environment.is_empty() {
        return Err(Mismatch::TemplateEnvironment);
    }
    if !template.runtime_class_name.is_empty() {
        return Err(Mismatch::RuntimeClassName);
    }
    if template.user_namespaces.is_some() {
        return Err(Mismatch::UserNamespaces);
    }
    if !template.labels.is_empty() {
        return Err(Mismatch::TemplateLabels);
    }
    if !template.annotations.is_empty() {
        return Err(Mismatch::TemplateAnnotations);
    }
    if spec.command != shape.command {
        return Err(Mismatch::Command);
    }
    Ok(())
}

/// Checks `GetSandboxConfig`'s answer against `shape`; answers the verified hash.
pub fn config(shape: &Shape, got: &GetSandboxConfigResponse) -> Result<String, Mismatch> {
    if got.policy_source != i32::from(PolicySource::Sandbox) {
        return Err(Mismatch::PolicySource);
    }
    let hash = policy_hash(&shape.policy).ok_or(Mismatch::PolicyHash)?;
    if got.policy_hash != hash {
        return Err(Mismatch::PolicyHash);
    }
    if got.policy.as_ref() != Some(&shape.policy) {
        return Err(Mismatch::ConfigPolicy);
    }
    if !got.configuration_admitted {
        return Err(Mismatch::NotAdmitted);
    }
    if !proposals_off(got) {
        return Err(Mismatch::Proposals);
    }
    Ok(hash)
}

/// Off only when the key is present with no value, or with the boolean `false`; a missing
/// key, `true` or any other type is not provably off.
fn proposals_off(got: &GetSandboxConfigResponse) -> bool {
    let Some(setting) = got.settings.get(PROPOSALS_KEY) else {
        return false;
    };
    match &setting.value {
        None | Some(SettingValue { value: None }) => true,
        Some(SettingValue {
            value: Some(setting_value::Value::BoolValue(enabled)),
        }) => !enabled,
        Some(_) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::policy::sandbox_policy;
    use super::super::proto::datamodel::v1::ObjectMeta;
    use super::super::proto::sandbox::v1::EffectiveSetting;
    use super::super::proto::v1::{SandboxSpec, SandboxTemplate};
    use super::super::shape::Envelope;
    use super::*;

    fn shape() -> Shape {
        Envelope {
            image: "plimsoll/sandbox:latest".into(),
            memory_mb: 256,
            cpus: 1.0,
            disk_mb: 16,
        }
        .shape(
            "0123456789abcdef",
            std::time::Duration::from_secs(10),
            &sandbox_policy(),
        )
    }

    /// What a faithful gateway answers, with its own fill-ins.
    fn answer(shape: &Shape) -> Sandbox {
        let request = shape.request();
        let mut spec = request.spec.unwrap();
        spec.tty = false;
        spec.provider_attachment_epoch = "epoch".into();
        Sandbox {
            metadata: Some(ObjectMeta {
                id: "3f2a".into(),
                name: shape.name.clone(),
                labels: request.labels.clone(),
                annotations: [("internal.openshell.ai/x".to_owned(), "y".to_owned())]
                    .into_iter()
                    .collect(),
                ..ObjectMeta::default()
            }),
            spec: Some(spec),
            ..Sandbox::default()
        }
    }

    fn config_answer(shape: &Shape) -> GetSandboxConfigResponse {
        GetSandboxConfigResponse {
            policy: Some(shape.policy.clone()),
            policy_hash: policy_hash(&shape.policy).unwrap(),
            policy_source: PolicySource::Sandbox.into(),
            configuration_admitted: true,
            settings: [(PROPOSALS_KEY.to_owned(), EffectiveSetting::default())]
                .into_iter()
                .collect(),
            ..GetSandboxConfigResponse::default()
        }
    }

    fn template(s: &mut Sandbox) -> &mut SandboxTemplate {
        s.spec.as_mut().unwrap().template.as_mut().unwrap()
    }

    fn spec(s: &mut Sandbox) -> &mut SandboxSpec {
        s.spec.as_mut().unwrap()
    }

    #[test]
    fn a_faithful_answer_passes_and_every_changed_field_is_named() {
        let shape = shape();
        sandbox(&shape, &answer(&shape)).unwrap();
        type Tamper = fn(&mut Sandbox);
        let cases: [(Tamper, Mismatch); 14] = [
            (
                |s| {
                    let m = s.metadata.as_mut().unwrap();
                    m.labels.insert(LABEL.into(), "2".into());
                },
                Mismatch::Labels,
            ),
            (|s| template(s).image = "other".into(), Mismatch::Image),
            (|s| template(s).resources = None, Mismatch::Resources),
            (|s| spec(s).policy = None, Mismatch::Policy),
            (|s| template(s).driver_config = None, Mismatch::DriverConfig),
            (|s| spec(s).providers.push("gh".into()), Mismatch::Providers),
            (|s| spec(s).command.push("x".into()), Mismatch::Command),
            (
                |s| template(s).agent_socket = "/a".into(),
                Mismatch::AgentSocket,
            ),
            (
                |s| {
                    spec(s).environment.insert("A".into(), "1".into());
                },
                Mismatch::SpecEnvironment,
            ),
            (
                |s| {
                    template(s).environment.insert("A".into(), "1".into());
                },
                Mismatch::TemplateEnvironment,
            ),
            (
                |s| template(s).runtime_class_name = "kata".into(),
                Mismatch::RuntimeClassName,
            ),
            (
                |s| template(s).user_namespaces = Some(false),
                Mismatch::UserNamespaces,
            ),
            (
                |s| {
                    template(s).labels.insert("a".into(), "b".into());
                },
                Mismatch::TemplateLabels,
            ),
            (
                |s| {
                    template(s).annotations.insert("a".into(), "b".into());
                },
                Mismatch::TemplateAnnotations,
            ),
        ];
        for (tamper, want) in cases {
            let mut got = answer(&shape);
            tamper(&mut got);
            assert_eq!(sandbox(&shape, &got), Err(want));
        }
        let mut no_id = answer(&shape);
        no_id.metadata.as_mut().unwrap().id.clear();
        assert_eq!(sandbox(&shape, &no_id), Err(Mismatch::Id));
    }

    const LABEL: &str = "plimsoll.run";

    #[test]
    fn the_configuration_must_be_the_policy_sent_admitted_with_proposals_off() {
        let shape = shape();
        let hash = config(&shape, &config_answer(&shape)).unwrap();
        assert_eq!(hash, policy_hash(&shape.policy).unwrap());
        let mut bool_false = config_answer(&shape);
        bool_false.settings.insert(
            PROPOSALS_KEY.into(),
            EffectiveSetting {
                value: Some(SettingValue {
                    value: Some(setting_value::Value::BoolValue(false)),
                }),
                scope: 0,
            },
        );
        config(&shape, &bool_false).unwrap();
        type Tamper = fn(&mut GetSandboxConfigResponse);
        let cases: [(Tamper, Mismatch); 7] = [
            (
                |c| c.policy_source = PolicySource::Global.into(),
                Mismatch::PolicySource,
            ),
            (|c| c.policy_hash = "0".repeat(64), Mismatch::PolicyHash),
            (|c| c.policy = None, Mismatch::ConfigPolicy),
            (|c| c.configuration_admitted = false, Mismatch::NotAdmitted),
            (
                |c| {
                    c.settings.remove(PROPOSALS_KEY);
                },
                Mismatch::Proposals,
            ),
            (
                |c| {
                    c.settings.insert(
                        PROPOSALS_KEY.into(),
                        EffectiveSetting {
                            value: Some(SettingValue {
                                value: Some(setting_value::Value::BoolValue(true)),
                            }),
                            scope: 0,
                        },
                    );
                },
                Mismatch::Proposals,
            ),
            (
                |c| {
                    c.settings.insert(
                        PROPOSALS_KEY.into(),
                        EffectiveSetting {
                            value: Some(SettingValue {
                                value: Some(setting_value::Value::StringValue("off".into())),
                            }),
                            scope: 0,
                        },
                    );
                },
                Mismatch::Proposals,
            ),
        ];
        for (tamper, want) in cases {
            let mut got = config_answer(&shape);
            tamper(&mut got);
            assert_eq!(config(&shape, &got), Err(want));
        }
    }
}
