//! Request validation shared by the daemon and the client (wire.md §6).
//!
//! Each check returns a [`Refusal::InvalidRequest`] whose message names the
//! field and the limit it broke. The daemon runs them in the order of
//! wire.md §6.1; the client runs the same ones before sending.

use std::collections::HashSet;

use crate::payload::{Payload, PayloadKind};
use crate::refusal::{PROTOCOL, Refusal};
use crate::tier::Floor;
use crate::wire::{
    CellRun, JavaScriptRun, ModuleRun, ProjectFile, ProjectRun, SoftwareRule, run_request,
    session_run_request,
};

/// Snippet and cell code, in bytes.
pub const MAX_CODE_BYTES: usize = 256 * 1024;
/// Sum of a project's (or cell's) file contents, in bytes.
pub const MAX_PROJECT_BYTES: usize = 4 * 1024 * 1024;
/// Files in one project or cell.
pub const MAX_PROJECT_FILES: usize = 200;
/// Steps in one project (at least one).
pub const MAX_PROJECT_STEPS: usize = 20;
/// Artifacts one project may ask for.
pub const MAX_PROJECT_ARTIFACTS: usize = 100;
/// One file or artifact path, in bytes.
pub const MAX_PROJECT_PATH_BYTES: usize = 1024;
/// One step command, in bytes.
pub const MAX_PROJECT_STEP_BYTES: usize = 16 * 1024;
/// Rows in one module run (at least one).
pub const MAX_MODULE_ROWS: usize = 100_000;
/// Values in one module row (at least one).
pub const MAX_MODULE_ROW_WIDTH: usize = 64;
/// `end_time / step` of one module run.
pub const MAX_MODULE_STEPS: f64 = 1_000_000.0;
/// Worst-case size of a module result, in bytes.
pub const MAX_MODULE_RESULT_BYTES: f64 = 8.0 * 1024.0 * 1024.0;
/// One RPC message (and one HTTP request body), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// A grant profile's name, in bytes.
pub const MAX_PROFILE_NAME_BYTES: usize = 128;
/// Identities in one `approved` software rule.
pub const MAX_RULE_IDENTITIES: usize = 32;
/// One software identity, in bytes.
pub const MAX_IDENTITY_BYTES: usize = 256;
/// The daemon's hard ceiling on any run's timeout, in milliseconds.
pub const HARD_TIMEOUT_CEILING_MS: u32 = 300_000;
/// The languages a session keeps an interpreter for.
pub const LANGUAGES: [&str; 2] = ["javascript", "python"];

fn invalid(msg: impl Into<String>) -> Refusal {
    Refusal::InvalidRequest(msg.into())
}

/// Step 1: the protocol number, checked before the payload is looked at.
pub fn check_protocol(protocol: u32) -> Result<(), Refusal> {
    match protocol {
        0 => Err(Refusal::ProtocolMissing),
        PROTOCOL => Ok(()),
        other => Err(Refusal::ProtocolMismatch(other)),
    }
}

/// Step 2: the floor's syntax.
pub fn check_floor(minimum_isolation: &str) -> Result<Floor, Refusal> {
    Floor::parse(minimum_isolation).map_err(|e| invalid(e.to_string()))
}

