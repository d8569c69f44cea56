//! How the Connect API writes a sandbox and an operation (protojson: lowerCamelCase
//! names, enum value names, 64-bit integers as strings, Durations as `"40s"`,
//! Timestamps in RFC 3339, and fields at their zero value left out).

use serde_json::{Map, Value, json};

use crate::state::{OnTimeout, Operation, OperationKind, Sandbox, State, Status, rfc3339};

/// Leaves out every field at its zero value, as protojson does by default: `false`, `0`,
/// `""` and `[]` (a set message stays, even when empty).
pub fn prune(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, field) in map {
                let zero = match &field {
                    Value::Bool(b) => !b,
                    Value::Number(n) => n.as_f64() == Some(0.0),
                    Value::String(s) => s.is_empty(),
                    Value::Array(a) => a.is_empty(),
                    Value::Null => true,
                    Value::Object(_) => false,
                };
                if !zero {
                    out.insert(key, prune(field));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(prune).collect()),
        other => other,
    }
}

/// A sandbox in the Connect API (`docker.sbx.v1.Sandbox`: `core` is
/// `docker.sbx.common.v1.SandboxCore`, `cloud` is
/// `docker.sbx.extensions.cloud.v1.CloudSandbox`).
pub fn sandbox(state: &State, s: &Sandbox) -> Value {
    let platform = json!({ "os": "linux", "architecture": "amd64" });
    let mut core = json!({
        "id": s.id,
        "name": s.name,
        "status": s.status.connect_name(),
        "image": s.image_ref,
        "resources": { "cpus": s.cpus, "memoryMib": s.memory_mib.to_string() },
        "platform": platform,
        "createdAt": rfc3339(s.created_at),
    });
    if s.status == Status::Running {
        core["endpoint"] = json!({
            "uri": state.endpoint_uri(&s.id),
            "protocol": "SANDBOX_ENDPOINT_PROTOCOL_CONNECT",
            "sandboxId": s.id,
        });
    }
    let mut cloud = json!({
        "platform": platform,
        "autoResume": s.auto_resume,
        "onTimeout": match s.on_timeout {
            OnTimeout::Delete => "ON_TIMEOUT_DELETE",
            OnTimeout::Stop => "ON_TIMEOUT_STOP",
        },
    });
    if s.status == Status::Running {
        cloud["lifecycle"] = json!("CLOUD_LIFECYCLE_STATE_RUNNING");
    }
    // The booted digest is known once the sandbox booted.
    if matches!(
        s.status,
        Status::Running | Status::Stopped | Status::Stopping
    ) {
        cloud["imageDigest"] = json!(s.image_digest);
    }
    if let Some(at) = s.expires_at {
        cloud["expiresAt"] = json!(rfc3339(at));
    }
    prune(json!({ "core": core, "cloud": cloud }))
}

/// An operation (`docker.sbx.v1.Operation`); its `error` is a `google.rpc.Status`, its
/// `response` a `google.protobuf.Any`: the sandbox for a create, Empty for a delete.
pub fn operation(state: &State, op: &Operation) -> Value {
    let kind = match op.kind {
        OperationKind::Create => "OPERATION_KIND_CREATE_SANDBOX",
        OperationKind::Delete => "OPERATION_KIND_DELETE_SANDBOX",
    };
    let mut out = json!({
        "id": op.id,
        "done": op.done,
        "metadata": {
            "kind": kind,
            "target": op.sandbox_id,
            "createdAt": rfc3339(op.created_at),
            "updatedAt": rfc3339(op.updated_at),
        },
    });
    if op.done {
        match (&op.error, op.kind, &op.result) {
            (Some((code, message)), _, _) => {
                out["error"] = json!({ "code": code.number(), "message": message });
            }
            (None, OperationKind::Create, Some(sandbox_now)) => {
                let mut any = sandbox(state, sandbox_now);
                any["@type"] = json!("type.googleapis.com/docker.sbx.v1.Sandbox");
                out["response"] = any;
            }
            (None, _, _) => {
                out["response"] = json!({ "@type": "type.googleapis.com/google.protobuf.Empty" });
            }
        }
    }
    prune(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_drops_zero_values_but_keeps_set_messages() {
        let pruned =
            prune(json!({"a": false, "b": 0, "c": "", "d": [], "e": {}, "f": {"g": true}}));
        assert_eq!(pruned, json!({"e": {}, "f": {"g": true}}));
    }
}
