//! Faults a test can switch on, at start (`--fault`) or at any time (`PUT /faults` on the admin
//! listener). Each one is a way the real E2B can fail that a provider has to survive.

use serde::{Deserialize, Serialize};

/// The fault switches. All off by default; `PUT /faults` replaces the whole set (fields left
/// out are off), `GET /faults` reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Faults {
    /// Create answers 201 without `envdAccessToken` (the VM is made and runs; its envd still
    /// wants a token nobody was given).
    pub create_without_envd_token: bool,
    /// Create answers 201 without `trafficAccessToken`.
    pub create_without_traffic_token: bool,
    /// Create answers 201 without `sandboxID` (the VM is made, stamped with its metadata, and
    /// runs until its timeout or a kill found by listing).
    pub create_without_sandbox_id: bool,
    /// The next N `DELETE /sandboxes/{id}` answer 500 and kill nothing; each one counts down.
    pub delete_errors: u32,
    /// Every envd request waits this long before it is handled.
    pub envd_delay_ms: u64,
    /// A process started while this is set kills its whole VM this long after it started
    /// (the stream just drops, the sandbox is gone afterwards).
    pub vm_dies_after_ms: Option<u64>,
    /// Process streams end without the Connect end-of-stream frame (flag 0x02).
    pub drop_end_frame: bool,
    /// Process streams leave out the `end` event (the end-of-stream frame still comes).
    pub drop_end_event: bool,
    /// The egress proxy ignores every sandbox's network config and lets everything out; the
    /// simulator answers `https://example.com` (and `http://`) itself with a 200, as the
    /// internet would (this machine has none).
    pub egress_allowed: bool,
    /// `PUT /sandboxes/{id}/network` drops `dnsServers` (E2B's default nameserver then
    /// applies), as a vendor that lost the field would.
    pub network_update_drops_dns_servers: bool,
}

impl Faults {
    /// Applies one `--fault NAME[=VALUE]` word.
    pub fn set(&mut self, word: &str) -> Result<(), String> {
        let (name, value) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (word, None),
        };
        let number = |v: Option<&str>| -> Result<u64, String> {
            v.ok_or(format!("--fault {name} needs =N"))?
                .parse()
                .map_err(|_| format!("--fault {name}: not a number"))
        };
        match name {
            "create-without-envd-token" => self.create_without_envd_token = true,
            "create-without-traffic-token" => self.create_without_traffic_token = true,
            "create-without-sandbox-id" => self.create_without_sandbox_id = true,
            "delete-errors" => {
                self.delete_errors = u32::try_from(number(value)?).unwrap_or(u32::MAX)
            }
            "envd-delay-ms" => self.envd_delay_ms = number(value)?,
            "vm-dies-after-ms" => self.vm_dies_after_ms = Some(number(value)?),
            "drop-end-frame" => self.drop_end_frame = true,
            "drop-end-event" => self.drop_end_event = true,
            "egress-allowed" => self.egress_allowed = true,
            "network-update-drops-dns-servers" => self.network_update_drops_dns_servers = true,
            other => return Err(format!("unknown fault {other:?}")),
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_json_name_the_same_switches() {
        let mut f = Faults::default();
        for word in ["egress-allowed", "delete-errors=2", "vm-dies-after-ms=500"] {
            f.set(word).unwrap();
        }
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["egressAllowed"], true);
        assert_eq!(json["deleteErrors"], 2);
        assert_eq!(json["vmDiesAfterMs"], 500);
        assert!(f.set("no-such-fault").is_err());
        assert!(serde_json::from_str::<Faults>(r#"{"noSuch": true}"#).is_err());
    }
}
