//! Faults on demand: what a test can make the simulated service do wrong. The admin
//! endpoint replaces the whole set (`PUT /faults`); every field is optional and unknown
//! fields are refused, so a misspelt fault never passes silently.

use serde::{Deserialize, Serialize};

/// Which asynchronous operations never complete while the fault is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StuckOperation {
    /// A create's operation stays `done: false` and its sandbox stays CREATING (its
    /// container is made but never reported running).
    Create,
    /// A delete's operation stays `done: false`; the sandbox stays (status STOPPING).
    Delete,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// The effective network policy reads mode ALLOW_ALL (the account default is not
    /// deny-all).
    pub policy_not_deny_all: bool,
    /// One more network in every effective policy's allow list (layer OWNER), e.g.
    /// `"example.com:443"`.
    pub extra_allowed_network: Option<String>,
    /// Every sandbox reports this booted image digest instead of the image's.
    pub booted_digest: Option<String>,
    /// Every create is refused as if the account's running-sandbox quota were spent.
    pub quota_reached: bool,
    /// Operations of these kinds never complete (made while the fault is on).
    pub never_complete: Vec<StuckOperation>,
    /// `WaitOperation` answers `unimplemented`, so clients must poll `GetOperation`.
    pub wait_operation_unimplemented: bool,
    /// A REST delete answers as if it worked but leaves the sandbox running.
    pub rest_delete_keeps_sandbox: bool,
    /// `GetCapabilities` leaves these permissions out (enum names, e.g.
    /// `"PERMISSION_SANDBOXES_DELETE"`).
    pub missing_permissions: Vec<String>,
}
