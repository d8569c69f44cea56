// plimsoll's session agent, the hold on kept interpreters (providers.md §9.3 "Grants", and
// around project calls), in-process. Put after guest/same.js (for `same`) and
// agent.js (for `signalAsGuest`, `answer`, `requests`) at build time. The request is
//
//   {"op":"hold","mode":"stop"|"cont","ids":["pid:starttime:cmdlinehex",…]}
//
// stop: SIGSTOP to each named process that is still that process, then up to 2 s until every
//   thread of each is stopped; answers {"op":"hold","ok":true} only then.
// cont: answers {"op":"hold","ok":true,"held":<whether each was still stopped>} and sends
//   SIGCONT to each.
const HOLD_WAIT_MS = 2000;
const HOLD_POLL_MS = 5;

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

function hold(request) {
    const targets = request.ids
        .map((id) => /^([0-9]+):(-?[0-9]+):([0-9a-f]+)$/.exec(String(id)))
        .filter((m) => m !== null && same(m));
    if (request.mode === "stop") {
        for (const m of targets) {
            try {
                signalAsGuest(Number(m[1]), "SIGSTOP");
            } catch {
                return { op: "hold", ok: false };
            }
        }
        const until = Date.now() + HOLD_WAIT_MS;
        for (;;) {
            if (targets.every((m) => allStopped(m[1]))) return { op: "hold", ok: true };
            if (Date.now() >= until) return { op: "hold", ok: false };
            Atomics.wait(pause, 0, 0, HOLD_POLL_MS);
        }
    }
    if (request.mode === "cont") {
        const held = targets.every((m) => allStopped(m[1]));
        for (const m of targets) {
            try {
                signalAsGuest(Number(m[1]), "SIGCONT");
            } catch {
                // gone already
            }
        }
        return { op: "hold", ok: true, held };
    }
    throw new Error("unknown hold mode");
}

requests.hold = async (request) => answer(hold(request));
