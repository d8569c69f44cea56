// plimsoll's session sweep (providers.md §9.4): run by plimsolld over `docker exec` after each
// session call, non-dumpable under the runner guard, as
//
//   node -e <this> <disk bytes> <max entries> statfs|walk <mounts,comma,separated> <keep ids…>
//
// It kills every process except the kept ones (each "pid:starttime:cmdlinehex"), itself and
// its ancestors, until every other process is proven gone, then measures the disk: `statfs`
// when each mount is the session's own tmpfs (docker), `walk` (the blocks of every entry under
// the mounts, at most <max entries>) when a mount is a directory on a larger filesystem
// (openshell). Exit codes: 0 clean; 10 over the disk budget; 11 a mount could not be
// measured; 1 the boundary could not be proven within 50 rounds. Nothing it prints is trusted
// beyond its exit code.
"use strict";
const fs = require("fs");

const [diskArg, maxArg, mode, mountsArg, ...keepIds] = process.argv.slice(1);
const keep = new Set(keepIds);
const diskBytes = BigInt(diskArg || "0");
const KERNEL_THREAD = 0x200000;
const MAX_ROUNDS = 50;
const pause = new Int32Array(new SharedArrayBuffer(4));

function statFields(pid) {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
}

function identity(pid, fields) {
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`);
    const trimmed = cmdline.length > 0 && cmdline[cmdline.length - 1] === 0
        ? cmdline.subarray(0, cmdline.length - 1)
        : cmdline;
    return `${pid}:${fields[19]}:${trimmed.toString("hex")}`;
}

function gone(code) {
    return code === "ENOENT" || code === "ESRCH";
}

// Itself and every ancestor it can walk to.
const spared = new Set();
for (let pid = process.pid; pid > 0 && !spared.has(pid);) {
    spared.add(pid);
    try {
        pid = Number(statFields(pid)[1]);
    } catch {
        break;
    }
}

// A signalled process is gone only when every thread is a zombie or dead.
function allThreadsDead(pid) {
    let tasks;
    try {
        tasks = fs.readdirSync(`/proc/${pid}/task`);
    } catch (e) {
        if (gone(e.code)) return true;
        throw e;
    }
    for (const tid of tasks) {
        let state;
        try {
            state = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, "latin1");
        } catch (e) {
            if (gone(e.code)) continue;
            throw e;
        }
        const s = state.slice(state.lastIndexOf(")") + 2, state.lastIndexOf(")") + 3);
        if (s !== "Z" && s !== "X") return false;
    }
    return true;
}

const signalled = new Set();
let clean = false;
for (let round = 0; round < MAX_ROUNDS && !clean; round++) {
    let left = 0;
    for (const name of fs.readdirSync("/proc")) {
        if (!/^[0-9]+$/.test(name)) continue;
        const pid = Number(name);
        if (spared.has(pid)) continue;
        try {
            const fields = statFields(pid);
            if ((Number(fields[6]) & KERNEL_THREAD) !== 0) continue;
            if (keep.has(identity(pid, fields))) continue;
            if (signalled.has(pid) && allThreadsDead(pid)) continue;
            try {
                process.kill(pid, "SIGKILL");
            } catch (e) {
                if (!gone(e.code)) throw e;
            }
            signalled.add(pid);
            left++;
        } catch (e) {
            if (gone(e.code)) continue;
            left++;
        }
    }
    if (left === 0) {
        clean = true;
    } else {
        Atomics.wait(pause, 0, 0, 20);
    }
}
if (!clean) process.exit(1);

if (mode === "statfs" && diskBytes > 0n) {
    let used = 0n;
    for (const mount of (mountsArg || "").split(",").filter(Boolean)) {
        try {
            const s = fs.statfsSync(mount, { bigint: true });
            used += (s.blocks - s.bfree) * s.bsize;
        } catch {
            process.exit(11);
        }
    }
    if (used > diskBytes) process.exit(10);
} else if (mode === "walk" && diskBytes > 0n) {
    const maxEntries = Number(maxArg || "0");
    const pending = (mountsArg || "").split(",").filter(Boolean);
    let used = 0n;
    let walked = 0;
    while (pending.length > 0) {
        const dir = pending.pop();
        let names;
        try {
            names = fs.readdirSync(dir);
        } catch (e) {
            if (gone(e.code)) continue;
            process.exit(11);
        }
        for (const name of names) {
            if (++walked > maxEntries) process.exit(11);
            const path = `${dir}/${name}`;
            let st;
            try {
                st = fs.lstatSync(path, { bigint: true });
            } catch (e) {
                if (gone(e.code)) continue;
                process.exit(11);
            }
            used += st.blocks * 512n;
            if (st.isDirectory()) pending.push(path);
        }
    }
    if (used > diskBytes) process.exit(10);
}
process.exit(0);
