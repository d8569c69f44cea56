//! One profile, validated (`spec/grants.md` §1.2–1.6). Every check runs at load, so a
//! registry only ever holds profiles that are fully usable.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Component, Path};

use super::raw::{RawProfile, RawToken};
use super::route::Route;
use super::{Environment, Origin, Profile, TokenSpec, is_token_text};

/// Longest profile name (`MaxProfileNameBytes`).
pub const MAX_PROFILE_NAME_BYTES: usize = 128;
/// Call budget when `max_calls` is 0 (`DefaultMaxHostCalls`).
pub const DEFAULT_MAX_CALLS: u32 = 256;
/// Largest `max_calls` and route cap (`MaxHostCallsCeiling`).
pub const MAX_CALLS_CEILING: i64 = 100_000;
/// JWT lifetime when `ttl_sec` is absent or 0.
pub const DEFAULT_TTL_SEC: u64 = 60;
/// Longest JWT lifetime a profile may ask for.
pub const MAX_TTL_SEC: i64 = 86_400;
/// Shortest JWT secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest JS global name.
const MAX_GLOBAL_BYTES: usize = 64;

/// Checks a profile name: 1–128 bytes of `[A-Za-z0-9._-]`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the profile name is empty".into());
    }
    if name.trim() != name {
        return Err("the profile name has surrounding whitespace".into());
    }
    if name.len() > MAX_PROFILE_NAME_BYTES {
        return Err(format!(
            "the profile name is over {MAX_PROFILE_NAME_BYTES} bytes"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("the profile name has a character outside [A-Za-z0-9._-]".into());
    }
    Ok(())
}

/// Validates one raw profile. `dir` is the grants file's directory (for `preamble_file`).
pub(super) fn validate(
    name: &str,
    raw: RawProfile,
    dir: &Path,
    env: &dyn Environment,
) -> Result<Profile, String> {
    check_name(name)?;
    let origin = check_base_url(raw.base_url.as_deref())?;
    let allow = parse_routes("allow", &raw.allow)?;
    let callers = check_callers(&raw.allowed_callers)?;
    for scope in &raw.scopes {
        check_scope(scope)?;
    }
    let token = match raw.token {
        None => TokenSpec::None,
        Some(token) => check_token(token, env)?,
    };
    let global = check_global(&raw.global)?;
    let preamble = match (raw.preamble.is_empty(), raw.preamble_file.is_empty()) {
        (_, true) => raw.preamble,
        (true, false) => read_preamble(&raw.preamble_file, dir)?,
        (false, false) => return Err("both preamble and preamble_file are set".into()),
    };
    let health_check = check_health(&raw.health_check)?;
    let max_calls = match raw.max_calls {
        0 => DEFAULT_MAX_CALLS,
        n @ 1..=MAX_CALLS_CEILING => n as u32,
        n => {
            return Err(format!(
                "max_calls {n} is out of range 0..={MAX_CALLS_CEILING}"
            ));
        }
    };
    let route_caps = check_caps(&raw.route_max_calls, &allow)?;
    let catalog = parse_routes("catalog", &raw.catalog)?;
    check_batches(&raw.batch_of)?;
    check_choice("advice", &raw.advice, &["off", "operator", "caller"])?;
    check_choice(
        "advice_retention",
        &raw.advice_retention,
        &["none", "aggregate", "detailed"],
    )?;
    Ok(Profile {
        name: name.to_owned(),
        origin,
        allow,
        callers,
        scopes: raw.scopes,
        token,
        global,
        preamble,
        health_check,
        max_calls,
        route_caps,
        allow_in_sessions: raw.allow_in_sessions,
        catalog,
    })
}

/// `base_url`: an origin only, https, or http on loopback.
fn check_base_url(base_url: Option<&str>) -> Result<Origin, String> {
    let raw = base_url
        .filter(|s| !s.is_empty())
        .ok_or("base_url is missing")?;
    // The value is never echoed: a query, user information or a malformed scheme may hold
    // a credential, and these refusals reach the log.
    let (scheme, authority) = raw
        .split_once("://")
        .ok_or("base_url is not a URL with a host")?;
    if authority.contains(['/', '?', '#']) {
        return Err(
            "base_url is not an origin (no path, not even `/`, query or fragment)".to_owned(),
        );
    }
    if authority.contains('@') {
        return Err("base_url has user information".to_owned());
    }
    let url = url::Url::parse(raw).map_err(|e| format!("base_url: {e}"))?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("base_url has no host")?
        .to_owned();
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "https" => {}
        "http" if is_loopback(&host) => {}
        "http" => {
            return Err(format!(
                "base_url http://{host}: plain http is allowed only for localhost or a loopback IP"
            ));
        }
        _ => return Err("base_url: the scheme must be https".to_owned()),
    }
    let port = url.port_or_known_default().ok_or("base_url has no port")?;
    Ok(Origin { scheme, host, port })
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn parse_routes(field: &str, entries: &[String]) -> Result<Vec<Route>, String> {
    let mut routes: Vec<Route> = Vec::with_capacity(entries.len());
    for entry in entries {
        let route = Route::parse(entry).map_err(|e| format!("{field}: {e}"))?;
        if routes.iter().any(|r| r.template() == route.template()) {
            return Err(format!("{field}: duplicate route {:?}", route.template()));
        }
        routes.push(route);
    }
    Ok(routes)
}

fn check_callers(callers: &[String]) -> Result<super::Callers, String> {
    if callers.is_empty() {
        return Err("allowed_callers is empty (name at least one caller, or \"*\")".into());
    }
    let mut seen = BTreeSet::new();
    for caller in callers {
        let id = caller.trim();
        if id.is_empty() {
            return Err("allowed_callers has an empty entry".into());
        }
        if !seen.insert(id.to_owned()) {
            return Err(format!("allowed_callers lists {id:?} twice"));
        }
    }
    if seen.contains("*") {
        Ok(super::Callers::Any)
    } else {
        Ok(super::Callers::Only(seen))
    }
}

fn check_scope(scope: &str) -> Result<(), String> {
    if scope.is_empty() {
        return Err("scopes has an empty entry".into());
    }
    if scope.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("scope {scope:?} contains whitespace"));
    }
    if scope == "code:run" || scope == "*" {
        return Err(format!("scope {scope:?} is forbidden"));
    }
    Ok(())
}

