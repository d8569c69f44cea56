// The process identity check of plimsoll's in-guest scripts (cell/end.js; the session agent has
// its own in the relay crate, agent::procs): each
// is run with `node -e` with this file put before it at build time, so `same` is in its scope.
//
// Whether the process named by `m`, a match of /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/ against
// pid:starttime:cmdlinehex, is still alive as that same process (same start time and command
// line), so a recycled PID is never hit.
function same(m) {
  'use strict';
  const fs = require('fs');
  try {
    const stat = fs.readFileSync(`/proc/${m[1]}/stat`, 'latin1');
    let cmdline = fs.readFileSync(`/proc/${m[1]}/cmdline`);
    if (cmdline.length > 0 && cmdline[cmdline.length - 1] === 0) cmdline = cmdline.subarray(0, cmdline.length - 1);
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] !== 'Z' && fields[0] !== 'X' && fields[19] === m[2] && cmdline.toString('hex') === m[3];
  } catch {
    return false;
  }
}
