//! The grants file exactly as written: strict serde shapes, validated in `profile.rs`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The top level: `{"profiles": {…}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub profiles: RawProfiles,
}

/// The profiles in file order; a name given twice is refused rather than silently
/// shadowed.
#[derive(Debug, Default)]
pub(super) struct RawProfiles(pub Vec<(String, RawProfile)>);

/// One profile as written. Every field of `spec/grants.md` §1.2, no others.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawProfile {
    pub base_url: Option<String>,
    pub allow: Vec<String>,
    pub allowed_callers: Vec<String>,
    pub scopes: Vec<String>,
    pub token: Option<RawToken>,
    pub global: String,
    pub preamble: String,
    pub preamble_file: String,
    pub health_check: String,
    pub max_calls: i64,
    pub route_max_calls: BTreeMap<String, i64>,
    pub allow_in_sessions: bool,
    pub catalog: Vec<String>,
    pub batch_of: BTreeMap<String, Vec<String>>,
    pub advice: String,
    pub advice_retention: String,
}

/// The `token` object.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawToken {
    #[serde(rename = "type")]
    pub kind: String,
    pub env: String,
    pub secret_env: String,
    pub audience: String,
    pub ttl_sec: Option<i64>,
    pub issuer: String,
    pub key_id: String,
}

impl<'de> Deserialize<'de> for RawProfiles {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ProfilesVisitor)
    }
}

struct ProfilesVisitor;

impl<'de> Visitor<'de> for ProfilesVisitor {
    type Value = RawProfiles;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of profiles")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut profiles: Vec<(String, RawProfile)> = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            if profiles.iter().any(|(n, _)| *n == name) {
                return Err(serde::de::Error::custom(format!(
                    "profile {name:?} is defined twice"
                )));
            }
            let profile = map.next_value::<RawProfile>()?;
            profiles.push((name, profile));
        }
        Ok(RawProfiles(profiles))
    }
}
