// plimsoll's session agent (providers.md §9.4): one per session container, started by
// plimsolld at open with ONE `docker exec` as root whose stdin and stdout plimsolld holds for
// the session's life. The runner guard (LD_PRELOAD) has already moved it to uid+1 of the guest
// identity, kept only CAP_SETUID and CAP_SETGID, and made it non-dumpable, so no guest process
// can signal it, trace it, or open its /proc entries (and so its pipes), under runc or gVisor.
//
//   node -e <this> <guest uid>
//
// Frames are JSON lines: requests on stdin, answers on stdout. Only plimsolld holds stdin and
// only the agent writes stdout, so an answer needs no key. First it answers
//   {"op":"ready","id":"pid:starttime:cmdlinehex","uid":N}
// then, for each request
//   {"op":"sweep","disk":<bytes>,"mounts":[...],"keep":["pid:starttime:cmdlinehex",...]}
// it kills every process except the kept ones, itself and its ancestors until every other
// process is proven gone (the kill is sent with the guest uid as its effective uid: the agent
// holds CAP_SETUID, not CAP_KILL), then measures the disk (statfs of each mount), and answers
//   {"op":"sweep","exit":0|1|10|11}
// with sweep.js's exit codes: 0 clean; 10 over the disk budget; 11 a mount could not be
// measured; 1 the boundary could not be proven within 50 rounds. A request it cannot read ends
// it (plimsolld then ends the session). agent_project.js adds project calls.
"use strict";
const fs = require("fs");

const guestUid = Number(process.argv[1]);
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

// Itself and every ancestor it can walk to (none under `docker exec`: its parent PID is 0).
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

// Sends `signal` to `pid` with the guest uid as the effective uid, so the kernel's kill
// permission check (sender's real or effective uid against the target's) passes for guest
// processes only. The real and saved uids stay uid+1, so no guest process can reach the agent
// in between; the effective uid is restored before anything else runs.
function signalAsGuest(pid, signal) {
    process.seteuid(guestUid);
    try {
        process.kill(pid, signal);
    } finally {
        process.seteuid(process.getuid());
    }
}

function boundary(keep) {
    const signalled = new Set();
    for (let round = 0; round < MAX_ROUNDS; round++) {
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
                    signalAsGuest(pid, "SIGKILL");
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
        if (left === 0) return true;
        Atomics.wait(pause, 0, 0, 20);
    }
    return false;
}

function disk(bytes, mounts) {
    if (bytes <= 0n) return 0;
    let used = 0n;
    for (const mount of mounts) {
        try {
            const s = fs.statfsSync(mount, { bigint: true });
            used += (s.blocks - s.bfree) * s.bsize;
        } catch {
            return 11;
        }
    }
    return used > bytes ? 10 : 0;
}

function sweep(request) {
    const keep = new Set(request.keep.map(String));
    if (!boundary(keep)) return 1;
    return disk(BigInt(request.disk), request.mounts.map(String));
}

function answer(frame) {
    fs.writeSync(1, JSON.stringify(frame) + "\n");
}

// The requests by `op`; agent_project.js, put after this file, adds `project`.
const requests = {
    sweep: async (request) => answer({ op: "sweep", exit: sweep(request) }),
};

if (!Number.isInteger(guestUid) || guestUid <= 0 || process.getuid() === guestUid) {
    process.exit(2);
}
answer({ op: "ready", id: identity(process.pid, statFields(process.pid)), uid: process.getuid() });

// One request at a time, in order: the daemon sends the next only after the answer.
let pending = "";
let queue = Promise.resolve();
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
    pending += chunk;
    let at;
    while ((at = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, at);
        pending = pending.slice(at + 1);
        queue = queue.then(async () => {
            const request = JSON.parse(line);
            const run = Object.hasOwn(requests, request.op) ? requests[request.op] : null;
            if (run === null) throw new Error("unknown request");
            await run(request);
        }).catch(() => process.exit(3));
    }
});
process.stdin.on("end", () => queue.then(() => process.exit(0)));
