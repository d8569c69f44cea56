// plimsoll's project runner (providers.md §5.9). plimsolld starts it in a fresh project
// container as
//
//   LD_PRELOAD=/usr/local/lib/plimsoll-runner-guard.so node /runner.mjs
//
// and writes on its stdin: one line with the run's report key (64 hex: 32 random bytes that
// only the daemon and this process know), then the plan as JSON:
//
//   {"files":[{"path","content"}], "steps":[…], "artifacts":[…], "timeoutMs":n, "env":{…}}
//
// The runner, in order: keeps the key in memory only; proves that a step cannot open its
// /proc entries; writes the files under /work; runs each step as `sh -c` in /work, stopping
// at the first failure or timeout;
// captures the artifacts; and writes its report to stdout in a frame authenticated with
// HMAC-SHA256 under the key. Steps never see the runner's stdout (their output goes to pipes
// and travels base64 inside the authenticated body), so nothing a step prints can pass for a
// report. Before each step it writes a short authenticated "step began" line, so the daemon
// can tell a runner that died before any code ran from one that died after.
//
// Identities: in a one-shot project container the preloaded guard has already moved this
// process from root to uid+1 of the guest identity (PLIMSOLL_GUEST_ID, "uid:gid"), keeping
// only CAP_SETUID and CAP_SETGID, and made it non-dumpable. Steps run as the guest uid with
// no capabilities, so they share nothing with the runner: no /proc access, no signals. The
// files and artifacts are written and read under the guest's effective ids, so the steps own
// what they were given and the runner reads only what a step could. Started without the
// switch (a non-root runner), the steps share its uid and only non-dumpability protects it.
//
// Everything else the daemon reads from the container is untrusted; the runner itself writes
// nothing to stderr.
import { spawn, spawnSync } from "node:child_process";
import { createHmac } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// The work directory: /work, or the absolute path plimsolld names in PLIMSOLL_WORK (the
// openshell provider's /tmp/work: its sandbox policy leaves only /tmp writable). A name that
// is not a plain absolute path is refused before anything runs.
const WORK = workDirectory(process.env.PLIMSOLL_WORK);
const REPORT_MARKER = "<<<PLIMSOLL_REPORT_V3>>>";
const STEP_MARKER = "<<<PLIMSOLL_STEP_V1>>>";
const STEP_OUTPUT_CAP = 1 << 20; // shared by a step's stdout and stderr
const STEP_RESULTS_CAP = 3 << 20; // encoded size of all step results
const ARTIFACTS_CAP = 8 << 20; // raw bytes of all artifacts
const RESULT_CAP = 15 << 20; // the whole report body
const COMMAND_CAP = 16 << 10;
const EXIT_TIMED_OUT = 124;
// After a step's shell exits, how long its pipes may stay open (a background job holding
// them is killed with the step's process group first).
const PIPE_GRACE_MS = 1000;
const { O_WRONLY, O_RDONLY, O_CREAT, O_TRUNC, O_NOFOLLOW, O_NONBLOCK } = fs.constants;

let key = null;

// The guest identity the steps run as, when the guard moved the runner off it; else null.
const guest = guestIdentity();

function workDirectory(named) {
    if (named === undefined || named === "") return "/work";
    const plain = /^(\/[A-Za-z0-9._-]+)+$/.test(named) && !named.split("/").some((s) => s === "." || s === "..");
    return plain ? named : null;
}

function guestIdentity() {
    const m = /^([0-9]+):([0-9]+)$/.exec(process.env.PLIMSOLL_GUEST_ID || "");
    if (!m) return null;
    const ids = { uid: Number(m[1]), gid: Number(m[2]) };
    return process.getuid() === ids.uid ? null : ids;
}

