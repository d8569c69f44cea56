// plimsoll's hold on kept processes (providers.md §9.3 "Grants"): run by plimsolld over
// `docker exec` as the guest uid, non-dumpable under the runner guard, as
//
//   node -e <this> stop|cont <pid:starttime:cmdlinehex>…
//
// stop: sends SIGSTOP to each named process that is still that process (same start time and
//   command line, so a recycled PID is never hit), then waits up to 2 s until every thread of
//   each is stopped. Exit 0 only then; 1 otherwise.
// cont: prints {"held":true|false}, whether every thread of each was still stopped, then
//   sends SIGCONT to each. Exit 0.
// Only stop's exit code is trusted; cont's line is for the log. `same` comes from same.js,
// put before this file.
(function hold() {
  'use strict';
  const fs = require('fs');
  const WAIT_MS = 2000;
  const POLL_MS = 5;

  // Whether every live thread of the process is stopped (a process that is gone holds nothing).
  function stopped(pid) {
    let tasks;
    try {
      tasks = fs.readdirSync(`/proc/${pid}/task`);
    } catch {
      return true;
    }
    for (const tid of tasks) {
      let stat;
      try {
        stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'latin1');
      } catch {
        continue;
      }
      const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      if (state !== 'T' && state !== 't' && state !== 'Z' && state !== 'X') return false;
    }
    return true;
  }

  const [mode, ...ids] = process.argv.slice(1);
  const targets = ids
    .map((id) => /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/.exec(id))
    .filter((m) => m !== null && same(m));
  if (mode === 'stop') {
    for (const m of targets) {
      try {
        process.kill(Number(m[1]), 'SIGSTOP');
      } catch {
        process.exit(1);
      }
    }
    const pause = new Int32Array(new SharedArrayBuffer(4));
    const until = Date.now() + WAIT_MS;
    for (;;) {
      if (targets.every((m) => stopped(m[1]))) process.exit(0);
      if (Date.now() >= until) process.exit(1);
      Atomics.wait(pause, 0, 0, POLL_MS);
    }
  } else if (mode === 'cont') {
    const held = targets.every((m) => stopped(m[1]));
    process.stdout.write(JSON.stringify({ held }) + '\n');
    for (const m of targets) {
      try {
        process.kill(Number(m[1]), 'SIGCONT');
      } catch {
        // gone already
      }
    }
    process.exit(0);
  } else {
    process.exit(2);
  }
})();
