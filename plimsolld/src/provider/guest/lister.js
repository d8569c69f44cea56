// plimsoll's session process lister (providers.md §9.1): run by plimsolld over `docker exec`
// (or the openshell gateway's exec) right after a session sandbox starts. It prints one JSON
// array of every process it can see except itself and its ancestors (none under `docker exec`;
// the gateway's exec wrapper under openshell): {pid, ppid, id}, where id is
// "pid:starttime:cmdlinehex". Any process it cannot read (other than one that just ended) makes
// it exit 2: the baseline is unprovable.
"use strict";
const fs = require("fs");

function describe(pid) {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`);
    const trimmed = cmdline.length > 0 && cmdline[cmdline.length - 1] === 0
        ? cmdline.subarray(0, cmdline.length - 1)
        : cmdline;
    return {
        pid,
        ppid: Number(fields[1]),
        flags: Number(fields[6]),
        id: `${pid}:${fields[19]}:${trimmed.toString("hex")}`,
    };
}

// Itself and every ancestor it can walk to, as the sweep spares them.
const spared = new Set();
for (let pid = process.pid; pid > 0 && !spared.has(pid);) {
    spared.add(pid);
    try {
        pid = describe(pid).ppid;
    } catch {
        break;
    }
}

const seen = [];
for (const name of fs.readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(name)) continue;
    const pid = Number(name);
    if (spared.has(pid)) continue;
    try {
        const p = describe(pid);
        if ((p.flags & 0x200000) !== 0) continue;
        seen.push({ pid: p.pid, ppid: p.ppid, id: p.id });
    } catch (e) {
        if (e.code === "ENOENT" || e.code === "ESRCH") continue;
        process.stderr.write(`cannot read process ${pid}: ${e.code}\n`);
        process.exit(2);
    }
}
process.stdout.write(JSON.stringify(seen) + "\n");
