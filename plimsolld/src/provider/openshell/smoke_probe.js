// The openshell startup proof's probe (grants.md §8.6): plimsolld runs it with `node -` in a
// throwaway sandbox made exactly like a run's, and judges the JSON it prints. It only
// reports; every verdict is the daemon's.
"use strict";
const fs = require("fs");
const net = require("net");

const report = {};
const read = (path) => {
  try {
    return fs.readFileSync(path, "utf8");
  } catch (e) {
    return null;
  }
};
const code = (e) => (e && e.code) || String(e);

// Every mount point, and the usual directories, that accept a real write.
report.mounts = read("/proc/mounts") || "";
const unescape = (s) => s.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
const points = new Set(report.mounts.split("\n").filter(Boolean).map((l) => unescape(l.split(" ")[1])));
for (const d of ["/", "/etc", "/usr", "/var", "/var/tmp", "/home", "/root", "/run", "/dev", "/dev/shm", "/work", "/opt", "/srv", "/mnt"]) {
  points.add(d);
}
report.writable = [];
for (const point of points) {
  let st;
  try {
    st = fs.statSync(point);
  } catch (e) {
    continue;
  }
  if (!st.isDirectory()) continue; // devices, sockets and files are not where code writes
  const probe = (point === "/" ? "" : point) + "/.plimsoll-probe";
  try {
    fs.writeFileSync(probe, "x", { flag: "wx" });
    fs.unlinkSync(probe);
    report.writable.push(point);
  } catch (e) {
    // refused: as it should be everywhere but /tmp
  }
}

report.interfaces = (read("/proc/net/dev") || "")
  .split("\n")
  .slice(2)
  .map((l) => l.split(":")[0].trim())
  .filter(Boolean);
report.memory_max = (read("/sys/fs/cgroup/memory.max") || read("/sys/fs/cgroup/memory/memory.limit_in_bytes") || "").trim();
report.cpu_max = (read("/sys/fs/cgroup/cpu.max") || "").trim();
if (!report.cpu_max) {
  const quota = (read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") || "").trim();
  const period = (read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") || "").trim();
  if (quota && period) report.cpu_max = `${quota} ${period}`;
}
// gVisor shows no cgroup inside; it sizes its own memory to the limit instead.
const meminfo = (read("/proc/meminfo") || "").match(/^MemTotal:\s+(\d+) kB/m);
report.mem_total_kb = meminfo ? meminfo[1] : "";
report.arch = process.arch;
report.ptrace_scope = (read("/proc/sys/kernel/yama/ptrace_scope") || "").trim();

// Outbound connections: a documentation address (never routed) and a public one, v4 and v6.
const targets = [
  ["192.0.2.1", 80],
  ["1.1.1.1", 443],
  ["2001:db8::1", 80],
];
report.connect = {};
let left = targets.length;
const done = () => {
  if (--left === 0) {
    process.stdout.write(JSON.stringify(report) + "\n");
    process.exit(0);
  }
};
for (const [host, port] of targets) {
  const key = `${host}:${port}`;
  let settled = false;
  const settle = (answer) => {
    if (settled) return;
    settled = true;
    report.connect[key] = answer;
    socket.destroy();
    done();
  };
  const socket = net.connect({ host, port });
  socket.on("connect", () => settle("connected"));
  socket.on("error", (e) => settle(code(e)));
  setTimeout(() => settle("timeout"), 3000).unref();
}
