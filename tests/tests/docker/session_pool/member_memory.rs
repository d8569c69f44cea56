//! What an idle pool member costs in memory, measured from the host: every host process that
//! belongs to the member's container (under runc the processes `docker top` names; under either
//! runtime every process whose command line names the container: its shim, and under runsc its
//! sandbox, its gofer and the sandbox's stub processes, which run the guest's code), each read
//! from `/proc/<pid>/smaps_rollup` and named by what it is.
//!
//! PSS divides each shared page among every process on the host that maps it: the text of node,
//! python and the shim is shared with the other members (and any other container of the same
//! image), so a member's PSS falls as more of them run. Private (USS) is what the member's
//! removal frees at least. Under runsc the guest's memory lives in the sandbox's memory file,
//! and a page of that file that no host process maps at the moment has no PSS at all: PSS
//! undercounts a runsc member. So the headline figure, "charged", is the container memory
//! cgroup's anonymous and shmem pages (every one charged in full to the container that touched
//! it first) plus the file-backed PSS of the processes in that cgroup plus the whole PSS of the
//! member's processes outside it (the shim). Under runc it comes out at the PSS.

use std::collections::{BTreeMap, BTreeSet};

use super::super::docker;

/// One host process's memory, in KiB.
#[derive(Clone, Debug, Default)]
pub(super) struct Usage {
    pub pss: u64,
    pub private_dirty: u64,
    pub private_clean: u64,
    pub shared: u64,
    /// PSS of file-backed pages (program text and libraries).
    pub pss_file: u64,
    /// Whether the process is in the container's memory cgroup.
    pub in_cgroup: bool,
    /// How many processes were summed into this row.
    pub count: u32,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.pss += other.pss;
        self.private_dirty += other.private_dirty;
        self.private_clean += other.private_clean;
        self.shared += other.shared;
        self.pss_file += other.pss_file;
        self.count += other.count;
    }
}

/// A member's memory: per kind of process, the total, and the cgroup's anon + shmem (KiB).
#[derive(Clone, Debug, Default)]
pub(super) struct Member {
    pub by_kind: BTreeMap<String, Usage>,
    pub total: Usage,
    pub cgroup_anon_shmem: Option<u64>,
    /// What the member is charged (see the module's comment), KiB.
    pub charged: u64,
}

impl Member {
    /// The PSS in MiB.
    pub fn pss_mib(&self) -> f64 {
        self.total.pss as f64 / 1024.0
    }

    /// What the member is charged, in MiB: never below its PSS.
    pub fn charged_mib(&self) -> f64 {
        self.charged.max(self.total.pss) as f64 / 1024.0
    }

    /// The private memory (USS) in MiB.
    pub fn private_mib(&self) -> f64 {
        (self.total.private_dirty + self.total.private_clean) as f64 / 1024.0
    }
}

/// The host PIDs that belong to container `id`.
fn pids_of(id: &str) -> BTreeSet<u32> {
    let mut pids: BTreeSet<u32> = BTreeSet::new();
    if !plimsoll_tests::docker::runsc() {
        // Under runsc `docker top` names the sandbox's own PIDs, not the host's.
        let (ok, out) = docker(&["top", id, "-eo", "pid"]);
        assert!(ok, "{out}");
        pids.extend(out.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(id) {
            pids.insert(pid);
        }
    }
    pids
}

/// What a process is, from its command line.
fn kind(cmdline: &str) -> String {
    let program = cmdline.split('\0').next().unwrap_or("");
    let base = program.rsplit('/').next().unwrap_or(program);
    let language = || {
        let args: Vec<&str> = cmdline.trim_end_matches('\0').split('\0').collect();
        let dir = args.iter().rev().find(|a| a.contains("/.plimsoll-interp/"));
        dir.and_then(|d| d.rsplit('/').next())
            .unwrap_or("?")
            .to_owned()
    };
    if base.starts_with("containerd-shim") {
        "shim".to_owned()
    } else if base.starts_with("runsc") {
        if cmdline.contains("\0boot\0") {
            "runsc sandbox".to_owned()
        } else if cmdline.contains("\0gofer\0") {
            "runsc gofer".to_owned()
        } else {
            format!("runsc ({})", cmdline.split('\0').nth(1).unwrap_or(""))
        }
    } else if cmdline.contains("plimsoll-relay\0agent\0") {
        "agent (plimsoll-relay)".to_owned()
    } else if cmdline.contains("plimsoll-relay\0cell\0") {
        format!("relay {} (plimsoll-relay)", language())
    } else if cmdline.contains("plimsoll's cell relay") {
        format!("relay {} (node)", language())
    } else if cmdline.contains("cell kernel") {
        format!("kernel {} ({base})", language())
    } else {
        base.to_owned()
    }
}

/// One process's smaps_rollup, if it is still there.
fn usage(pid: u32) -> Option<Usage> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(Usage {
        pss: field("Pss:"),
        private_dirty: field("Private_Dirty:"),
        private_clean: field("Private_Clean:"),
        shared: field("Shared_Clean:") + field("Shared_Dirty:"),
        pss_file: field("Pss_File:"),
        in_cgroup: false,
        count: 1,
    })
}

/// The container's memory cgroup (v1 or v2): anonymous plus shmem, in KiB.
fn cgroup_anon_shmem(id: &str) -> Option<u64> {
    let candidates = [
        format!("/sys/fs/cgroup/memory/docker/{id}/memory.stat"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.stat"),
        format!("/sys/fs/cgroup/docker/{id}/memory.stat"),
    ];
    let text = candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // v1 names anonymous memory "total_rss", v2 "anon".
    let anon = field("total_rss ").or_else(|| field("anon "))?;
    let shmem = field("total_shmem ")
        .or_else(|| field("shmem "))
        .unwrap_or(0);
    Some((anon + shmem) / 1024)
}

/// Measures container `id`.
pub(super) fn measure(id: &str) -> Member {
    let mut member = Member::default();
    // File-backed PSS of the cgroup's processes, all PSS of the others.
    let mut outside = 0;
    for pid in pids_of(id) {
        let cmdline = String::from_utf8_lossy(
            &std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default(),
        )
        .into_owned();
        let Some(mut u) = usage(pid) else { continue };
        u.in_cgroup =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id));
        outside += if u.in_cgroup { u.pss_file } else { u.pss };
        member.total.add(&u);
        member.by_kind.entry(kind(&cmdline)).or_default().add(&u);
    }
    member.cgroup_anon_shmem = cgroup_anon_shmem(id);
    member.charged = match member.cgroup_anon_shmem {
        Some(k) => k + outside,
        None => member.total.pss,
    };
    member
}

/// The breakdown as lines: per kind PSS, private dirty, private clean and shared, in MiB.
pub(super) fn breakdown(member: &Member) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let mut out = String::new();
    let mut rows: Vec<(&String, &Usage)> = member.by_kind.iter().collect();
    rows.sort_by_key(|(_, u)| std::cmp::Reverse(u.pss));
    for (name, u) in rows
        .into_iter()
        .chain([(&"total".to_owned(), &member.total)])
    {
        out.push_str(&format!(
            "  {name:<26} x{:<2} PSS {:6.1}  Private_Dirty {:6.1}  Private_Clean {:6.1}  Shared {:6.1}\n",
            u.count,
            mib(u.pss),
            mib(u.private_dirty),
            mib(u.private_clean),
            mib(u.shared),
        ));
    }
    if let Some(k) = member.cgroup_anon_shmem {
        out.push_str(&format!(
            "  cgroup anon+shmem {:.1}; charged {:.1}\n",
            mib(k),
            member.charged_mib()
        ));
    }
    out
}
