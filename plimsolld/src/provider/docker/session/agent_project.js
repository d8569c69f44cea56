// plimsoll's session agent, project calls (providers.md §9.3): the project runner's role
// (the project image's runner, whose report format it keeps) inside the agent, which runs
// as uid+1 holding CAP_SETUID/CAP_SETGID. Put after agent.js and agent_hold.js at build time;
// `answer`, `guestUid`, `signalAsGuest` and the hold come from there. The requests are
//
//   {"op":"prove"}
//   {"op":"project","input":"<base64 of the runner's stdin: key line, then the plan>",
//    "hold":["pid:starttime:cmdlinehex",…]}
//
// `prove` is sent once, right after the ready frame and before any guest code can run: the
// agent proves with a real step-like child that a step cannot open its /proc entries (see
// `probe`) and answers {"op":"prove","ok":<whether the probe ran>}. A project call first holds
// the named processes stopped (agent_hold.js); when that cannot be proven it answers
// {"op":"project","held":false} and runs nothing. Otherwise it runs the call, resumes them
// and answers {"op":"project","held":true,"still":<whether each was still stopped>,
// "stdout":"<base64 of what the runner would have printed>"}, step-began lines and the
// HMAC-authenticated report included, so the daemon reads it as it reads a runner's stdout.
// Steps run as the guest uid and gid with no capability; they never share a uid with the
// agent, so none can open its /proc entries, signal it or trace it. A step changes into /work
// as the guest: the child is forked while the agent's effective ids are the guest's, so
// node's spawn (which changes directory before it changes uid) enters it with the guest's
// rights, and a guest may have made /work 0700.
const { spawn, spawnSync } = require("child_process");
const { createHmac } = require("crypto");
const path = require("path");
const os = require("os");

const WORK = "/work";
const REPORT_MARKER = "<<<PLIMSOLL_REPORT_V3>>>";
const STEP_MARKER = "<<<PLIMSOLL_STEP_V1>>>";
const STEP_OUTPUT_CAP = 1 << 20;
const STEP_RESULTS_CAP = 3 << 20;
const ARTIFACTS_CAP = 8 << 20;
const RESULT_CAP = 15 << 20;
const COMMAND_CAP = 16 << 10;
const EXIT_TIMED_OUT = 124;
const PIPE_GRACE_MS = 1000;
const EXIT_NOT_STARTED = 127;
const { O_WRONLY, O_RDONLY, O_CREAT, O_TRUNC, O_NOFOLLOW, O_NONBLOCK } = fs.constants;

const guest = { uid: guestUid, gid: guestUid };

// The base environment a step gets under the plan's: what the start script gives a process
// of the guest uid (PATH, HOME from passwd or /, HOSTNAME).
function baseEnv() {
    let home = "/";
    try {
        for (const line of fs.readFileSync("/etc/passwd", "utf8").split("\n")) {
            const f = line.split(":");
            if (f.length >= 6 && f[2] === String(guestUid)) {
                home = f[5] || "/";
                break;
            }
        }
    } catch {
        // no passwd: HOME stays /
    }
    let host = "";
    try {
        host = fs.readFileSync("/etc/hostname", "utf8").split("\n")[0];
    } catch {
        // none
    }
    return { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", HOME: home, HOSTNAME: host };
}

function asGuest(fn) {
    const uid = process.geteuid();
    const gid = process.getegid();
    process.setegid(guest.gid);
    process.seteuid(guest.uid);
    try {
        return fn();
    } finally {
        process.seteuid(uid);
        process.setegid(gid);
    }
}

// What a step may not open or hold, and how the probe says it could.
const PROBED = ["fd/0", "fd/1", "mem", "environ"];
const PROBE_SCRIPT =
    'p=$1; shift; for f in "$@"; do if true <"/proc/$p/$f"; then echo "read $f"; fi; done; ' +
    'if true >>"/proc/$p/fd/1"; then echo "write fd/1"; fi; ' +
    'n=0; while read -r k v; do case "$k" in CapEff:|CapPrm:) n=$((n + 1)); ' +
    'case "$v" in *[!0]*) echo "holds capabilities";; esac;; esac; done </proc/self/status; ' +
    '[ "$n" = 2 ] || echo "capabilities not shown"; exit 0';
const STATE_FIELDS = /^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):/;

