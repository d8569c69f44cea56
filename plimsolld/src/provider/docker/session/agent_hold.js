// plimsoll's session agent, the hold on kept interpreters (providers.md §9.3 "Grants";
// agent_project.js holds around a project call with the same functions, inside its own
// request), in-process. Put after guest/same.js (for `same`) and agent.js (for
// `signalAsGuest`, `answer`, `requests`) at build time. The request is
//
//   {"op":"hold","mode":"stop"|"cont","ids":["pid:starttime:cmdlinehex",…]}
//
// stop: SIGSTOP to each named process that is still that process, then up to 2 s until every
//   thread of each is stopped; answers {"op":"hold","ok":true} only then.
// cont: answers {"op":"hold","ok":true,"held":<whether each was still stopped>} and sends
//   SIGCONT to each.
const HOLD_WAIT_MS = 2000;
const HOLD_POLL_MS = 1;

function allStopped(pid) {
    let tasks;
    try {
        tasks = fs.readdirSync(`/proc/${pid}/task`);
    } catch {
        return true;
    }
    for (const tid of tasks) {
        let stat;
        try {
            stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, "latin1");
        } catch {
            continue;
        }
        const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
        if (state !== "T" && state !== "t" && state !== "Z" && state !== "X") return false;
    }
    return true;
}

// The processes named by `ids` that are still those processes.
function holdTargets(ids) {
    return ids
        .map((id) => /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/.exec(String(id)))
        .filter((m) => m !== null && same(m));
}

// SIGSTOP to each target, then up to 2 s until every thread of each is stopped: whether that
// was proven.
function stopAll(targets) {
    for (const m of targets) {
        try {
            signalAsGuest(Number(m[1]), "SIGSTOP");
        } catch {
            return false;
        }
    }
    const until = Date.now() + HOLD_WAIT_MS;
    for (;;) {
        if (targets.every((m) => allStopped(m[1]))) return true;
        if (Date.now() >= until) return false;
        Atomics.wait(pause, 0, 0, HOLD_POLL_MS);
    }
}

// Whether every target was still stopped; then SIGCONT to each.
function contAll(targets) {
    const held = targets.every((m) => allStopped(m[1]));
    for (const m of targets) {
        try {
            signalAsGuest(Number(m[1]), "SIGCONT");
        } catch {
            // gone already
        }
    }
    return held;
}

function hold(request) {
    const targets = holdTargets(request.ids);
    if (request.mode === "stop") return { op: "hold", ok: stopAll(targets) };
    if (request.mode === "cont") return { op: "hold", ok: true, held: contAll(targets) };
    throw new Error("unknown hold mode");
}

requests.hold = async (request) => answer(hold(request));