// Runs `fn` with the guest's effective uid and gid (file ownership and access as a step
// would have them), then returns to the runner's own.
function asGuest(fn) {
    if (guest === null) return fn();
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

// spawn options that start a child as the guest (every capability is gone at its exec).
function guestSpawn() {
    return guest === null ? {} : { uid: guest.uid, gid: guest.gid };
}

function mac(text) {
    return createHmac("sha256", key).update(text).digest("hex");
}

function writeAll(buf) {
    let off = 0;
    while (off < buf.length) {
        try {
            off += fs.writeSync(1, buf, off, buf.length - off);
        } catch (e) {
            if (e.code !== "EAGAIN") throw e;
        }
    }
}

function emitReport(result) {
    const body = Buffer.from(JSON.stringify(result), "utf8");
    writeAll(Buffer.from(`\n${REPORT_MARKER} ${body.length} ${mac(body)}\n`, "utf8"));
    writeAll(body);
}

function emitStepBegan(index) {
    writeAll(Buffer.from(`\n${STEP_MARKER} ${index} ${mac(`step-began ${index}`)}\n`, "utf8"));
}

function readStdin() {
    const chunks = [];
    const buf = Buffer.alloc(1 << 16);
    for (;;) {
        let n;
        try {
            n = fs.readSync(0, buf, 0, buf.length, null);
        } catch (e) {
            if (e.code === "EAGAIN") continue;
            if (e.code === "EOF") break;
            throw e;
        }
        if (n === 0) break;
        chunks.push(Buffer.from(buf.subarray(0, n)));
    }
    return Buffer.concat(chunks);
}

// A step must not be able to open our /proc entries. This checks the kernel agrees, with a
// real child started exactly as a step is. `checks` names the entries to try (the plan's
// `procChecks`; all four by default). A child started as the guest must also hold no
// capability at all.
function proveNotInspectable(env, checks) {
    const reads = checks.filter((c) => ["fd/0", "fd/1", "mem", "environ"].includes(c));
    // Shell builtins only (a redirection failing on `true` fails just that command): no
    // process is forked per check, which under gVisor costs tens of milliseconds each.
    const probe =
        'p=$1; shift; w=$1; shift; for f in "$@"; do if true <"/proc/$p/$f"; then echo "read $f"; fi; done; ' +
        'if [ "$w" = 1 ] && true >>"/proc/$p/fd/1"; then echo "write fd/1"; fi; ' +
        'n=0; while read -r k v; do case "$k" in CapEff:|CapPrm:) n=$((n + 1)); ' +
        'case "$v" in *[!0]*) echo "holds capabilities";; esac;; esac; done </proc/self/status; ' +
        '[ "$n" = 2 ] || echo "capabilities not shown"; exit 0';
    const write = reads.includes("fd/1") ? "1" : "0";
    const r = spawnSync("sh", ["-c", probe, "sh", String(process.pid), write, ...reads], {
        env,
        stdio: ["ignore", "pipe", "ignore"],
        timeout: 10000,
        ...guestSpawn(),
    });
    const opened = r.stdout ? r.stdout.toString().trim().replace(/\n/g, ", ") : "";
    if (r.status !== 0 || opened !== "" || !reads.includes("mem")) {
        throw new Error(
            `the runner's process is inspectable by its steps (${opened || "probe failed"}); nothing ran`,
        );
    }
}

// The absolute path of a plan path under /work, or an error naming it.
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

// The grant's client library (grants.md §4), preloaded into every node a step starts. It is
// the runner's file (steps may read it, not change it); it holds no credential.
function installHostClient(source, env) {
    const file = "/tmp/plimsoll-host.mjs";
    let fd;
    try {
        fd = fs.openSync(file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0o644);
        fs.writeSync(fd, source);
    } catch (e) {
        throw new Error(`the host client could not be written (${e.code || "error"})`);
    } finally {
        if (fd !== undefined) fs.closeSync(fd);
    }
    const flag = `--import=file://${file}`;
    env.NODE_OPTIONS = env.NODE_OPTIONS ? `${env.NODE_OPTIONS} ${flag}` : flag;
}

// Kills a step's whole process group. The signal is sent under the guest's effective uid:
// the runner holds no CAP_KILL, and a step of another uid could not be signalled otherwise.
function killGroup(child) {
    asGuest(() => {
        try {
            process.kill(-child.pid, "SIGKILL");
        } catch {
            // already gone
        }
    });
}

// Runs one step; resolves with its result. `limitMs` is what is left of the run's budget.
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
        const child = spawn("sh", ["-c", command], {
            cwd: WORK,
            env,
            stdio: ["ignore", "pipe", "pipe"],
            detached: true, // its own process group, so the whole step can be killed
            ...guestSpawn(),
        });
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
            resolve({
                command: command.length > COMMAND_CAP ? command.slice(0, COMMAND_CAP) : command,
                stdout: Buffer.concat(out),
                stderr: Buffer.concat(err),
                exitCode: timedOut ? EXIT_TIMED_OUT : exit,
                timedOut,
                durationMs: Date.now() - started,
                stdoutTruncated: truncated,
                stderrTruncated: truncated,
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
            exit = code !== null ? code : 128 + (signalNumber(signal) || 9);
            // Whatever the step left running (a background job holding its pipes) ends here.
            killGroup(child);
            if (open === 0) finish();
            else grace = setTimeout(finish, PIPE_GRACE_MS);
        });
    });
}

