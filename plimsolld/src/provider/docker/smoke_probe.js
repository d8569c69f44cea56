// The startup proof's probe (providers.md §5.12): plimsolld runs it with `node -` in a
// throwaway container shaped exactly like a run, and judges the JSON it prints. It only
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

// Is the root writable?
try {
  fs.writeFileSync("/plimsoll-smoke", "x");
  report.root_write = "ok";
} catch (e) {
  report.root_write = code(e);
}

// The mount table, raw, and every mount point that accepts a real write.
report.mounts = read("/proc/mounts") || "";
const unescape = (s) => s.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
const points = [...new Set(report.mounts.split("\n").filter(Boolean).map((l) => unescape(l.split(" ")[1])))];
report.writable = [];
report.write_errors = {};
for (const point of points) {
  let st;
  try {
    st = fs.statSync(point);
  } catch (e) {
    report.write_errors[point] = code(e);
    continue;
  }
  try {
    if (st.isDirectory()) {
      const probe = (point === "/" ? "" : point) + "/.crsbx-probe";
      fs.writeFileSync(probe, "x", { flag: "wx" });
      fs.unlinkSync(probe);
      report.writable.push(point);
    } else if (st.isFile()) {
      fs.closeSync(fs.openSync(point, "a"));
      report.writable.push(point);
    }
    // Devices, sockets and FIFOs are skipped.
  } catch (e) {
    report.write_errors[point] = code(e);
  }
}

// Limits and identity.
report.pids_max = (read("/sys/fs/cgroup/pids.max") || read("/sys/fs/cgroup/pids/pids.max") || "").trim() || null;
// The rlimits as the shell reads them (gVisor has no /proc/self/limits).
try {
  const [nproc, core, nofile] = require("child_process")
    .execFileSync("/bin/sh", ["-c", "ulimit -u; ulimit -c; ulimit -n"], { encoding: "utf8" })
    .trim()
    .split("\n");
  Object.assign(report, { nproc, core, nofile });
} catch (e) {
  Object.assign(report, { nproc: null, core: null, nofile: null });
}
const status = read("/proc/self/status") || "";
const field = (name) => {
  const line = status.split("\n").find((l) => l.startsWith(name + ":"));
  return line ? line.slice(name.length + 1).trim().split(/\s+/).filter(Boolean) : [];
};
report.status = { uid: field("Uid"), gid: field("Gid"), groups: field("Groups") };
report.interfaces = (read("/proc/net/dev") || "")
  .split("\n")
  .slice(2)
  .map((l) => l.split(":")[0].trim())
  .filter(Boolean);

// The host socket, mounted the way a run mounts its broker socket.
const finish = () => process.stdout.write(JSON.stringify(report) + "\n");
if (!fs.existsSync("/run/host-api.sock")) {
  report.socket = "absent";
  finish();
} else {
  let got = "";
  let done = false;
  const end = (answer) => {
    if (done) return;
    done = true;
    report.socket = answer;
    finish();
    process.exit(0);
  };
  const conn = net.connect("/run/host-api.sock");
  conn.on("data", (d) => {
    got += d;
    if (got.includes("\n")) end(got.trim());
  });
  conn.on("error", (e) => end("error: " + code(e)));
  conn.on("end", () => end(got.trim() || "closed"));
  setTimeout(() => end("timeout"), 3000).unref();
}