// Whether a step could reach the agent is decided by the kernel from the agent's credentials
// (real, effective, saved and filesystem uid and gid, its groups), its dumpability (which
// decides who owns its /proc entries: root while it is not dumpable) and what a child of it
// can hold after exec (its inheritable, ambient and bounding capability sets and
// no_new_privs); the step-like child is started the same way every time, in a container
// whose settings are compared before every call. This reads exactly those, in-process (no
// process start): the lines of /proc/self/status, and the owner and mode of its own
// /proc/<pid>/mem, which follow its dumpability under Linux and gVisor. Nothing in the agent
// changes them but the effective-id switches of `asGuest` and `signalAsGuest`, which restore
// the ids, and whose uid change resets dumpability to the host's fs.suid_dumpable; so the
// state read after one such switch (`settle`) is the state the agent keeps.
function agentState() {
    const status = fs.readFileSync("/proc/self/status", "latin1")
        .split("\n")
        .filter((line) => STATE_FIELDS.test(line));
    const mem = fs.statSync(`/proc/${process.pid}/mem`);
    return `${status.join("\n")}\nmem ${mem.uid}:${mem.gid}:${mem.mode.toString(8)}`;
}

// One effective-uid switch and back, as every later request makes, so the proof is made in
// the dumpability the agent keeps from then on.
function settle() {
    process.seteuid(guestUid);
    process.seteuid(process.getuid());
}

// The last probe's verdict and the agent state it was made in (null: none, or it failed).
let proven = null;

// Starts a step-like child (the guest's uid and gid, no capability asked for, the fixed base
// environment) that tries to open each of PROBED of the agent's /proc entries, to append to
// its stdout, and reads its own capability sets; records what it managed. Runs only while no
// guest code can run beside it: before the first request that runs any (`prove`, right after
// the ready frame), or inside a project call, after the last call's sweep and with the kept
// interpreters held stopped.
function probe() {
    const state = agentState();
    const r = spawnSync("sh", ["-c", PROBE_SCRIPT, "sh", String(process.pid), ...PROBED], {
        env: baseEnv(),
        cwd: "/",
        stdio: ["ignore", "pipe", "ignore"],
        timeout: 10000,
        uid: guest.uid,
        gid: guest.gid,
    });
    const found = r.stdout ? r.stdout.toString().split("\n").filter((l) => l !== "") : [];
    proven = r.status === 0 && agentState() === state ? { state, found } : null;
}

// Why a step started now could reach the agent, or null when it could not: it could open
// none of `checks` (which must include mem) of the agent's /proc entries and would hold no
// capability. The probe's verdict, made again whenever the agent's state is not the one it
// was made in.
function inspectable(checks) {
    if (proven === null || proven.state !== agentState()) probe();
    const reads = checks.filter((c) => PROBED.includes(c));
    const counts = (line) =>
        line === "holds capabilities" ||
        line === "capabilities not shown" ||
        (line === "write fd/1" && reads.includes("fd/1")) ||
        (line.startsWith("read ") && reads.includes(line.slice(5)));
    const opened = proven === null ? "" : proven.found.filter(counts).join(", ");
    if (proven === null || opened !== "" || !reads.includes("mem")) return opened || "probe failed";
    return null;
}

function underWork(rel, what) {
    const abs = path.resolve(WORK, rel);
    if (!abs.startsWith(WORK + "/")) {
        throw new Error(`${what} ${JSON.stringify(rel)} is not inside ${WORK}`);
    }
    return abs;
}

