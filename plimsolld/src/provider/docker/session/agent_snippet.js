// plimsoll's session agent, snippet calls (providers.md §9.3): `node -` as the guest uid and
// gid in /work, with the code on its stdin. Put after agent_project.js at build time (it uses
// baseEnv, killGroup and guest from there, answer from agent.js). The request is
//
//   {"op":"snippet","code":"<base64>","env":["NAME=value",…],"timeoutMs":n,"cap":bytes}
//
// and the answer {"op":"snippet","stdout","stderr" (base64),"exit","timedOut",
// "stdoutTruncated","stderrTruncated"}. Each stream keeps `cap` bytes and drops the rest; at
// the deadline the snippet's whole process group is killed and the exit is 124. The snippet
// changes into /work itself, as the guest (a guest may have made /work 0700).
const SNIPPET_SCRIPT = 'cd /work || exit 127\nexec "$@"';

function snippet(request) {
    return new Promise((resolve) => {
        const env = baseEnv();
        for (const pair of request.env || []) {
            const at = String(pair).indexOf("=");
            if (at > 0) env[pair.slice(0, at)] = pair.slice(at + 1);
        }
        const cap = Number(request.cap) || 0;
        const streams = { stdout: [], stderr: [] };
        const kept = { stdout: 0, stderr: 0 };
        const truncated = { stdout: false, stderr: false };
        let timedOut = false;
        let exit = null;
        let finished = false;
        const child = spawn("sh", ["-c", SNIPPET_SCRIPT, "sh", "node", "-"], {
            cwd: "/",
            env,
            stdio: ["pipe", "pipe", "pipe"],
            detached: true,
            uid: guest.uid,
            gid: guest.gid,
        });
        for (const name of ["stdout", "stderr"]) {
            child[name].on("data", (chunk) => {
                const room = cap - kept[name];
                if (chunk.length > room) {
                    truncated[name] = true;
                    chunk = chunk.subarray(0, Math.max(0, room));
                }
                streams[name].push(chunk);
                kept[name] += chunk.length;
            });
        }
        child.stdin.on("error", () => {});
        child.stdin.end(Buffer.from(String(request.code), "base64"));
        let open = 2;
        let grace = null;
        const timer = setTimeout(() => {
            timedOut = true;
            killGroup(child);
        }, Math.max(0, Number(request.timeoutMs) || 0));
        const finish = () => {
            if (finished) return;
            finished = true;
            clearTimeout(timer);
            clearTimeout(grace);
            child.stdout.destroy();
            child.stderr.destroy();
            resolve({
                op: "snippet",
                stdout: Buffer.concat(streams.stdout).toString("base64"),
                stderr: Buffer.concat(streams.stderr).toString("base64"),
                exit: timedOut ? EXIT_TIMED_OUT : exit,
                timedOut,
                stdoutTruncated: truncated.stdout,
                stderrTruncated: truncated.stderr,
            });
        };
        const closed = () => {
            open -= 1;
            if (open === 0 && exit !== null) finish();
        };
        child.stdout.on("close", closed);
        child.stderr.on("close", closed);
        child.on("error", () => {
            exit = 127;
            finish();
        });
        child.on("exit", (code, signal) => {
            exit = code !== null ? code : 128 + ((signal && os.constants.signals[signal]) || 9);
            if (open === 0) finish();
            else grace = setTimeout(finish, PIPE_GRACE_MS);
        });
    });
}

requests.snippet = async (request) => answer(await snippet(request));