fn check_token(raw: RawToken, env: &dyn Environment) -> Result<TokenSpec, String> {
    match raw.kind.as_str() {
        "" | "static" => {
            if !raw.secret_env.is_empty()
                || !raw.audience.is_empty()
                || raw.ttl_sec.is_some()
                || !raw.issuer.is_empty()
                || !raw.key_id.is_empty()
            {
                return Err("token: a static token takes only `env`".into());
            }
            if raw.env.is_empty() {
                return Err("token: a static token needs `env`".into());
            }
            let value = env.var(&raw.env).unwrap_or_default();
            if value.is_empty() {
                return Err(format!(
                    "token: environment variable {} is unset or empty",
                    raw.env
                ));
            }
            if !is_token_text(&value) {
                return Err(format!(
                    "token: environment variable {} must hold only bytes 0x21-0x7e",
                    raw.env
                ));
            }
            Ok(TokenSpec::Static { bearer: value })
        }
        "jwt" => {
            if !raw.env.is_empty() {
                return Err("token: a jwt token takes `secret_env`, not `env`".into());
            }
            if raw.secret_env.is_empty() {
                return Err("token: a jwt token needs `secret_env`".into());
            }
            let secret = env.var(&raw.secret_env).unwrap_or_default();
            if secret.is_empty() {
                return Err(format!(
                    "token: environment variable {} is unset or empty",
                    raw.secret_env
                ));
            }
            if secret.len() < MIN_SECRET_BYTES {
                return Err(format!(
                    "token: the secret in {} is under {MIN_SECRET_BYTES} bytes",
                    raw.secret_env
                ));
            }
            if raw.audience.trim().is_empty() {
                return Err("token: a jwt token needs a non-blank `audience`".into());
            }
            let ttl_sec = match raw.ttl_sec {
                None | Some(0) => DEFAULT_TTL_SEC,
                Some(n @ 1..=MAX_TTL_SEC) => n as u64,
                Some(n) => {
                    return Err(format!(
                        "token: ttl_sec {n} is out of range 0..={MAX_TTL_SEC}"
                    ));
                }
            };
            Ok(TokenSpec::Jwt {
                secret: secret.into_bytes(),
                audience: raw.audience,
                ttl_sec,
                issuer: Some(raw.issuer).filter(|s| !s.is_empty()),
                key_id: Some(raw.key_id).filter(|s| !s.is_empty()),
            })
        }
        other => Err(format!("token: unknown type {other:?} (static or jwt)")),
    }
}

/// The JS global: `""` means `host`; otherwise a plain JS identifier, because plimsolld
/// writes it into the guest's client code.
fn check_global(global: &str) -> Result<String, String> {
    if global.is_empty() {
        return Ok("host".into());
    }
    let mut bytes = global.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b'$');
    if !first_ok
        || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
        || global.len() > MAX_GLOBAL_BYTES
    {
        return Err(format!(
            "global {global:?} is not a JavaScript identifier of at most {MAX_GLOBAL_BYTES} bytes"
        ));
    }
    Ok(global.to_owned())
}

