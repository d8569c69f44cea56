#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use super::*;
use crate::config::Config;

/// `/proc/mounts` of a snippet container under runc on this kind of machine (cgroup v1).
const RUNC_MOUNTS: &str = "\
overlay / overlay ro,relatime,lowerdir=/var/lib/docker/overlay2/l/A:/var/lib/docker/overlay2/l/B 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev tmpfs rw,nosuid,size=65536k,mode=755 0 0
sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0
cgroup /sys/fs/cgroup/pids cgroup ro,nosuid,nodev,noexec,relatime,pids 0 0
mqueue /dev/mqueue mqueue rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev,noexec,relatime,size=16384k 0 0
/dev/vda /etc/hosts ext4 ro,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=16384k 0 0
tmpfs /proc/keys tmpfs rw,nosuid,size=65536k,mode=755 0 0
";

/// The same under runsc (gVisor lists options as given, and no nosuid).
const RUNSC_MOUNTS: &str = "\
none / 9p ro,trans=fd,rfdno=4,wfdno=4,aname=/,cache=fscache 0 0
none /dev tmpfs rw,mode=0755 0 0
none /sys sysfs ro,noexec,dentry_cache_limit=1000 0 0
none /tmp tmpfs rw,noexec,size=16m 0 0
none /proc proc rw,noexec,dentry_cache_limit=1000 0 0
none /dev/shm tmpfs rw,noexec,size=16m 0 0
none /etc/hosts 9p ro,trans=fd,rfdno=7,wfdno=7,aname=/ 0 0
";

fn settings(runtime: &str) -> Settings {
    let env: HashMap<String, String> = [
        ("SANDBOX_PROVIDER", "docker"),
        ("PLIMSOLL_INSECURE", "1"),
        ("SANDBOX_DOCKER_RUNTIME", runtime),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Settings::from_config(&Config::from_env(&env).unwrap()).unwrap()
}

fn report(mounts: &str, runsc: bool) -> ProbeReport {
    ProbeReport {
        root_write: if runsc { "EACCES" } else { "EROFS" }.into(),
        mounts: mounts.into(),
        writable: vec!["/tmp".into(), "/dev/shm".into()],
        pids_max: (!runsc).then(|| "256".into()),
        nproc: Some(if runsc { "256" } else { "unlimited" }.into()),
        core: Some("0".into()),
        nofile: Some("4096".into()),
        status: ProbeIdentity {
            uid: vec!["61000".into(); 4],
            gid: vec!["61000".into(); 4],
            groups: vec!["61000".into()],
        },
        interfaces: vec!["lo".into()],
        socket: "pong".into(),
    }
}

fn check(r: &ProbeReport, runtime: &str) -> Result<(), &'static str> {
    judge(r, &settings(runtime), false).map_err(|(check, _)| check)
}

#[test]
fn real_mount_tables_of_both_runtimes_pass() {
    check(&report(RUNC_MOUNTS, false), "").unwrap();
    check(&report(RUNSC_MOUNTS, true), "runsc").unwrap();
}

#[test]
fn each_failed_check_is_named() {
    let mut r = report(RUNC_MOUNTS, false);
    r.socket = "error: ECONNREFUSED".into();
    assert_eq!(check(&r, ""), Err("host socket"));

    let mut r = report(RUNC_MOUNTS, false);
    r.root_write = "ok".into();
    assert_eq!(check(&r, ""), Err("read-only root"));
    let r = report(
        &RUNC_MOUNTS.replacen(" ro,relatime,lowerdir", " rw,relatime,lowerdir", 1),
        false,
    );
    assert_eq!(check(&r, ""), Err("read-only root"));

    let mut r = report(RUNC_MOUNTS, false);
    r.interfaces.push("eth0".into());
    assert_eq!(check(&r, ""), Err("network none"));

    let mut r = report(RUNC_MOUNTS, false);
    r.status.groups.push("0".into());
    assert_eq!(check(&r, ""), Err("guest uid"));

    let mut r = report(RUNC_MOUNTS, false);
    r.pids_max = Some("max".into());
    assert_eq!(check(&r, ""), Err("pids limit"));
    let mut r = report(RUNSC_MOUNTS, true);
    r.nproc = Some("unlimited".into());
    assert_eq!(check(&r, "runsc"), Err("pids limit"));

    let mut r = report(RUNC_MOUNTS, false);
    r.core = Some("unlimited".into());
    assert_eq!(check(&r, ""), Err("rlimits"));

    let r = report(
        &RUNC_MOUNTS.replace("noexec,relatime,size=16384k", "relatime,size=16384k"),
        false,
    );
    assert_eq!(check(&r, ""), Err("tmpfs mounts"));
    let r = report(
        &RUNC_MOUNTS.replacen("size=16384k", "size=65536k", 1),
        false,
    );
    assert_eq!(check(&r, ""), Err("tmpfs mounts"));
    // Under runc nosuid must be listed.
    let r = report(
        &RUNC_MOUNTS.replace(
            "rw,nosuid,nodev,noexec,relatime,size",
            "rw,nodev,noexec,relatime,size",
        ),
        false,
    );
    assert_eq!(check(&r, ""), Err("tmpfs mounts"));

    let mut r = report(RUNC_MOUNTS, false);
    r.writable.push("/dev/mqueue".into());
    assert_eq!(check(&r, ""), Err("writable set"));
    let mut r = report(RUNC_MOUNTS, false);
    r.writable.pop();
    assert_eq!(check(&r, ""), Err("writable set"));
}

