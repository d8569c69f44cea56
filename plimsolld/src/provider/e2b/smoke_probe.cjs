// The e2b startup proof's probe (grants.md §6.6), run by /tmp/plimsoll-smoke-step.sh exactly as
// a project step runs: it prints one JSON line with node's version, its working directory,
// whether python3 is there (argv[2]) and what each egress attempt reached. Any answer from the
// outside world fails startup; only an error or the 4 s abort counts as blocked.
"use strict";
const TARGETS = ["https://1.1.1.1", "https://example.com"];
async function probe(url) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 4000);
  try {
    const answer = await fetch(url, { signal: abort.signal });
    return "reached " + answer.status;
  } catch (_) {
    return "blocked";
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