/// The largest `preamble_file`: it is read at every reload and sent before every granted
/// run's code.
pub const MAX_PREAMBLE_BYTES: u64 = 1024 * 1024;

/// Reads `preamble_file`, which must stay inside the grants file's directory both
/// lexically and after resolving symlinks.
fn read_preamble(file: &str, dir: &Path) -> Result<String, String> {
    let relative = Path::new(file);
    let mut depth = 0i32;
    for component in relative.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => depth -= 1,
            Component::RootDir | Component::Prefix(_) => depth = -1,
        }
        if depth < 0 {
            return Err(format!(
                "preamble_file {file:?} leaves the grants file's directory"
            ));
        }
    }
    let unreadable = |e: std::io::Error| format!("preamble_file {file:?} is unreadable: {e}");
    let root = dir.canonicalize().map_err(unreadable)?;
    let resolved = root.join(relative).canonicalize().map_err(unreadable)?;
    if !resolved.starts_with(&root) {
        return Err(format!(
            "preamble_file {file:?} leaves the grants file's directory through a symlink"
        ));
    }
    let bytes = super::read_capped(&resolved, MAX_PREAMBLE_BYTES)
        .map_err(unreadable)?
        .ok_or_else(|| {
            format!("preamble_file {file:?} is larger than {MAX_PREAMBLE_BYTES} bytes")
        })?;
    String::from_utf8(bytes).map_err(|_| format!("preamble_file {file:?} is not UTF-8 text"))
}

fn check_health(health: &str) -> Result<Option<Route>, String> {
    if health.is_empty() {
        return Ok(None);
    }
    let route = Route::parse(health).map_err(|e| format!("health_check: {e}"))?;
    if route.method() != "GET" {
        return Err("health_check must be a GET".into());
    }
    if route.has_wildcard() {
        return Err("health_check must be a concrete path (no `*`)".into());
    }
    Ok(Some(route))
}

fn check_caps(
    caps: &std::collections::BTreeMap<String, i64>,
    allow: &[Route],
) -> Result<Vec<(usize, u32)>, String> {
    let mut out = Vec::with_capacity(caps.len());
    for (key, value) in caps {
        let route = Route::parse(key).map_err(|e| format!("route_max_calls: {e}"))?;
        let index = allow
            .iter()
            .position(|r| r.template() == route.template())
            .ok_or_else(|| format!("route_max_calls: {key:?} is not an allow entry"))?;
        let cap = match *value {
            n @ 1..=MAX_CALLS_CEILING => n as u32,
            n => {
                return Err(format!(
                    "route_max_calls: {key:?} cap {n} is out of range 1..={MAX_CALLS_CEILING}"
                ));
            }
        };
        if let Some(wider) = allow.iter().find(|other| allow[index].widened_by(other)) {
            return Err(format!(
                "route_max_calls: the cap on {key:?} is widened by the wildcard entry {:?}",
                wider.template()
            ));
        }
        out.push((index, cap));
    }
    Ok(out)
}

/// `batch_of` (advisor input, unused here but checked): GET on both sides, each served
/// route has a `*`, no route serves itself, no served route is claimed twice.
fn check_batches(batches: &std::collections::BTreeMap<String, Vec<String>>) -> Result<(), String> {
    let mut claimed = BTreeSet::new();
    for (batch, served) in batches {
        let batch_route = Route::parse(batch).map_err(|e| format!("batch_of: {e}"))?;
        if batch_route.method() != "GET" {
            return Err(format!("batch_of: {batch:?} must be a GET"));
        }
        for entry in served {
            let route = Route::parse(entry).map_err(|e| format!("batch_of: {e}"))?;
            if route.method() != "GET" {
                return Err(format!("batch_of: served route {entry:?} must be a GET"));
            }
            if !route.has_wildcard() {
                return Err(format!(
                    "batch_of: served route {entry:?} has no `*` segment"
                ));
            }
            if route.template() == batch_route.template() {
                return Err(format!("batch_of: {batch:?} cannot serve itself"));
            }
            if !claimed.insert(route.template().to_owned()) {
                return Err(format!(
                    "batch_of: served route {entry:?} is claimed by two batch routes"
                ));
            }
        }
    }
    Ok(())
}

fn check_choice(field: &str, value: &str, allowed: &[&str]) -> Result<(), String> {
    if value.is_empty() || allowed.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{field} {value:?} is unknown (one of {})",
            allowed.join(", ")
        ))
    }
}