function writeFiles(files) {
    for (const f of files) {
        const abs = underWork(f.path, "file");
        const dir = path.dirname(abs);
        let real;
        try {
            fs.mkdirSync(dir, { recursive: true, mode: 0o755 });
            real = fs.realpathSync(dir);
        } catch (e) {
            throw new Error(`the directory of file ${JSON.stringify(f.path)} could not be made (${e.code || "error"})`);
        }
        if (real !== WORK && !real.startsWith(WORK + "/")) {
            throw new Error(`file ${JSON.stringify(f.path)} is not inside ${WORK}`);
        }
        let fd;
        try {
            fd = fs.openSync(abs, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK, 0o644);
        } catch (e) {
            throw new Error(`file ${JSON.stringify(f.path)} could not be written (${e.code || "error"})`);
        }
        try {
            if (!fs.fstatSync(fd).isFile()) {
                throw new Error(`file ${JSON.stringify(f.path)} is not a regular file`);
            }
            const bytes = Buffer.from(f.content, "utf8");
            let off = 0;
            while (off < bytes.length) off += fs.writeSync(fd, bytes, off, bytes.length - off);
        } finally {
            fs.closeSync(fd);
        }
    }
}

// The grant's client library, written as the guest (the file lives in the session's /tmp
// across calls) and preloaded into every node a step starts.
function installHostClient(source, env) {
    const file = "/tmp/plimsoll-host.mjs";
    asGuest(() => {
        let fd;
        try {
            fd = fs.openSync(file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0o644);
            fs.writeSync(fd, source);
        } catch (e) {
            throw new Error(`the host client could not be written (${e.code || "error"})`);
        } finally {
            if (fd !== undefined) fs.closeSync(fd);
        }
    });
    const flag = `--import=file://${file}`;
    env.NODE_OPTIONS = env.NODE_OPTIONS ? `${env.NODE_OPTIONS} ${flag}` : flag;
}

// The step's process group, killed with the guest uid as the effective uid (the kill check
// reads the uid only).
function killGroup(child) {
    if (child.pid === undefined) return;
    try {
        signalAsGuest(-child.pid, "SIGKILL");
    } catch {
        // already gone
    }
}

// The environment the step's `sh` gets: what the step started as
// `sh -c 'cd /work || exit 127; exec sh -c "$1"'` (the runner's) saw, with one process: the
// outer shell's cd exported PWD=/work and OLDPWD (the PWD it started with when that named `/`,
// else `/`), and each shell added one to SHLVL.
function stepEnv(env) {
    let old = "/";
    const pwd = env.PWD;
    if (typeof pwd === "string" && pwd.startsWith("/")) {
        try {
            const named = asGuest(() => fs.statSync(pwd));
            const root = fs.statSync("/");
            if (named.dev === root.dev && named.ino === root.ino) old = pwd;
        } catch {
            // not `/`
        }
    }
    const level = /^\s*([+-]?[0-9]+)/.exec(typeof env.SHLVL === "string" ? env.SHLVL : "");
    const outer = (level ? Number.parseInt(level[1], 10) : 0) + 1;
    return { ...env, PWD: WORK, OLDPWD: old, SHLVL: String(outer | 0) };
}

// What the shell printed when it could not enter /work.
const ERRNO_TEXT = {
    EACCES: "Permission denied",
    ENOENT: "No such file or directory",
    ENOTDIR: "Not a directory",
    ELOOP: "Symbolic link loop",
};

function notEntered(e) {
    const code = e && e.code ? e.code : "error";
    return Buffer.from(`sh: cd: line 0: can't cd to ${WORK}: ${ERRNO_TEXT[code] || code}\n`);
}

