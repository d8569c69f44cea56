// plimsoll's host client (spec/grants.md §4), prepended to a granted run's code.
// The checks here are advisory and trivially bypassed: the broker enforces every rule.
(() => {
  const name = __GLOBAL__;
  const allow = __ALLOW__;
  const transport = __TRANSPORT__;
  const refuse = (m, p) =>
    new Error(`host api call not permitted by sandbox capability: ${m} ${p}`);
  const stable = (p) => {
    if (typeof p !== "string" || !p.startsWith("/")) return false;
    if (/[?#\\\u0000-\u001f\u007f]/.test(p)) return false;
    let decoded;
    try {
      decoded = decodeURIComponent(p);
    } catch (_) {
      return false;
    }
    if (decoded !== p || encodeURI(p) !== p) return false;
    return !p.split("/").some((s) => s === "." || s === "..");
  };
  const matches = (m, p) => {
    const segments = p.split("/");
    return allow.some((r) => {
      if (r.m !== m) return false;
      const template = r.p.split("/");
      return (
        template.length === segments.length &&
        template.every((t, i) => (t === "*" ? segments[i].length > 0 : t === segments[i]))
      );
    });
  };
  const call = async (method, path, body) => {
    const m = String(method).toUpperCase();
    if (!stable(path) || !matches(m, path)) throw refuse(m, path);
    const answer = await transport(m, path, body);
    if (answer.status >= 200 && answer.status < 300) {
      try {
        return JSON.parse(answer.body);
      } catch (_) {
        return answer.body;
      }
    }
    throw new Error(`host api ${answer.status}: ${answer.body}`);
  };
  globalThis[name] = Object.freeze({
    call,
    get: (p) => call("GET", p),
    put: (p, b) => call("PUT", p, b),
    post: (p, b) => call("POST", p, b),
    patch: (p, b) => call("PATCH", p, b),
    del: (p) => call("DELETE", p),
  });
})();
