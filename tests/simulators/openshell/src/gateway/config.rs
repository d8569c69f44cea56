//! `GetSandboxConfig`: the policy in force (the one the sandbox was created with), its hash
//! as the gateway computes it, and every registered setting, present with no value when
//! unset (so `agent_policy_proposals_enabled` is "off" by having no value).

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tonic::Status;

use super::{State, workspace};
use crate::faults::{PROPOSALS_KEY, tamper_config};
use crate::policy_hash::policy_hash;
use crate::proto::sandbox::v1::{
    EffectiveSetting, GetSandboxConfigRequest, GetSandboxConfigResponse, PolicySource, SettingScope,
};

/// The settings a gateway registers; each is reported, unset ones with no value.
const REGISTERED_SETTINGS: [&str; 4] = [
    "providers_v2_enabled",
    "ocsf_json_enabled",
    PROPOSALS_KEY,
    "proposal_approval_mode",
];

pub fn get(
    state: &Arc<State>,
    req: GetSandboxConfigRequest,
) -> Result<GetSandboxConfigResponse, Status> {
    let ws = workspace(&req.workspace_scope)?;
    if req.name.is_empty() {
        return Err(Status::invalid_argument("name is required"));
    }
    let entry = state
        .entry(&req.name)
        .ok_or_else(|| Status::not_found("sandbox not found"))?;
    let spec = entry.sandbox.spec.clone().unwrap_or_default();
    let policy = spec.policy;
    let hash = policy.as_ref().map(policy_hash).unwrap_or_default();
    let settings: BTreeMap<String, EffectiveSetting> = REGISTERED_SETTINGS
        .iter()
        .map(|key| {
            let unset = EffectiveSetting {
                value: None,
                scope: SettingScope::Unspecified.into(),
            };
            ((*key).to_owned(), unset)
        })
        .collect();
    // A fingerprint of what the sandbox runs with, stable while nothing changes.
    let revision = Sha256::digest(format!("{hash}|{ws}|{}", entry.configuration_instance_id));
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&revision[..8]);
    let mut config = GetSandboxConfigResponse {
        version: u32::from(policy.is_some()),
        policy,
        policy_hash: hash,
        settings,
        config_revision: u64::from_le_bytes(bytes),
        policy_source: PolicySource::Sandbox.into(),
        global_policy_version: 0,
        provider_env_revision: 0,
        supervisor_middleware_services: Vec::new(),
        workspace: ws,
        policy_validation_failure_mode: "fail_closed".into(),
        extension_authentication_enabled: false,
        configuration_admitted: entry.ever_ready,
        provider_attachment_epoch: spec.provider_attachment_epoch,
        configuration_instance_id: entry.configuration_instance_id.clone(),
        configuration_error: String::new(),
        settings_revision: 0,
    };
    tamper_config(&mut config, &state.faults().config);
    Ok(config)
}
