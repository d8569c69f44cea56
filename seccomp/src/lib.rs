//! plimsoll's shipped seccomp profile for docker guests under runc, and a reader for profiles
//! in Docker's JSON format.
//!
//! The profile is data: `seccomp/profile.json`, embedded here as [`PROFILE_JSON`]. An operator
//! applies it with `SANDBOX_DOCKER_SECCOMP=<path to profile.json>`; plimsolld parses whatever
//! file that names with [`Profile::parse`] at startup, so a broken profile stops the daemon
//! before any container starts instead of failing every run.
//!
//! ```
//! let profile = seccomp::Profile::shipped();
//! assert_eq!(profile.verdict("read"), seccomp::Verdict::Allowed);
//! assert_eq!(profile.verdict("ptrace"), seccomp::Verdict::Default);
//! assert_eq!(profile.verdict("socket"), seccomp::Verdict::Filtered);
//! assert_eq!(profile.verdict("clone3"), seccomp::Verdict::Errno(38));
//! ```
//!
//! What this crate does not do: compile or load a filter. Docker (through runc and libseccomp)
//! does that; this crate only reads the profile so it can be checked, here and at startup.
#![forbid(unsafe_code)]

use serde::Deserialize;

/// The shipped profile, exactly as in `seccomp/profile.json`.
pub const PROFILE_JSON: &str = include_str!("../profile.json");

/// The action that lets a syscall through.
pub const ALLOW: &str = "SCMP_ACT_ALLOW";
/// The action that fails a syscall with an errno.
pub const ERRNO: &str = "SCMP_ACT_ERRNO";

/// Actions Docker's profile format accepts.
const ACTIONS: &[&str] = &[
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_TRAP",
    ERRNO,
    "SCMP_ACT_TRACE",
    ALLOW,
    "SCMP_ACT_LOG",
    "SCMP_ACT_NOTIFY",
];

/// Comparison operators Docker's profile format accepts.
const OPERATORS: &[&str] = &[
    "SCMP_CMP_NE",
    "SCMP_CMP_LT",
    "SCMP_CMP_LE",
    "SCMP_CMP_EQ",
    "SCMP_CMP_GE",
    "SCMP_CMP_GT",
    "SCMP_CMP_MASKED_EQ",
];

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Not JSON, or not the shape of a Docker profile.
    #[error("not a Docker seccomp profile: {0}")]
    Json(#[from] serde_json::Error),
    /// An action docker does not know.
    #[error("unknown action {action:?} ({context})")]
    UnknownAction {
        /// The action as written.
        action: String,
        /// Where it appears.
        context: String,
    },
    /// An argument comparison docker does not know.
    #[error("unknown argument operator {op:?} for {syscall}")]
    UnknownOperator {
        /// The operator as written.
        op: String,
        /// The rule's first syscall name.
        syscall: String,
    },
    /// A rule that names no syscall.
    #[error("syscall rule {index} names no syscall")]
    EmptyRule {
        /// The rule's position in `syscalls`.
        index: usize,
    },
    /// Syscall arguments are numbered 0 to 5.
    #[error("argument index {index} out of range for {syscall}")]
    ArgumentIndex {
        /// The index as written.
        index: u32,
        /// The rule's first syscall name.
        syscall: String,
    },
}

/// A seccomp profile in Docker's JSON format (the fields plimsoll reads; others are ignored,
/// as docker ignores them).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// What happens to a syscall no rule names.
    pub default_action: String,
    /// The errno of an `SCMP_ACT_ERRNO` default; docker uses `EPERM` when absent.
    #[serde(default)]
    pub default_errno_ret: Option<u32>,
    /// The architectures the filter is built for.
    #[serde(default)]
    pub arch_map: Vec<Architecture>,
    /// The rules, in order.
    #[serde(default)]
    pub syscalls: Vec<SyscallRule>,
}

/// One architecture and its sub-architectures.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Architecture {
    /// For example `SCMP_ARCH_X86_64`.
    pub architecture: String,
    /// For example `SCMP_ARCH_X86`.
    #[serde(default)]
    pub sub_architectures: Vec<String>,
}

