"""The e2b provider through the published Python client, plimsoll-client 0.23.0 from PyPI and
unchanged, against the real plimsolld on the E2B simulator.

No E2B account is reachable here: the daemon talks to tests/simulators/e2b
(target/debug/e2b-simulator, built by `cargo build --workspace`; its fidelity is checked by
E2B's own SDK), whose VMs are local containers under each runtime
PLIMSOLL_TEST_DOCKER_RUNTIMES names. The client runs a snippet, a timed-out snippet and a
project; it verifies each run record against the request it sent and the floor against the
answer (a `kernel` floor is met by `vm`), and the test checks what the records state:
provider e2b, tier vm, the template as the environment, an `e2b-sandbox:` instance. A caller
whose own daily paid allowance (clients file) cannot cover a run gets the client's typed
`AtCapacityError`, not dispatched for `capacity`, while another caller runs.

Docker and the simulator's template image are required: when missing the test FAILS unless
PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_e2b.py
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import secrets
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsoll_client.workspace import Workspace  # noqa: E402
import simulated  # noqa: E402
from plimsolld_process import Plimsolld  # noqa: E402
from simulated import REQUEST_TIMEOUT, RUNTIMES, START_TIMEOUT  # noqa: E402

TEMPLATE_IMAGE = "plimsoll-sim/e2b-base:latest"
SIMULATOR = simulated.simulator_binary("e2b-simulator")


def problem() -> str:
    return simulated.problem(TEMPLATE_IMAGE, "scripts/setup-e2b-simulator", SIMULATOR)


class Simulator(simulated.Simulator):
    """The E2B simulator."""

    def __init__(self, runtime: str) -> None:
        super().__init__(SIMULATOR, ["--watch-stdin", "--runtime", runtime])


class E2bInteropTest(unittest.TestCase):

    def setUp(self) -> None:
        simulated.require(self, problem())

    def test_snippets_and_a_project_in_simulated_microvms_with_verified_records(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                sim = Simulator(runtime)
                try:
                    ready = sim.ready
                    self.assertEqual(ready["runtime"], runtime)
                    # Caller "thrifty" may spend 60 paid seconds a day, caller "main" has no
                    # allowance of its own.
                    thrifty, main = secrets.token_hex(32), secrets.token_hex(32)
                    clients_dir = tempfile.TemporaryDirectory()
                    self.addCleanup(clients_dir.cleanup)
                    clients_file = pathlib.Path(clients_dir.name) / "clients.json"
                    clients_file.write_text(json.dumps({"clients": [
                        {"id": "thrifty", "token_sha256": hashlib.sha256(thrifty.encode()).hexdigest(),
                         "scopes": ["code:run"], "paid_seconds_per_day": 60},
                        {"id": "main", "token_sha256": hashlib.sha256(main.encode()).hexdigest(),
                         "scopes": ["code:run"]},
                    ]}))
                    daemon = Plimsolld(
                        {
                            "SANDBOX_PROVIDER": "e2b",
                            "E2B_API_KEY": ready["apiKey"],
                            "E2B_API_URL": ready["api"],
                            "E2B_SANDBOX_URL": ready["envd"],
                            "E2B_TEMPLATE": "base",
                            "PLIMSOLL_CLIENTS_FILE": str(clients_file),
                        },
                        start_timeout=START_TIMEOUT,
                        stop_timeout=90.0,
                    )
                    try:
                        # 30 s + the 33 s teardown bound is over thrifty's 60: refused, typed.
                        capped = pc.Client(daemon.url, thrifty, request_timeout=REQUEST_TIMEOUT)
                        with self.assertRaises(pc.AtCapacityError) as refused:
                            capped.run_javascript("console.log('must not run')", timeout=30)
                        self.assertEqual(refused.exception.not_dispatched, "capacity")
                        self.assertIn("paid_seconds_per_day=60", refused.exception.message)
                        client = pc.Client(daemon.url, main, request_timeout=REQUEST_TIMEOUT)
                        info = client.describe()
                        self.assertEqual((info.provider, info.isolation), ("e2b", "vm"))
                        self.assertTrue(info.supports_project)
                        result = client.run_javascript("console.log(6*7)", minimum_isolation="kernel")
                        self.assertEqual((result.stdout, result.stderr, result.exit_code), (b"42\n", b"", 0))
                        self.assertEqual((result.provider, result.isolation), ("e2b", "vm"))
                        self.assertEqual(result.record.environment, "e2b-template:base")
                        self.assertRegex(result.record.instance, re.compile(r"^e2b-sandbox:[a-z0-9]+$"))
                        timed = client.run_javascript("for (;;) {}", timeout=1.5, minimum_isolation="vm")
                        self.assertEqual((timed.exit_code, timed.timed_out), (124, True))
                        project = client.run_project(
                            [("main.js", "console.log(require('./lib.js'))"), ("lib.js", "module.exports = 42")],
                            ["node main.js > out.txt", "cat out.txt"],
                            ["out.txt"],
                            minimum_isolation="vm",
                        )
                        self.assertEqual(project.outcome, "completed", project.detail)
                        self.assertEqual(project.steps[1].stdout, b"42\n")
                        self.assertEqual([(a.path, a.content) for a in project.artifacts], [("out.txt", b"42\n")])
                    finally:
                        code = daemon.stop()
                    self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))
                finally:
                    sim.stop()

    def test_a_workspace_session_keeps_files_in_one_microvm_and_sweeps_leftovers(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                sim = Simulator(runtime)
                try:
                    ready = sim.ready
                    daemon = Plimsolld(
                        {
                            "SANDBOX_PROVIDER": "e2b",
                            "E2B_API_KEY": ready["apiKey"],
                            "E2B_API_URL": ready["api"],
                            "E2B_SANDBOX_URL": ready["envd"],
                            "E2B_TEMPLATE": "base",
                            "SANDBOX_MAX_SESSIONS": "2",
                        },
                        start_timeout=START_TIMEOUT,
                        stop_timeout=90.0,
                        token=True,
                    )
                    try:
                        client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                        self.assertTrue(client.describe().supports_sessions)
                        with Workspace(client.open_session(minimum_isolation="vm", owner="agent")) as ws:
                            ws.write("notes/plan.txt", "kept across calls\n")
                            ran = ws.exec("cat notes/plan.txt && echo 41 > n.txt")
                            self.assertEqual((ran.exit_code, ran.stdout), (0, b"kept across calls\n"), ran.stderr_text)
                            s = ws.session
                            self.assertEqual((s.provider, s.isolation), ("e2b", "vm"))
                            left = s.run_javascript(
                                "require('child_process').spawn('sleep', ['4242'], {detached: true, stdio: 'ignore'}).unref();"
                                "console.log(require('os').userInfo().username)"
                            )
                            self.assertEqual((left.stdout, left.exit_code), (b"user\n", 0), left.stderr)
                            self.assertRegex(left.record.instance, r"^e2b-sandbox:[a-z0-9]+$")
                            swept = s.run_javascript(
                                "const fs = require('fs'); console.log(fs.readdirSync('/proc').filter(p => /^[0-9]+$/.test(p))"
                                ".filter(p => { try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('4242'); }"
                                " catch { return false; } }).length)"
                            )
                            self.assertEqual(swept.stdout, b"0\n", swept.stderr)
                            self.assertEqual(swept.record.instance, left.record.instance, "one VM")
                            # Cells keep their interpreter's state between calls, as `user`.
                            first = s.run_cell("import os\nx = 41\nprint(os.getuid() != 0)", "python")
                            self.assertEqual((first.stdout, first.interpreter_started), (b"True\n", True), first)
                            kept = s.run_cell("x + 1", "python")
                            self.assertEqual((kept.stdout, kept.exit_code, kept.interpreter_started), (b"42\n", 0, False), kept)
                            s.run_cell("let y = 6", "javascript")
                            js = s.run_cell("y * 7", "javascript")
                            self.assertEqual((js.stdout, js.interpreter_started), (b"42\n", False), js)
                            self.assertEqual(ws.read("n.txt"), b"41\n")
                    finally:
                        code = daemon.stop()
                    self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))
                finally:
                    sim.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