/// Step 3: the software rule's syntax (wire.md §6.3). `None`, or an empty mode
/// with no identities, is no rule.
pub fn check_software_rule(rule: Option<&SoftwareRule>) -> Result<(), Refusal> {
    let Some(rule) = rule else { return Ok(()) };
    let n = rule.identities.len();
    match rule.mode.as_str() {
        "" if n == 0 => return Ok(()),
        "" => {
            return Err(invalid(
                "software_rule has identities but no mode: use exact or approved",
            ));
        }
        "exact" if n != 1 => {
            return Err(invalid(format!(
                "software_rule mode exact needs exactly 1 identity, got {n}"
            )));
        }
        "approved" if !(1..=MAX_RULE_IDENTITIES).contains(&n) => {
            return Err(invalid(format!(
                "software_rule mode approved needs 1 to {MAX_RULE_IDENTITIES} identities, got {n}"
            )));
        }
        "exact" | "approved" => {}
        other => {
            return Err(invalid(format!(
                "software_rule mode {other:?} is unknown: use exact or approved"
            )));
        }
    }
    let mut seen = HashSet::new();
    for id in &rule.identities {
        if id.is_empty() || id.len() > MAX_IDENTITY_BYTES {
            return Err(invalid(format!(
                "software_rule identity must be 1 to {MAX_IDENTITY_BYTES} bytes"
            )));
        }
        if !id.bytes().all(is_identity_byte) {
            return Err(invalid(
                "software_rule identity may hold only A-Z a-z 0-9 and . _ : / @ + -",
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err(invalid(format!(
                "software_rule lists identity {id:?} twice"
            )));
        }
    }
    Ok(())
}

fn is_identity_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._:/@+-".contains(&b)
}

/// Step 4 for `Run`: exactly one payload, and that payload within its rules.
/// A cell is refused: cells run only in sessions.
pub fn check_run_payload(payload: Option<&run_request::Payload>) -> Result<PayloadKind, Refusal> {
    check_payload(Payload::of_run(payload), false)
}

/// Step 4 for `SessionRun`: exactly one of javascript, project or cell.
pub fn check_session_payload(
    payload: Option<&session_run_request::Payload>,
) -> Result<PayloadKind, Refusal> {
    check_payload(Payload::of_session_run(payload), true)
}

/// Step 4: the payload within its rules, for `Run` or (`in_session`) `SessionRun`. Cells run
/// only in sessions and modules only in `Run`.
pub fn check_payload(payload: Payload<'_>, in_session: bool) -> Result<PayloadKind, Refusal> {
    match payload {
        Payload::None if in_session => Err(invalid(
            "payload must be exactly one of javascript, project or cell",
        )),
        Payload::None => Err(invalid(
            "payload must be exactly one of javascript, project or module",
        )),
        Payload::Javascript(js) => check_javascript(js).map(|()| PayloadKind::Javascript),
        Payload::Project(p) => check_project(p).map(|()| PayloadKind::Project),
        Payload::Module(_) if in_session => {
            Err(invalid("a module runs only in Run, never in a session"))
        }
        Payload::Module(m) => check_module(m).map(|()| PayloadKind::Module),
        Payload::Cell(c) if in_session => check_cell(c).map(|()| PayloadKind::Cell),
        Payload::Cell(_) => Err(invalid(
            "a cell runs only in a session: use OpenSession and SessionRun",
        )),
    }
}

fn check_code(field: &str, code: &str) -> Result<(), Refusal> {
    if code.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes, over the {MAX_CODE_BYTES} byte limit",
            code.len()
        )));
    }
    if code.contains('\0') {
        return Err(invalid(format!("{field} must not contain a NUL byte")));
    }
    Ok(())
}

/// A JavaScript snippet: non-empty code without NUL, at most 256 KiB; an
/// optional grant profile name of at most 128 bytes.
pub fn check_javascript(js: &JavaScriptRun) -> Result<(), Refusal> {
    check_code("javascript.code", &js.code)?;
    check_grant_profile_name(&js.grant_profile)
}

/// A grant profile's name: at most 128 bytes (whether it exists is the
/// broker's question, answered later).
pub fn check_grant_profile_name(name: &str) -> Result<(), Refusal> {
    if name.len() > MAX_PROFILE_NAME_BYTES {
        return Err(invalid(format!(
            "grant_profile is {} bytes, over the {MAX_PROFILE_NAME_BYTES} byte limit",
            name.len()
        )));
    }
    Ok(())
}

/// A project (wire.md §6.5): files, 1–20 steps, artifacts, each path clean
/// and relative, no duplicates, within every size limit.
pub fn check_project(p: &ProjectRun) -> Result<(), Refusal> {
    check_files("project", &p.files)?;
    if p.steps.is_empty() || p.steps.len() > MAX_PROJECT_STEPS {
        return Err(invalid(format!(
            "project needs 1 to {MAX_PROJECT_STEPS} steps, got {}",
            p.steps.len()
        )));
    }
    for (i, step) in p.steps.iter().enumerate() {
        if step.len() > MAX_PROJECT_STEP_BYTES {
            return Err(invalid(format!(
                "project.steps[{i}] is {} bytes, over the {MAX_PROJECT_STEP_BYTES} byte limit",
                step.len()
            )));
        }
        if step.contains('\0') {
            return Err(invalid(format!(
                "project.steps[{i}] must not contain a NUL byte"
            )));
        }
    }
    if p.artifacts.len() > MAX_PROJECT_ARTIFACTS {
        return Err(invalid(format!(
            "project asks for {} artifacts, over the limit of {MAX_PROJECT_ARTIFACTS}",
            p.artifacts.len()
        )));
    }
    let mut seen = HashSet::new();
    for (i, path) in p.artifacts.iter().enumerate() {
        check_path(&format!("project.artifacts[{i}]"), path)?;
        if !seen.insert(path.as_str()) {
            return Err(invalid(format!("project.artifacts lists {path:?} twice")));
        }
    }
    check_grant_profile_name(&p.grant_profile)
}

fn check_files(owner: &str, files: &[ProjectFile]) -> Result<(), Refusal> {
    if files.len() > MAX_PROJECT_FILES {
        return Err(invalid(format!(
            "{owner} has {} files, over the limit of {MAX_PROJECT_FILES}",
            files.len()
        )));
    }
    let mut total = 0usize;
    let mut seen = HashSet::new();
    for (i, f) in files.iter().enumerate() {
        check_path(&format!("{owner}.files[{i}].path"), &f.path)?;
        if !seen.insert(f.path.as_str()) {
            return Err(invalid(format!("{owner}.files lists {:?} twice", f.path)));
        }
        total = total.saturating_add(f.content.len());
    }
    if total > MAX_PROJECT_BYTES {
        return Err(invalid(format!(
            "{owner} file contents total {total} bytes, over the {MAX_PROJECT_BYTES} byte limit"
        )));
    }
    Ok(())
}

