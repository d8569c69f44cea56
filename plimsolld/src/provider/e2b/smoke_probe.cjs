// The e2b startup proof's probe (grants.md §6.6), run by /tmp/plimsoll-smoke-step.sh exactly as
// a project step runs: it prints one JSON line with node's version, its working directory,
// whether python3 is there (argv[2]) and what each egress attempt reached. Any answer from the
// outside world fails startup; only a connection that could not be made (or the 4 s abort)
// counts as blocked: an error after one was made (a certificate refused by an intercepting
// proxy, say) means something on the path answered.
"use strict";
const TARGETS = ["https://1.1.1.1", "https://example.com"];
const UNREACHED = new Set([
  "ECONNREFUSED", "ECONNRESET", "ENETUNREACH", "EHOSTUNREACH", "ETIMEDOUT", "ENOTFOUND",
  "EAI_AGAIN", "EPERM", "EACCES", "UND_ERR_CONNECT_TIMEOUT",
]);
// Whether a failed fetch never connected: its cause's code, or every code of a cause that
// gathers one error per address tried.
function unreached(error) {
  const cause = (error && error.cause) || error || {};
  if (Array.isArray(cause.errors) && cause.errors.length > 0) {
    return cause.errors.every((e) => UNREACHED.has(e && e.code));
  }
  return UNREACHED.has(cause.code);
}
async function probe(url) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 4000);
  try {
    const answer = await fetch(url, { signal: abort.signal });
    return "reached " + answer.status;
  } catch (e) {
    if (abort.signal.aborted || unreached(e)) return "blocked";
    const cause = (e && e.cause) || e || {};
    return "reached error " + String(cause.code || cause.name || "unknown");
  } finally {
    clearTimeout(timer);
  }
}
(async () => {
  const egress = {};
  for (const url of TARGETS) egress[url] = await probe(url);
  const report = { node: process.version, cwd: process.cwd(), python: process.argv[2] === "1", egress };
  process.stdout.write(JSON.stringify(report) + "\n");
})();