function runStep(command, env, limitMs) {
    return new Promise((resolve) => {
        const started = Date.now();
        const out = [];
        const err = [];
        let kept = 0;
        let truncated = false;
        let timedOut = false;
        let exit = null;
        let finished = false;
        const result = () => ({
            command: command.length > COMMAND_CAP ? command.slice(0, COMMAND_CAP) : command,
            stdout: Buffer.concat(out),
            stderr: Buffer.concat(err),
            exitCode: timedOut ? EXIT_TIMED_OUT : exit,
            timedOut,
            durationMs: Date.now() - started,
            stdoutTruncated: truncated,
            stderrTruncated: truncated,
        });
        // `sh -c "<command>"` ($0 `sh`), forked with the guest's effective ids so that its cwd
        // is entered with the guest's rights, then moved to the guest uid and gid for good.
        let child;
        try {
            child = asGuest(() =>
                spawn("sh", ["-c", command], {
                    cwd: WORK,
                    env,
                    stdio: ["ignore", "pipe", "pipe"],
                    detached: true,
                    uid: guest.uid,
                    gid: guest.gid,
                }),
            );
        } catch (e) {
            err.push(notEntered(e));
            exit = EXIT_NOT_STARTED;
            resolve(result());
            return;
        }
        const keep = (into) => (chunk) => {
            const room = STEP_OUTPUT_CAP - kept;
            if (chunk.length > room) {
                if (room > 0) into.push(chunk.subarray(0, room));
                kept = STEP_OUTPUT_CAP;
                if (!truncated) {
                    truncated = true;
                    killGroup(child);
                }
                return;
            }
            into.push(chunk);
            kept += chunk.length;
        };
        child.stdout.on("data", keep(out));
        child.stderr.on("data", keep(err));
        const timer = setTimeout(() => {
            timedOut = true;
            killGroup(child);
        }, Math.max(0, limitMs));
        let open = 2;
        let grace = null;
        const finish = () => {
            if (finished) return;
            finished = true;
            clearTimeout(timer);
            clearTimeout(grace);
            child.stdout.destroy();
            child.stderr.destroy();
            resolve(result());
        };
        const closed = () => {
            open -= 1;
            if (open === 0 && exit !== null) finish();
        };
        child.stdout.on("close", closed);
        child.stderr.on("close", closed);
        child.on("error", (e) => {
            err.push(notEntered(e));
            exit = EXIT_NOT_STARTED;
            finish();
        });
        child.on("exit", (code, signal) => {
            exit = code !== null ? code : 128 + ((signal && os.constants.signals[signal]) || 9);
            killGroup(child);
            if (open === 0) finish();
            else grace = setTimeout(finish, PIPE_GRACE_MS);
        });
    });
}

function encodedStepSize(s) {
    return Math.ceil(s.stdout.length / 3) * 4 + Math.ceil(s.stderr.length / 3) * 4 + s.command.length + 160;
}

function fitStep(step, budget) {
    if (encodedStepSize(step) <= budget) return step;
    const room = Math.max(0, Math.floor(((budget - step.command.length - 160) / 4) * 3) - 3);
    const keepOut = Math.min(step.stdout.length, room);
    const keepErr = Math.min(step.stderr.length, room - keepOut);
    if (keepOut < step.stdout.length) step.stdoutTruncated = true;
    if (keepErr < step.stderr.length) step.stderrTruncated = true;
    step.stdout = step.stdout.subarray(0, keepOut);
    step.stderr = step.stderr.subarray(0, keepErr);
    return step;
}