/// A file or artifact path: non-empty, at most 1024 bytes, relative, already
/// clean (no empty, `.` or `..` element, no trailing slash), no backslash and
/// no control character.
pub fn check_path(field: &str, path: &str) -> Result<(), Refusal> {
    if path.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if path.len() > MAX_PROJECT_PATH_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes, over the {MAX_PROJECT_PATH_BYTES} byte limit",
            path.len()
        )));
    }
    if path.starts_with('/') {
        return Err(invalid(format!("{field} {path:?} must be relative")));
    }
    if path.contains('\\') {
        return Err(invalid(format!(
            "{field} {path:?} must not contain a backslash"
        )));
    }
    if path.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} must not contain a control character"
        )));
    }
    for element in path.split('/') {
        match element {
            ".." => {
                return Err(invalid(format!(
                    "{field} {path:?} must not contain .. (it would leave the work directory)"
                )));
            }
            "" | "." => {
                return Err(invalid(format!(
                    "{field} {path:?} is not clean: no empty or . elements and no trailing slash"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A module run (wire.md §6.5): a model name, 1–100 000 rows of one width
/// 1–64, finite values, finite positive `end_time` and `step`, at most 10⁶
/// steps and a worst-case result within 8 MiB.
pub fn check_module(m: &ModuleRun) -> Result<(), Refusal> {
    if !is_model_name(&m.model) {
        return Err(invalid(
            "module.model must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
        ));
    }
    if m.rows.is_empty() || m.rows.len() > MAX_MODULE_ROWS {
        return Err(invalid(format!(
            "module needs 1 to {MAX_MODULE_ROWS} rows, got {}",
            m.rows.len()
        )));
    }
    let width = m.rows[0].values.len();
    if width == 0 || width > MAX_MODULE_ROW_WIDTH {
        return Err(invalid(format!(
            "module rows need 1 to {MAX_MODULE_ROW_WIDTH} values, got {width}"
        )));
    }
    for (i, row) in m.rows.iter().enumerate() {
        if row.values.len() != width {
            return Err(invalid(format!(
                "module.rows[{i}] has {} values; every row needs {width}",
                row.values.len()
            )));
        }
        if !row.values.iter().all(|v| v.is_finite()) {
            return Err(invalid(format!(
                "module.rows[{i}] holds a value that is not finite"
            )));
        }
    }
    for (name, v) in [("end_time", m.end_time), ("step", m.step)] {
        if !v.is_finite() || v <= 0.0 {
            return Err(invalid(format!("module.{name} must be finite and above 0")));
        }
    }
    let steps = m.end_time / m.step;
    if steps > MAX_MODULE_STEPS {
        return Err(invalid(format!(
            "module end_time / step is {steps}, over the limit of {MAX_MODULE_STEPS}"
        )));
    }
    let worst = 20.0 + m.rows.len() as f64 * (4.0 + 8.0 * (steps.floor() + 2.0));
    if worst > MAX_MODULE_RESULT_BYTES {
        return Err(invalid(format!(
            "module result could reach {worst} bytes, over the {MAX_MODULE_RESULT_BYTES} byte limit"
        )));
    }
    Ok(())
}

/// Whether `s` is a module's model id: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}` (wire.md §6.5).
pub fn is_model_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// A notebook cell: a known language, code as for a snippet, files as for a project.
pub fn check_cell(c: &CellRun) -> Result<(), Refusal> {
    if !LANGUAGES.contains(&c.language.as_str()) {
        return Err(invalid(format!(
            "cell.language {:?} is unknown: use javascript or python",
            c.language
        )));
    }
    check_code("cell.code", &c.code)?;
    check_files("cell", &c.files)
}

/// A trace id is kept only if it is 1–64 bytes of `[A-Za-z0-9._:-]`; any other
/// value is dropped silently (never an error, never hashed).
pub fn trace_id(s: &str) -> Option<&str> {
    let ok = (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    ok.then_some(s)
}

/// The timeout a run gets: the provider's default for zero or a negative
/// value, otherwise the request clamped to the provider's ceiling and the
/// daemon's 5-minute hard ceiling.
pub fn effective_timeout_ms(
    requested: i32,
    provider_default_ms: u32,
    provider_ceiling_ms: u32,
) -> u32 {
    let ceiling = provider_ceiling_ms.min(HARD_TIMEOUT_CEILING_MS);
    match u32::try_from(requested) {
        Ok(0) | Err(_) => provider_default_ms.min(ceiling),
        Ok(ms) => ms.min(ceiling),
    }
}

#[cfg(test)]
mod tests;
