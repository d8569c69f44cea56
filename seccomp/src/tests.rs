#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// The syscalls of the "Withheld" table in this crate's README.
fn withheld_table() -> Vec<String> {
    let readme = include_str!("../README.md");
    let table = readme
        .split("## Withheld")
        .nth(1)
        .expect("README has a Withheld section");
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn shipped_profile_parses() {
    let profile = Profile::parse(PROFILE_JSON).unwrap();
    assert!(!profile.syscalls.is_empty());
}

#[test]
fn default_is_eperm_for_everything_not_named() {
    let profile = Profile::shipped();
    assert_eq!(profile.default_action, "SCMP_ACT_ERRNO");
    assert_eq!(profile.default_errno_ret, Some(1));
    assert!(profile.denies_by_default());
}

#[test]
fn architectures_are_x86_64_and_aarch64_with_their_compat_modes() {
    let profile = Profile::shipped();
    let arches: Vec<(&str, Vec<&str>)> = profile
        .arch_map
        .iter()
        .map(|a| {
            (
                a.architecture.as_str(),
                a.sub_architectures.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        arches,
        [
            ("SCMP_ARCH_X86_64", vec!["SCMP_ARCH_X86", "SCMP_ARCH_X32"]),
            ("SCMP_ARCH_AARCH64", vec!["SCMP_ARCH_ARM"]),
        ]
    );
}

#[test]
fn every_withheld_syscall_of_the_readme_has_no_allow_rule() {
    let profile = Profile::shipped();
    let withheld = withheld_table();
    assert!(
        withheld.len() > 60,
        "the README table was not read: {withheld:?}"
    );
    let allowed = profile.allowed_names();
    for name in &withheld {
        assert!(
            !allowed.contains(&name.as_str()),
            "{name} is withheld by the README but allowed by profile.json"
        );
        assert_eq!(profile.verdict(name), Verdict::Default, "{name}");
    }
    for must in [
        "ptrace",
        "unshare",
        "mount",
        "keyctl",
        "io_uring_setup",
        "bpf",
        "setns",
    ] {
        assert!(
            withheld.iter().any(|w| w == must),
            "{must} missing from the table"
        );
    }
}

#[test]
fn what_node_python_and_a_shell_need_is_allowed() {
    let profile = Profile::shipped();
    for name in [
        "read",
        "write",
        "openat",
        "mmap",
        "mprotect",
        "futex",
        "epoll_wait",
        "execve",
        "wait4",
        "pipe2",
        "kill",
        "tgkill",
        "memfd_create",
        "inotify_init1",
        "timerfd_create",
        "getrandom",
        "rt_sigaction",
        "connect",
        "statx",
        "sched_setaffinity",
        "ioctl",
        "setuid",
    ] {
        assert_eq!(profile.verdict(name), Verdict::Allowed, "{name}");
    }
}

fn rules_for<'a>(profile: &'a Profile, name: &str) -> Vec<&'a SyscallRule> {
    profile
        .syscalls
        .iter()
        .filter(|r| r.names.iter().any(|n| n == name))
        .collect()
}

#[test]
fn sockets_are_unix_only() {
    let profile = Profile::shipped();
    for name in ["socket", "socketpair"] {
        assert_eq!(profile.verdict(name), Verdict::Filtered, "{name}");
        let rules = rules_for(&profile, name);
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].args,
            [ArgumentFilter {
                index: 0,
                value: 1,
                value_two: 0,
                op: "SCMP_CMP_EQ".into()
            }]
        );
    }
}

#[test]
fn clone_refuses_every_namespace_flag_and_clone3_falls_back() {
    let profile = Profile::shipped();
    let rules = rules_for(&profile, "clone");
    assert_eq!(rules.len(), 1);
    let arg = &rules[0].args[0];
    assert_eq!(
        (arg.index, arg.op.as_str(), arg.value_two),
        (0, "SCMP_CMP_MASKED_EQ", 0)
    );
    // CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
    for flag in [
        0x0002_0000u64,
        0x0200_0000,
        0x0400_0000,
        0x0800_0000,
        0x1000_0000,
        0x2000_0000,
        0x4000_0000,
    ] {
        assert_ne!(arg.value & flag, 0, "{flag:#x} not in the mask");
    }
    // Threads (CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|…) pass.
    assert_eq!(0x003d_0f00 & arg.value, 0);
    assert_eq!(profile.verdict("clone3"), Verdict::Errno(38));
}

#[test]
fn mknod_makes_fifos_only_and_personality_two_values() {
    let profile = Profile::shipped();
    for (name, index) in [("mknod", 1), ("mknodat", 2)] {
        let rules = rules_for(&profile, name);
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(
            rules[0].args,
            [ArgumentFilter {
                index,
                value: 0o170000,
                value_two: 0o010000,
                op: "SCMP_CMP_MASKED_EQ".into()
            }]
        );
    }
    let values: Vec<u64> = rules_for(&profile, "personality")
        .iter()
        .map(|r| r.args[0].value)
        .collect();
    assert_eq!(values, [0, 0xffff_ffff]);
}

#[test]
fn no_rule_is_empty_and_no_name_is_allowed_twice_unconditionally() {
    let profile = Profile::shipped();
    let mut seen = std::collections::HashSet::new();
    for rule in profile.syscalls.iter().filter(|r| r.args.is_empty()) {
        for name in &rule.names {
            assert!(seen.insert(name.as_str()), "{name} listed twice");
        }
    }
}

#[test]
fn parse_refuses_what_docker_would_refuse() {
    assert!(matches!(Profile::parse("{"), Err(SeccompError::Json(_))));
    assert!(matches!(
        Profile::parse(r#"{"defaultAction":"SCMP_ACT_NOPE"}"#),
        Err(SeccompError::UnknownAction { .. })
    ));
    assert!(matches!(
        Profile::parse(
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":[],"action":"SCMP_ACT_ALLOW"}]}"#
        ),
        Err(SeccompError::EmptyRule { index: 0 })
    ));
    assert!(matches!(
        Profile::parse(
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["x"],"action":"SCMP_ACT_ALLOW","args":[{"index":6,"value":1,"op":"SCMP_CMP_EQ"}]}]}"#
        ),
        Err(SeccompError::ArgumentIndex { index: 6, .. })
    ));
    assert!(matches!(
        Profile::parse(
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["x"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":1,"op":"EQ"}]}]}"#
        ),
        Err(SeccompError::UnknownOperator { .. })
    ));
    let allow_all = Profile::parse(r#"{"defaultAction":"SCMP_ACT_ALLOW"}"#).unwrap();
    assert!(!allow_all.denies_by_default());
}