function readArtifact(rel, room) {
    let abs;
    try {
        abs = underWork(rel, "artifact");
        const real = fs.realpathSync(abs);
        if (real !== abs) return null;
    } catch {
        return null;
    }
    let fd;
    try {
        fd = fs.openSync(abs, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    } catch {
        return null;
    }
    try {
        if (fs.readlinkSync(`/proc/self/fd/${fd}`) !== abs) return null;
        const st = fs.fstatSync(fd);
        if (!st.isFile()) return null;
        if (st.size > room) return { over: true };
        const content = Buffer.alloc(st.size);
        let off = 0;
        while (off < st.size) {
            const n = fs.readSync(fd, content, off, st.size - off, off);
            if (n === 0) break;
            off += n;
        }
        return { content: content.subarray(0, off) };
    } finally {
        fs.closeSync(fd);
    }
}

function captureArtifacts(paths) {
    const artifacts = [];
    let total = 0;
    let truncated = false;
    for (const rel of paths) {
        const got = readArtifact(rel, ARTIFACTS_CAP - total);
        if (got === null) continue;
        if (got.over) {
            truncated = true;
            break;
        }
        total += got.content.length;
        artifacts.push({ path: rel, content: got.content });
    }
    return { artifacts, truncated };
}

function encode(steps, captured) {
    const result = {
        steps: steps.map((s) => ({
            command: s.command,
            stdout: s.stdout.toString("base64"),
            stderr: s.stderr.toString("base64"),
            exitCode: s.exitCode,
            timedOut: s.timedOut,
            durationMs: s.durationMs,
            stdoutTruncated: s.stdoutTruncated,
            stderrTruncated: s.stderrTruncated,
        })),
        artifacts: captured.artifacts.map((a) => ({ path: a.path, content: a.content.toString("base64") })),
        artifactsTruncated: captured.truncated,
    };
    let body = JSON.stringify(result);
    while (Buffer.byteLength(body) > RESULT_CAP && result.artifacts.length > 0) {
        result.artifacts.pop();
        result.artifactsTruncated = true;
        body = JSON.stringify(result);
    }
    if (Buffer.byteLength(body) > RESULT_CAP) {
        return { error: "the project's result is larger than the runner may report" };
    }
    return result;
}

// One project call; resolves with what the runner would have printed.
async function project(request) {
    const input = Buffer.from(String(request.input), "base64");
    const newline = input.indexOf(0x0a);
    const hexKey = newline < 0 ? "" : input.subarray(0, newline).toString("latin1");
    if (!/^[0-9a-f]{64}$/.test(hexKey)) return Buffer.alloc(0);
    const key = Buffer.from(hexKey, "hex");
    const mac = (text) => createHmac("sha256", key).update(text).digest("hex");
    const printed = [];
    const emitReport = (result) => {
        const body = Buffer.from(JSON.stringify(result), "utf8");
        printed.push(Buffer.from(`\n${REPORT_MARKER} ${body.length} ${mac(body)}\n`, "utf8"), body);
    };
    try {
        const plan = JSON.parse(input.subarray(newline + 1).toString("utf8"));
        const started = Date.now();
        const budgetMs = Number(plan.timeoutMs) > 0 ? Number(plan.timeoutMs) : 30000;
        const env = { ...baseEnv(), ...(plan.env || {}), PLIMSOLL_RUNNER_PID: String(process.pid) };
        if (typeof plan.hostSDK === "string" && plan.hostSDK !== "") {
            installHostClient(plan.hostSDK, env);
        }
        const checks = plan.procChecks || PROBED;
        const reachable = inspectable(checks);
        if (reachable !== null) {
            throw new Error(`the runner's process is inspectable by its steps (${reachable}); nothing ran`);
        }
        const files = plan.files || [];
        if (files.length > 0) asGuest(() => writeFiles(files));
        const shellEnv = stepEnv(env);
        const steps = [];
        let encoded = 0;
        const commands = plan.steps || [];
        for (let i = 0; i < commands.length; i++) {
            // Each step starts only while the proof still holds (an in-process read).
            const lost = i === 0 ? null : inspectable(checks);
            if (lost !== null) {
                throw new Error(`the runner's process became inspectable by its steps (${lost}); the call stopped before step ${i}`);
            }
            printed.push(Buffer.from(`\n${STEP_MARKER} ${i} ${mac(`step-began ${i}`)}\n`, "utf8"));
            const left = budgetMs - (Date.now() - started);
            const step = fitStep(await runStep(commands[i], shellEnv, left), STEP_RESULTS_CAP - encoded);
            encoded += encodedStepSize(step);
            steps.push(step);
            if (step.timedOut || step.exitCode !== 0) break;
        }
        const wanted = plan.artifacts || [];
        const captured = wanted.length > 0
            ? asGuest(() => captureArtifacts(wanted))
            : { artifacts: [], truncated: false };
        emitReport(encode(steps, captured));
    } catch (e) {
        emitReport({ error: e instanceof Error ? e.message : String(e) });
    }
    return Buffer.concat(printed);
}

requests.prove = async () => {
    settle();
    probe();
    answer({ op: "prove", ok: proven !== null });
};

// The kept interpreters are held stopped around the whole call (the daemon names them), in
// this one exchange: nothing of an earlier call runs beside a probe or a step.
requests.project = async (request) => {
    const targets = holdTargets(Array.isArray(request.hold) ? request.hold : []);
    if (!stopAll(targets)) {
        answer({ op: "project", held: false });
        return;
    }
    const stdout = await project(request);
    const still = contAll(targets);
    answer({ op: "project", held: true, still, stdout: stdout.toString("base64") });
};
