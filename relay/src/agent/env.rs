//! The environments children get: the base a process of the guest uid gets from the start
//! script (PATH, HOME from passwd or /, HOSTNAME), the plan's on top, and a step's shell
//! variables. Values keep their JSON type until a child starts, where they become strings as
//! node's spawn made them (so truthiness and `typeof` tests behave as in the JS).

use std::os::unix::fs::MetadataExt;

use serde_json::Value;

use super::procs;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
pub const WORK: &str = "/work";

/// Names and values in insertion order; a name set again keeps its place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Env(Vec<(String, Value)>);

impl Env {
    /// What the start script gives a process of the guest uid.
    pub fn base(guest: u32) -> Env {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let mut env = Env::default();
        env.set("PATH", Value::from(PATH));
        env.set("HOME", Value::from(home(&passwd, guest)));
        env.set(
            "HOSTNAME",
            Value::from(host.split('\n').next().unwrap_or("")),
        );
        env
    }

    pub fn set(&mut self, name: &str, value: Value) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Each pair as a string, skipping undefined ones (node's spawn).
    pub fn strings(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|(n, v)| (n.clone(), js_string(v)))
            .collect()
    }
}

/// HOME of the guest uid's passwd line, `/` when none or empty.
fn home(passwd: &str, guest: u32) -> String {
    let uid = guest.to_string();
    for line in passwd.split('\n') {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 6 && f[2] == uid {
            return if f[5].is_empty() {
                "/".to_owned()
            } else {
                f[5].to_owned()
            };
        }
    }
    "/".to_owned()
}

/// `String(value)` for what JSON can hold.
pub fn js_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => js_number_text(n),
        Value::Array(items) => items
            .iter()
            .map(|v| {
                if v.is_null() {
                    String::new()
                } else {
                    js_string(v)
                }
            })
            .collect::<Vec<_>>()
            .join(","),
        Value::Object(_) => "[object Object]".to_owned(),
    }
}

fn js_number_text(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
        _ => n.to_string(),
    }
}

/// JavaScript truthiness.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// `Number(value)`; NaN when it is not a number.
pub fn js_number(value: Option<&Value>) -> f64 {
    match value {
        None => f64::NAN,
        Some(Value::Null) => 0.0,
        Some(Value::Bool(b)) => f64::from(u8::from(*b)),
        Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
        Some(Value::String(s)) => {
            let t = s.trim();
            if t.is_empty() {
                0.0
            } else {
                t.parse().unwrap_or(f64::NAN)
            }
        }
        Some(_) => f64::NAN,
    }
}

/// The environment a step's `sh` gets: what a step started as
/// `sh -c 'cd /work || exit 127; exec sh -c "$1"'` (the runner's) saw, with one process: the
/// outer shell's cd exported PWD=/work and OLDPWD (the PWD it started with when that named
/// `/`, else `/`), and each shell added one to SHLVL.
pub fn step_env(guest: u32, env: &Env) -> Env {
    let mut old = "/".to_owned();
    if let Some(Value::String(pwd)) = env.get("PWD")
        && pwd.starts_with('/')
    {
        let named = procs::as_guest(guest, || std::fs::metadata(pwd))
            .ok()
            .and_then(Result::ok);
        if let (Some(named), Ok(root)) = (named, std::fs::metadata("/"))
            && named.dev() == root.dev()
            && named.ino() == root.ino()
        {
            old = pwd.clone();
        }
    }
    let level = match env.get("SHLVL") {
        Some(Value::String(s)) => shell_level(s),
        _ => 0.0,
    };
    let mut out = env.clone();
    out.set("PWD", Value::from(WORK));
    out.set("OLDPWD", Value::from(old));
    out.set("SHLVL", Value::from(to_int32(level + 1.0).to_string()));
    out
}

/// `parseInt` of `^\s*([+-]?[0-9]+)`, or 0.
fn shell_level(text: &str) -> f64 {
    let t = text.trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    let (sign, digits) = match t.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, t.strip_prefix('+').unwrap_or(t)),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    match digits.get(..end) {
        Some(d) if !d.is_empty() => sign * d.parse::<f64>().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// JavaScript's `x | 0`.
fn to_int32(x: f64) -> i32 {
    if !x.is_finite() {
        return 0;
    }
    let m = x.trunc().rem_euclid(4_294_967_296.0);
    // m is in [0, 2^32): the cast is exact.
    #[allow(clippy::cast_possible_truncation)]
    let bits = m as u64 as u32;
    bits.cast_signed()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn home_comes_from_the_guest_uids_passwd_line() {
        let passwd = "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\ne:x:7:7:::\n";
        assert_eq!(home(passwd, 1000), "/home/u");
        assert_eq!(home(passwd, 7), "/");
        assert_eq!(home(passwd, 5), "/");
    }

    #[test]
    fn values_become_strings_as_node_made_them() {
        assert_eq!(js_string(&json!(5)), "5");
        assert_eq!(js_string(&json!(1.5)), "1.5");
        assert_eq!(js_string(&json!(null)), "null");
        assert_eq!(js_string(&json!([1, "a", null])), "1,a,");
        assert_eq!(js_string(&json!({"a": 1})), "[object Object]");
        assert!(!truthy(&json!("")) && !truthy(&json!(0)) && truthy(&json!("x")));
        assert!(js_number(Some(&json!(" 12 "))).eq(&12.0));
        assert!(js_number(Some(&json!("x"))).is_nan());
    }

    #[test]
    fn a_step_env_counts_shell_levels_and_sets_pwd() {
        let mut env = Env::default();
        env.set("SHLVL", json!("  +4x"));
        env.set("PWD", json!("/nonexistent-dir"));
        let out = step_env(0, &env).strings();
        let get = |n: &str| out.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("SHLVL"), "5");
        assert_eq!(get("PWD"), WORK);
        assert_eq!(get("OLDPWD"), "/");
        assert_eq!(shell_level("-3"), -3.0);
        assert_eq!(shell_level("x"), 0.0);
        assert_eq!(to_int32(2_147_483_648.0), i32::MIN);
        let mut numeric = Env::default();
        numeric.set("SHLVL", json!(7));
        let out = step_env(0, &numeric).strings();
        assert!(out.contains(&("SHLVL".to_owned(), "1".to_owned())));
    }

    #[test]
    fn a_name_set_again_keeps_its_place() {
        let mut env = Env::default();
        env.set("A", json!("1"));
        env.set("B", json!("2"));
        env.set("A", json!("3"));
        assert_eq!(
            env.strings(),
            vec![
                ("A".to_owned(), "3".to_owned()),
                ("B".to_owned(), "2".to_owned())
            ]
        );
    }
}
