//! `Describe`: the provider, its current tier and what it can run (wire.md §9).

use buffa::MessageField;
use plimsoll::refusal::PROTOCOL;
use plimsoll::validate::HARD_TIMEOUT_CEILING_MS;
use plimsoll::wire::{
    DescribeResponse, PayloadEnvironment, RunResources, SessionPool, SessionPoolSet,
};

use super::State;
use crate::provider::Environment;

/// Builds the answer. Environments and resources are always written, even
/// empty, as clients expect; session fields stay zero while sessions are off.
pub(super) fn handle(state: &State) -> DescribeResponse {
    let d = state.provider.describe();
    DescribeResponse {
        sandbox: d.sandbox.to_owned(),
        isolation: state.current_tier().as_str().to_owned(),
        protocol: PROTOCOL,
        supports_project: d.supports_project,
        supports_module: d.supports_module,
        supports_javascript_grants: d.supports_javascript_grants,
        supports_project_grants: d.supports_project_grants,
        javascript_environment: MessageField::some(environment(&d.javascript)),
        project_environment: MessageField::some(environment(&d.project)),
        module_environment: MessageField::some(environment(&d.module)),
        resources: MessageField::some(RunResources {
            memory_mb: state.resources.memory_mb,
            cpus: state.resources.cpus,
            pids: state.resources.pids,
            disk_mb: state.resources.disk_mb,
            ..Default::default()
        }),
        policy: d.policy.clone(),
        ..session_fields(state, &d)
    }
}

/// The session settings, stated only when sessions are on and the provider keeps them.
fn session_fields(state: &State, d: &crate::provider::Description) -> DescribeResponse {
    let c = state.sessions.config();
    if !c.enabled() || !d.supports_sessions {
        return DescribeResponse::default();
    }
    let ms = |t: std::time::Duration| u32::try_from(t.as_millis()).unwrap_or(u32::MAX);
    DescribeResponse {
        supports_sessions: true,
        session_lifetime_ms: ms(c.lifetime),
        session_idle_timeout_ms: ms(c.idle),
        session_environment: MessageField::some(environment(&d.session)),
        max_sessions_per_caller: c.per_caller,
        max_sessions_per_owner: c.per_owner,
        session_pool: state
            .provider
            .session_pool()
            .map_or_else(MessageField::none, |p| MessageField::some(session_pool(p))),
        ..Default::default()
    }
}

/// The warm pool: its size, members per warm language set, claims and misses.
fn session_pool(p: crate::provider::PoolStatus) -> SessionPool {
    SessionPool {
        size: p.size,
        warm: p
            .warm
            .into_iter()
            .map(|(languages, members)| SessionPoolSet {
                languages,
                members,
                ..Default::default()
            })
            .collect(),
        claims: p.claims,
        misses: p.misses,
        ..Default::default()
    }
}

fn environment(e: &Environment) -> PayloadEnvironment {
    PayloadEnvironment {
        identity: e.identity.clone(),
        // Describe never promises more than the daemon's hard ceiling.
        max_timeout_ms: e.max_timeout_ms.min(HARD_TIMEOUT_CEILING_MS),
        software_identity: e.software_identity.clone(),
        languages: e.languages.clone(),
        ..Default::default()
    }
}
