// plimsoll's cell ender (providers.md §9.6): run over `docker exec` as the guest uid as
//
//   node -e <this file> <pid:starttime:cmdlinehex>…
//
// It sends SIGKILL to each named process that is still the same process (same start time and
// command line), so a recycled PID is never hit, then waits up to 2 s until each is gone (a
// new interpreter's proof requires the old one to be gone). Best effort: the session's sweep is
// what proves the call boundary. `same` comes from ../same.js, put before this file.
(function end() {
  'use strict';
  const WAIT_MS = 2000;
  const POLL_MS = 10;

  const targets = process.argv
    .slice(1)
    .map((id) => /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/.exec(id))
    .filter((m) => m !== null && same(m));
  for (const m of targets) {
    try {
      process.kill(Number(m[1]), 'SIGKILL');
    } catch {
      // gone already, or not ours to end
    }
  }
  const pause = new Int32Array(new SharedArrayBuffer(4));
  const until = Date.now() + WAIT_MS;
  while (targets.some(same) && Date.now() < until) Atomics.wait(pause, 0, 0, POLL_MS);
})();