#[test]
fn work_is_checked_when_promised() {
    let s = settings("");
    let r = report(RUNC_MOUNTS, false);
    assert_eq!(judge(&r, &s, true).unwrap_err().0, "tmpfs mounts");
    let mut r = report(
        &format!(
            "{RUNC_MOUNTS}tmpfs /work tmpfs rw,nosuid,nodev,noexec,relatime,size=131072k 0 0\n"
        ),
        false,
    );
    r.writable.push("/work".into());
    judge(&r, &s, true).unwrap();
}

#[test]
fn sizes_read_as_the_kernel_or_gvisor_write_them() {
    assert_eq!(size_bytes("size=16384k"), Some(16 << 20));
    assert_eq!(size_bytes("size=16m"), Some(16 << 20));
    assert_eq!(size_bytes("size=1g"), Some(1 << 30));
    assert_eq!(size_bytes("size=4096"), Some(4096));
    assert_eq!(size_bytes("size=x"), None);
    assert_eq!(size_bytes("mode=1777"), None);
}

#[test]
fn mount_points_are_unescaped() {
    assert_eq!(unescape_octal("/a\\040b"), "/a b");
    assert_eq!(unescape_octal("/a\\777"), "/a?");
    assert_eq!(unescape_octal("/a\\04"), "/a\\04");
}

#[test]
fn the_pids_cgroup_must_name_the_container() {
    let id = "abc123";
    let v1 = "12:pids:/docker/abc123\n11:memory:/docker/abc123\n";
    assert_eq!(
        pids_cgroup_file(v1, id).unwrap(),
        PathBuf::from("/sys/fs/cgroup/pids/docker/abc123/pids.max")
    );
    let v2 = "0::/system.slice/docker-abc123.scope\n";
    assert_eq!(
        pids_cgroup_file(v2, id).unwrap(),
        PathBuf::from("/sys/fs/cgroup/system.slice/docker-abc123.scope/pids.max")
    );
    assert!(
        pids_cgroup_file("12:pids:/\n", id)
            .unwrap_err()
            .contains("does not name")
    );
    assert!(pids_cgroup_file("3:cpu:/docker/abc123\n", id).is_err());
}

#[test]
fn a_runtime_path_resolves_absolute_or_on_path_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("runsc");
    std::fs::write(&binary, b"").unwrap();
    assert_eq!(
        resolve_binary(binary.to_str().unwrap()),
        Some(binary.clone())
    );
    assert_eq!(
        resolve_binary(dir.path().join("absent").to_str().unwrap()),
        None
    );
    assert_eq!(
        resolve_binary(dir.path().to_str().unwrap()),
        None,
        "a directory"
    );
    // A bare name is looked up on PATH (sh is on every PATH these tests run with).
    assert!(resolve_binary("sh").is_some_and(|p| p.is_absolute()));
    assert_eq!(resolve_binary("plimsoll-no-such-runtime"), None);
}

#[test]
fn the_sandbox_process_must_be_the_registered_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("runsc");
    std::fs::write(&real, b"x").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(same_file(&link, &real), Ok(()), "a link to it is it");
    // A process running another binary (this test) is refused, naming what it runs.
    let other = same_file(Path::new("/proc/self/exe"), &real).unwrap_err();
    assert!(other.starts_with("it runs /"), "{other}");
}