/// One rule: an action for some syscalls, possibly only when their arguments match.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyscallRule {
    /// The syscalls this rule covers.
    #[serde(default)]
    pub names: Vec<String>,
    /// The action when the rule matches.
    pub action: String,
    /// The errno of an `SCMP_ACT_ERRNO` action.
    #[serde(default)]
    pub errno_ret: Option<u32>,
    /// Argument comparisons; all must hold for the rule to match.
    #[serde(default)]
    pub args: Vec<ArgumentFilter>,
    /// Why the rule exists.
    #[serde(default)]
    pub comment: Option<String>,
}

/// One argument comparison.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArgumentFilter {
    /// Which argument, 0 to 5.
    pub index: u32,
    /// The value compared (the mask for `SCMP_CMP_MASKED_EQ`).
    pub value: u64,
    /// The value the masked argument must equal, for `SCMP_CMP_MASKED_EQ`.
    #[serde(default)]
    pub value_two: u64,
    /// The comparison.
    pub op: String,
}

/// What a profile does with one syscall name, ignoring architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// An unconditional allow rule names it.
    Allowed,
    /// Only argument-filtered allow rules name it.
    Filtered,
    /// An unconditional errno rule names it (before any allow).
    Errno(u32),
    /// No rule names it: the default action applies.
    Default,
}

// === impl Profile ===

impl Profile {
    /// Parses and checks a profile: JSON of Docker's shape, known actions and operators,
    /// no empty rule, argument indexes 0 to 5.
    pub fn parse(text: &str) -> Result<Profile, SeccompError> {
        let profile: Profile = serde_json::from_str(text)?;
        check_action(&profile.default_action, "defaultAction")?;
        for (index, rule) in profile.syscalls.iter().enumerate() {
            let Some(first) = rule.names.first() else {
                return Err(SeccompError::EmptyRule { index });
            };
            check_action(&rule.action, first)?;
            for arg in &rule.args {
                if !OPERATORS.contains(&arg.op.as_str()) {
                    return Err(SeccompError::UnknownOperator {
                        op: arg.op.clone(),
                        syscall: first.clone(),
                    });
                }
                if arg.index > 5 {
                    return Err(SeccompError::ArgumentIndex {
                        index: arg.index,
                        syscall: first.clone(),
                    });
                }
            }
        }
        Ok(profile)
    }

    /// The shipped profile.
    pub fn shipped() -> Profile {
        // The embedded file is checked by this crate's tests; a parse failure here would be a
        // build of a broken tree, and the empty deny-all profile is the safe answer to it.
        Profile::parse(PROFILE_JSON).unwrap_or(Profile {
            default_action: ERRNO.to_owned(),
            default_errno_ret: Some(1),
            arch_map: Vec::new(),
            syscalls: Vec::new(),
        })
    }

    /// What the profile does with `name`: the first unconditional rule naming it decides;
    /// otherwise argument-filtered allows make it [`Verdict::Filtered`].
    pub fn verdict(&self, name: &str) -> Verdict {
        let mut filtered = false;
        for rule in self
            .syscalls
            .iter()
            .filter(|r| r.names.iter().any(|n| n == name))
        {
            match (rule.action.as_str(), rule.args.is_empty()) {
                (ALLOW, true) => return Verdict::Allowed,
                (ALLOW, false) => filtered = true,
                (ERRNO, true) => return Verdict::Errno(rule.errno_ret.unwrap_or(1)),
                _ => {}
            }
        }
        if filtered {
            Verdict::Filtered
        } else {
            Verdict::Default
        }
    }

    /// Every syscall name some allow rule names, sorted and without duplicates.
    pub fn allowed_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .syscalls
            .iter()
            .filter(|r| r.action == ALLOW)
            .flat_map(|r| r.names.iter().map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Whether the default action refuses (errno or kill) rather than allows or logs.
    pub fn denies_by_default(&self) -> bool {
        matches!(
            self.default_action.as_str(),
            ERRNO | "SCMP_ACT_KILL" | "SCMP_ACT_KILL_PROCESS" | "SCMP_ACT_KILL_THREAD"
        )
    }
}

fn check_action(action: &str, context: &str) -> Result<(), SeccompError> {
    if ACTIONS.contains(&action) {
        Ok(())
    } else {
        Err(SeccompError::UnknownAction {
            action: action.to_owned(),
            context: context.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
