// plimsoll's e2b session sweep (grants.md §6.7, providers.md §9.4): run by plimsolld through
// envd as root after each session call, as
//
//   node <this> <user> <disk bytes> <max entries> <keep> <dir…>
//
// The caller's code runs as <user>, who cannot become root. It kills every process that
// holds <user>'s uid in any of its ids until none is left (zombies hold nothing), except the
// processes named in <keep> (comma-separated pid:starttime:cmdlinehex, the session's cell
// interpreters and relays, spared only while all three still match; "-" for none), then counts
// the blocks of <user>'s files under the dirs (at most <max entries> entries). Exit codes:
// 0 clean; 10 over the disk budget; 11 the files could not be measured; 1 the boundary could
// not be proven within 50 rounds; 2 <user> is unknown. Nothing it prints is trusted.
"use strict";
const fs = require("fs");

const [name, diskArg, maxArg, keepArg, ...dirs] = process.argv.slice(2);
const keep = new Set(keepArg && keepArg !== "-" ? keepArg.split(",") : []);
const diskBytes = BigInt(diskArg || "0");
const maxEntries = Number(maxArg || "0");
const MAX_ROUNDS = 50;
const pause = new Int32Array(new SharedArrayBuffer(4));

const entry = fs.readFileSync("/etc/passwd", "utf8").split("\n")
    .map((line) => line.split(":"))
    .find((fields) => fields[0] === name);
if (!entry || !/^[0-9]+$/.test(entry[2]) || entry[2] === "0") process.exit(2);
const uid = entry[2];

// Every live process with the uid as its real, effective, saved or filesystem id.
function theirs() {
    const found = [];
    for (const pid of fs.readdirSync("/proc")) {
        if (!/^[0-9]+$/.test(pid)) continue;
        let status;
        try {
            status = fs.readFileSync(`/proc/${pid}/status`, "latin1");
        } catch {
            continue;
        }
        const state = /^State:\s+(\S)/m.exec(status);
        if (state && (state[1] === "Z" || state[1] === "X")) continue;
        const ids = /^Uid:\s+(.*)$/m.exec(status);
        if (ids && ids[1].trim().split(/\s+/).includes(uid) && !kept(pid)) found.push(Number(pid));
    }
    return found;
}

// Whether pid is a kept process: its start time and command line as the daemon proved them.
function kept(pid) {
    if (keep.size === 0) return false;
    let stat;
    let cmdline;
    try {
        stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
        cmdline = fs.readFileSync(`/proc/${pid}/cmdline`);
    } catch {
        return false;
    }
    const start = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
    if (cmdline.length > 0 && cmdline[cmdline.length - 1] === 0) {
        cmdline = cmdline.subarray(0, cmdline.length - 1);
    }
    return keep.has(`${pid}:${start}:${cmdline.toString("hex")}`);
}

let clean = false;
for (let round = 0; round < MAX_ROUNDS; round++) {
    const left = theirs();
    if (left.length === 0) {
        clean = true;
        break;
    }
    for (const pid of left) {
        try {
            process.kill(pid, "SIGKILL");
        } catch {
            // Gone already.
        }
    }
    Atomics.wait(pause, 0, 0, 20);
}
if (!clean) process.exit(1);

let total = 0n;
let entries = 0;
const stack = [...dirs];
while (stack.length > 0) {
    const path = stack.pop();
    let st;
    try {
        st = fs.lstatSync(path, { bigint: true });
    } catch (e) {
        if (e.code === "ENOENT") continue;
        process.exit(11);
    }
    entries += 1;
    if (maxEntries > 0 && entries > maxEntries) process.exit(11);
    if (String(st.uid) === uid) total += st.blocks * 512n;
    if (st.isDirectory()) {
        try {
            for (const child of fs.readdirSync(path)) stack.push(`${path}/${child}`);
        } catch {
            process.exit(11);
        }
    }
}
process.exit(diskBytes > 0n && total > diskBytes ? 10 : 0);
