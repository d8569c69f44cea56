"""Sessions on the openshell provider through the published Python client, plimsoll-client
0.23.0 from PyPI and unchanged, against the real plimsolld on the OpenShell gateway simulator
(wire.md §7, providers.md §9, grants.md §8).

For each runtime PLIMSOLL_TEST_DOCKER_RUNTIMES names, one simulator and one daemon with
sessions on and SANDBOX_MAX_CONCURRENT=1, so the tests can see who holds the only slot:

- through the client's `Workspace` (how agents use sessions): files written by one call are
  read by later calls, snippets included; a process a call leaves running is gone by the next
  call (the sweep); the open session holds the slot (a one-shot run is shed); closing deletes
  the gateway sandbox;
- an idle session is stopped on the gateway (`StopSandbox`) and gives its slot back (a
  one-shot run then goes through); the next call starts it again with its files;
- cells (Python and JavaScript) keep their interpreter's state from call to call; after a
  stop and start the next cell runs in a fresh interpreter and says so;
- a sandbox that dies ends the session as `main_process_ended`, reported to the next call;
- SIGTERM ends every session and leaves no sandbox on the gateway.

The simulator's admin endpoint tells the gateway's side (which sandboxes exist, their
phase) and kills a sandbox on demand. Docker and the project image are required: when missing
the test FAILS unless PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_openshell_session.py
"""

from __future__ import annotations

import http.client
import json
import pathlib
import sys
import tempfile
import time
import unittest
from typing import Callable, Dict, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True

import plimsoll_client as pc  # noqa: E402
from plimsoll_client.workspace import Workspace  # noqa: E402
import simulated  # noqa: E402
from plimsolld_process import Plimsolld  # noqa: E402
from test_openshell import PROJECT_IMAGE, RUNTIMES, START_TIMEOUT, Simulator, problem  # noqa: E402

REQUEST_TIMEOUT = 90.0
# The bound on waiting for the gateway to reach a state (a stop, a delete in the background).
SETTLE = 60.0


