// plimsoll's cell identity check (providers.md §9.6), run by an identity no session process
// can reach (docker: uid+1; e2b: root) as
//
//   node -e <this file> <interpreter pid:starttime:cmdlinehex> <relay pid:starttime:cmdlinehex> \
//       <outside|root>
//
// It scans /proc and confirms that the interpreter is live with that start time and command
// line and is the only live process with that command line, and that the relay is live with its
// start time and command line and that its parent is what the provider's exec gives: PID 0
// (`outside`: only a `docker exec` child has one inside the container) or a live process of
// uid 0 (`root`: e2b's envd; no session process can start one). It prints {"ok":true} or
// {"error":"…"} and exits 0; anything else is a failure.
(function check() {
  'use strict';
  const fs = require('fs');

  function parse(id) {
    const m = /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/.exec(id || '');
    if (m === null) return null;
    return { pid: m[1], start: m[2], cmdline: m[3] };
  }

  // state, ppid, starttime and the command line of one process, or null when it is gone.
  function read(pid) {
    let stat;
    let cmdline;
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
      cmdline = fs.readFileSync(`/proc/${pid}/cmdline`);
    } catch {
      return null;
    }
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (cmdline.length > 0 && cmdline[cmdline.length - 1] === 0) cmdline = cmdline.subarray(0, cmdline.length - 1);
    return { state: fields[0], ppid: fields[1], start: fields[19], cmdline: cmdline.toString('hex') };
  }

  function live(p) {
    return p !== null && p.state !== 'Z' && p.state !== 'X';
  }

  // Whether pid is a live process whose real, effective, saved and filesystem uids are all 0.
  function rootOwned(pid) {
    if (!live(read(pid))) return false;
    let status;
    try {
      status = fs.readFileSync(`/proc/${pid}/status`, 'latin1');
    } catch {
      return false;
    }
    const ids = /^Uid:\s+(.*)$/m.exec(status);
    return ids !== null && ids[1].trim().split(/\s+/).every((id) => id === '0');
  }

  function verdict() {
    const interp = parse(process.argv[1]);
    const relay = parse(process.argv[2]);
    if (interp === null || relay === null) return 'malformed identity';
    const i = read(interp.pid);
    if (!live(i) || i.start !== interp.start || i.cmdline !== interp.cmdline) {
      return `interpreter ${interp.pid} is not live with the reported start time and command line`;
    }
    const r = read(relay.pid);
    if (!live(r) || r.start !== relay.start || r.cmdline !== relay.cmdline) {
      return `relay ${relay.pid} is not live with the reported start time and command line`;
    }
    if (process.argv[3] === 'root') {
      if (!rootOwned(r.ppid)) return `relay ${relay.pid} has parent ${r.ppid}, not a root process`;
    } else if (r.ppid !== '0') {
      return `relay ${relay.pid} has parent ${r.ppid}, not 0`;
    }
    for (const name of fs.readdirSync('/proc')) {
      if (!/^[0-9]+$/.test(name) || name === interp.pid) continue;
      const p = read(name);
      if (live(p) && p.cmdline === interp.cmdline) return `process ${name} has the interpreter's command line`;
    }
    return null;
  }

  let error;
  try {
    error = verdict();
  } catch (e) {
    error = `check failed: ${e.message}`;
  }
  process.stdout.write(`${JSON.stringify(error === null ? { ok: true } : { error })}\n`);
})();