function signalNumber(name) {
    return (name && os.constants.signals[name]) || 0;
}

function encodedStepSize(s) {
    return Math.ceil(s.stdout.length / 3) * 4 + Math.ceil(s.stderr.length / 3) * 4 + s.command.length + 160;
}

// Keeps the encoded step results under their cap by cutting this step's output.
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

// Reads one artifact if it is a regular file inside /work; null when it is not there (or
// is a link, a directory, a device: never followed, never read).
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

async function main() {
    const input = readStdin();
    const newline = input.indexOf(0x0a);
    const hexKey = newline < 0 ? "" : input.subarray(0, newline).toString("latin1");
    if (!/^[0-9a-f]{64}$/.test(hexKey)) {
        // No key, no authenticated answer: say nothing; the daemon reads silence as
        // "the runner did not report".
        process.exit(2);
    }
    key = Buffer.from(hexKey, "hex");
    try {
        // The guard moves a runner started as root off root before node starts; one still
        // root ran without it (the loader skips a preload it cannot load, silently).
        if (process.getuid() === 0 || process.geteuid() === 0) {
            throw new Error("the runner runs as root: its guard library did not load; nothing ran");
        }
        if (WORK === null) throw new Error("PLIMSOLL_WORK is not a plain absolute path; nothing ran");
        const plan = JSON.parse(input.subarray(newline + 1).toString("utf8"));
        const started = Date.now();
        const budgetMs = Number(plan.timeoutMs) > 0 ? Number(plan.timeoutMs) : 30000;
        // The steps get the plan's environment, never the guard's preload or identity.
        const env = { ...process.env, ...(plan.env || {}), PLIMSOLL_RUNNER_PID: String(process.pid) };
        delete env.LD_PRELOAD;
        delete env.PLIMSOLL_GUEST_ID;
        if (typeof plan.hostSDK === "string" && plan.hostSDK !== "") {
            installHostClient(plan.hostSDK, env);
        }
        proveNotInspectable(env, plan.procChecks || ["fd/0", "fd/1", "mem", "environ"]);
        asGuest(() => writeFiles(plan.files || []));
        const steps = [];
        let encoded = 0;
        const commands = plan.steps || [];
        for (let i = 0; i < commands.length; i++) {
            emitStepBegan(i);
            const left = budgetMs - (Date.now() - started);
            const step = fitStep(await runStep(commands[i], env, left), STEP_RESULTS_CAP - encoded);
            encoded += encodedStepSize(step);
            steps.push(step);
            if (step.timedOut || step.exitCode !== 0) break;
        }
        emitReport(encode(steps, asGuest(() => captureArtifacts(plan.artifacts || []))));
    } catch (e) {
        emitReport({ error: e instanceof Error ? e.message : String(e) });
    }
    process.exit(0);
}

main();