class Admin:
    """The simulator's admin endpoint (plain HTTP on loopback)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").rpartition(":")
        self.host, self.port = host, int(port)

    def _call(self, method: str, path: str) -> object:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
        try:
            conn.request(method, path, body=b"" if method == "POST" else None)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise AssertionError(f"admin {method} {path}: {resp.status} {body!r}")
            return json.loads(body)
        finally:
            conn.close()

    def sandboxes(self) -> List[Dict[str, str]]:
        state = self._call("GET", "/state")
        assert isinstance(state, dict)
        return list(state["sandboxes"])

    def by_instance(self, instance: str) -> List[Dict[str, str]]:
        """The sandboxes whose id the record's `openshell-sandbox:<id>` instance names."""
        sandbox_id = instance.removeprefix("openshell-sandbox:")
        return [s for s in self.sandboxes() if s["id"] == sandbox_id]

    def kill(self, name: str) -> None:
        self._call("POST", f"/sandboxes/{name}/kill")

    def wait_for(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + SETTLE
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not reach {what} within {SETTLE} s: {self.sandboxes()}")
            time.sleep(0.2)


def start_daemon(ready: Dict[str, str]) -> Plimsolld:
    return Plimsolld(
        {
            "SANDBOX_PROVIDER": "openshell",
            "SANDBOX_OPENSHELL_GATEWAY_URL": ready["grpc_url"],
            "SANDBOX_OPENSHELL_CA_FILE": ready["ca_file"],
            "SANDBOX_OPENSHELL_CERT_FILE": ready["cert_file"],
            "SANDBOX_OPENSHELL_KEY_FILE": ready["key_file"],
            "SANDBOX_OPENSHELL_IMAGE": PROJECT_IMAGE,
            "SANDBOX_MAX_SESSIONS": "4",
            "SANDBOX_MAX_CONCURRENT": "1",
            "SANDBOX_RATE_PER_MIN": "0",
        },
        start_timeout=START_TIMEOUT,
        stop_timeout=90.0,
        token=True,
    )


def sandboxes_have_yama(runtime: str) -> bool:
    """Whether the simulator's sandboxes see Yama's ptrace_scope at 1 or more: gVisor's own
    kernel does; under runc they see the host's."""
    if runtime == "runsc":
        return True
    try:
        return int(pathlib.Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()) >= 1
    except (OSError, ValueError):
        return False


def until_admitted(call: Callable[[], object]) -> object:
    """`call`, again while it is shed for capacity (a one-shot run's sandbox is deleted in
    the background while its slot is held); a shed call ran nothing."""
    deadline = time.monotonic() + SETTLE
    while True:
        try:
            return call()
        except pc.AtCapacityError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class OpenShellSessionTest(unittest.TestCase):
    def setUp(self) -> None:
        simulated.require(self, problem())

    def test_sessions_keep_files_stop_when_idle_end_typed_and_drain(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime), tempfile.TemporaryDirectory() as certs:
                sim = Simulator(runtime, certs)
                try:
                    admin = Admin(sim.ready["admin_url"])
                    if not sandboxes_have_yama(runtime):
                        # Sessions on openshell fail closed without Yama (grants.md §8.6).
                        with self.assertRaises(RuntimeError) as refused:
                            start_daemon(sim.ready)
                        self.assertIn("Yama ptrace_scope", str(refused.exception))
                        self.assertEqual(admin.sandboxes(), [], "the refused start leaves no sandbox")
                        continue
                    daemon = start_daemon(sim.ready)
                    try:
                        client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                        self.assertTrue(client.describe().supports_sessions)
                        self.check_workspace(client, admin)
                        self.check_suspend_and_resume(client, admin)
                        self.check_a_dead_sandbox_ends_the_session(client, admin)
                        # Left open for the drain.
                        s = until_admitted(lambda: client.open_session(minimum_isolation="container"))
                        left = s.run_javascript("console.log('left open')")
                        self.assertEqual(len(admin.by_instance(left.record.instance)), 1)
                    finally:
                        code = daemon.stop()
                    self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))
                    self.assertEqual(admin.sandboxes(), [], "the drain leaves no sandbox on the gateway")
                finally:
                    sim.stop()

    def check_workspace(self, client: pc.Client, admin: Admin) -> None:
        with Workspace(client.open_session(minimum_isolation="container", owner="agent")) as ws:
            ws.write("notes/plan.txt", "kept across calls\n")
            ran = ws.exec("cat notes/plan.txt && echo 41 > n.txt")
            self.assertEqual((ran.exit_code, ran.stdout), (0, b"kept across calls\n"), ran.stderr_text)
            self.assertEqual(ws.root, "/tmp/work", "the only writable place the policy leaves")
            s = ws.session
            self.assertEqual((s.provider, s.isolation), ("openshell", "container"))
            # A snippet runs in the work directory and sees what the project calls wrote.
            snippet = s.run_javascript(
                "const fs = require('fs'); console.log(Number(fs.readFileSync('n.txt', 'utf8')) + 1);"
                "require('child_process').spawn('sleep', ['4242'], {detached: true, stdio: 'ignore'}).unref();"
            )
            self.assertEqual((snippet.stdout, snippet.exit_code), (b"42\n", 0), snippet.stderr)
            self.assertEqual((snippet.provider, snippet.isolation), ("openshell", "container"))
            self.assertRegex(snippet.record.instance, r"^openshell-sandbox:\S+$")
            # The sweep after that call killed what it left running.
            swept = s.run_javascript(
                "const fs = require('fs'); const left = fs.readdirSync('/proc').filter(p => /^[0-9]+$/.test(p))"
                ".filter(p => { try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('4242'); }"
                " catch { return false; } }); console.log(left.length)"
            )
            self.assertEqual(swept.stdout, b"0\n", swept.stderr)
            self.assertEqual(ws.read("notes/plan.txt"), b"kept across calls\n")
            # The open session holds the only slot.
            with self.assertRaises(pc.AtCapacityError):
                client.run_javascript("console.log(1)")
            instance = swept.record.instance
            self.assertEqual(len(admin.by_instance(instance)), 1)
            calls = s.calls
        self.assertGreaterEqual(calls, 5)
        # Closing (the context's end) waits for the delete.
        self.assertEqual(admin.by_instance(instance), [], "the closed session's sandbox is deleted")

    def check_suspend_and_resume(self, client: pc.Client, admin: Admin) -> None:
        s = until_admitted(lambda: client.open_session(minimum_isolation="container", idle_timeout=1.0))
        wrote = s.run_javascript("require('fs').writeFileSync('kept.txt', 'through a stop'); console.log('ok')")
        self.assertEqual(wrote.stdout, b"ok\n", wrote.stderr)
        instance = wrote.record.instance
        # Cells keep their interpreter's state between calls.
        first = s.run_cell("x = 41", "python")
        self.assertTrue(first.interpreter_started, first)
        kept = s.run_cell("x + 1", "python")
        self.assertEqual((kept.stdout, kept.exit_code, kept.interpreter_started), (b"42\n", 0, False), kept)
        s.run_cell("let y = 6", "javascript")
        js = s.run_cell("y * 7", "javascript")
        self.assertEqual((js.stdout, js.interpreter_started), (b"42\n", False), js)

        def phase() -> str:
            found = admin.by_instance(instance)
            return found[0]["phase"] if found else "gone"

        admin.wait_for("a stopped session sandbox", lambda: phase() == "SANDBOX_PHASE_STOPPED")
        # Stopped, the session holds no slot: a one-shot run is admitted.
        oneshot = client.run_javascript("console.log('one-shot')")
        self.assertEqual(oneshot.stdout, b"one-shot\n")
        read = until_admitted(lambda: s.run_javascript("console.log(require('fs').readFileSync('kept.txt', 'utf8'))"))
        self.assertEqual((read.stdout, read.exit_code), (b"through a stop\n", 0), read.stderr)
        self.assertEqual(read.record.instance, instance, "the same sandbox, started again")
        # The stop ended the interpreter: the next cell starts a fresh one, which says so.
        fresh = s.run_cell("print('x' in dir())", "python")
        self.assertEqual((fresh.stdout, fresh.interpreter_started), (b"False\n", True), fresh)
        # Stopped again, then closed as it is: the delete is confirmed before the answer.
        admin.wait_for("a stopped session sandbox", lambda: phase() == "SANDBOX_PHASE_STOPPED")
        summary = s.close()
        self.assertEqual((summary.calls, summary.end), (7, "closed"))
        self.assertEqual(phase(), "gone")

    def check_a_dead_sandbox_ends_the_session(self, client: pc.Client, admin: Admin) -> None:
        s = until_admitted(lambda: client.open_session(minimum_isolation="container"))
        first = s.run_javascript("console.log(1)")
        found = admin.by_instance(first.record.instance)
        self.assertEqual(len(found), 1)
        admin.kill(found[0]["name"])
        with self.assertRaises(pc.SessionEndedError) as raised:
            s.run_javascript("console.log(2)")
        self.assertEqual(raised.exception.reason, "main_process_ended")
        self.assertIsNotNone(raised.exception.not_dispatched)
        summary = s.close()
        self.assertEqual((summary.calls, summary.end), (1, "main_process_ended"))
        self.assertEqual(admin.by_instance(first.record.instance), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
