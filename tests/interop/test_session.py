"""Sessions on docker through the published Python client, plimsoll-client 0.23.0 from PyPI
and unchanged, against the real plimsolld (wire.md §7, records.md §7).

For each runtime (runc always; runsc when PLIMSOLL_TEST_DOCKER_RUNTIMES names it, as
scripts/test does), one daemon with SANDBOX_PROVIDER=docker and sessions on serves a session
through `Client.open_session`: a snippet writes a file, a project reads it, a snippet reads
the project's output; the client checks every record's chain as it goes and the close
totals against its own. A session past its lifetime reports `expired`, marked as not run. The
client's `Workspace` persists a tree from one session and hydrates it into a new one. A daemon
with a warm pool serves a python-hinted open from a member.

Docker and the images (scripts/setup-docker, images/build) are required: when they are
missing the test FAILS unless PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_session.py
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True

import plimsoll_client as pc  # noqa: E402
from plimsoll_client.workspace import Workspace  # noqa: E402
from test_docker import RUNTIMES, TIERS, DockerDaemon, NeedsDocker, docker  # noqa: E402

REQUEST_TIMEOUT = 60.0


class SessionDaemon(DockerDaemon):
    """plimsolld with the docker provider, sessions on and a fresh token."""

    def __init__(self, runtime: str) -> None:
        super().__init__(runtime, {"SANDBOX_MAX_SESSIONS": "4", "SANDBOX_RATE_PER_MIN": "0"})


def wait_for_member(test: unittest.TestCase, daemon: DockerDaemon, within: float = 120.0) -> None:
    """Waits until `daemon`'s Describe shows a warm pool member ready to be claimed."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {daemon.token}"}
    until = time.monotonic() + within
    while time.monotonic() < until:
        resp, body = daemon.raw("POST", "/plimsoll.v1.SandboxService/Describe", b"{}", headers)
        test.assertEqual(resp.status, 200, body)
        if json.loads(body).get("sessionPool", {}).get("warm"):
            return
        time.sleep(0.25)
    test.fail(f"the pool was not refilled within {within} s; log:\n" + "\n".join(daemon.log))


class SessionInteropTest(NeedsDocker):
    def test_a_session_keeps_files_chains_records_and_closes_with_matching_totals(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = SessionDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    info = client.describe()
                    self.assertTrue(info.supports_sessions)
                    with client.open_session(minimum_isolation=TIERS[runtime], owner="interop-user") as s:
                        self.assertEqual((s.provider, s.isolation), ("docker", TIERS[runtime]))
                        wrote = s.run_javascript("require('fs').writeFileSync('/work/n.txt', '20'); console.log('ok')")
                        self.assertEqual((wrote.stdout, wrote.exit_code), (b"ok\n", 0))
                        self.assertEqual(wrote.record.sequence, 1)
                        project = s.run_project(
                            {"double.py": "print(int(open('n.txt').read()) * 2)\nopen('out.txt', 'w').write('done')\n"},
                            ["python3 double.py"],
                        )
                        self.assertEqual(project.outcome, "completed", project.detail)
                        self.assertEqual(project.steps[0].stdout, b"40\n")
                        read = s.run_javascript("console.log(require('fs').readFileSync('/work/out.txt', 'utf8'))")
                        self.assertEqual(read.stdout, b"done\n")
                        self.assertEqual(read.record.sequence, 3)
                        self.assertEqual(read.record.previous_sha256, project.record.sha256)
                        self.assertEqual(s.calls, 3)
                        last = s.last_record_sha256
                    summary = s.close()
                    self.assertEqual((summary.calls, summary.last_record_sha256, summary.end), (3, last, "closed"))
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_a_workspace_persisted_in_one_session_hydrates_into_a_new_one(self) -> None:
        """The work directory belongs to the guest (issue 15, item 4): the published client's
        `Workspace` sets the mode and times of `/work` itself, writes a tree with its own
        modes, persists it, and hydrates it into a NEW session, whose `tar -x` restores the
        directory's mode and times; the files read back with their modes. Fails on main
        before the fix, where `/work` is root's and the guest may neither chmod nor utime it
        (`tar: .: Cannot utime: Operation not permitted`)."""
        listing = "stat -c '%a %Y %n' bin bin/run.sh notes.txt secret/key"
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = SessionDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    with Workspace(client.open_session(minimum_isolation=TIERS[runtime])) as first:
                        first.write("notes.txt", "kept across sessions\n")
                        first.write("bin/run.sh", "echo ran from $(pwd)\n")
                        first.write("secret/key", "k")
                        made = first.exec(
                            "chmod 0755 bin/run.sh && chmod 0600 secret/key && chmod 0700 secret && "
                            "touch -d @1600000000 notes.txt && chmod 0750 . && touch -d @1700000000 . && "
                            "stat -c '%a %Y' . && " + listing
                        )
                        self.assertEqual(made.exit_code, 0, made.stderr_text)
                        top, before = made.stdout_text.split("\n", 1)
                        self.assertEqual(top, "750 1700000000")
                        saved = first.persist()
                    with Workspace(client.open_session(minimum_isolation=TIERS[runtime])) as second:
                        self.assertEqual(second.glob("**/*"), [], "a new session starts empty")
                        second.hydrate(saved)
                        self.assertEqual(second.read("notes.txt"), b"kept across sessions\n")
                        self.assertEqual(second.read("secret/key"), b"k")
                        after = second.exec("stat -c '%a %Y %u' . && id -u && " + listing)
                        self.assertEqual(after.exit_code, 0, after.stderr_text)
                        top, uid, rest = after.stdout_text.split("\n", 2)
                        self.assertEqual(rest, before)
                        mode, mtime, owner = top.split()
                        # tar, extracting as a non-root user without -p, keeps the special
                        # bits of a directory that already exists (the fresh /work's sticky
                        # bit) and restores the permission bits and the times.
                        self.assertEqual((int(mode, 8) & 0o777, mtime, owner), (0o750, "1700000000", uid))
                        ran = second.exec("sh bin/run.sh && chmod 0700 . && touch -d @1500000000 . && stat -c '%a %Y' .")
                        self.assertEqual(ran.exit_code, 0, ran.stderr_text)
                        self.assertEqual(ran.stdout_text, f"ran from {second.root}\n700 1500000000\n")
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_cells_keep_their_state_across_workspace_exec(self) -> None:
        """Interpreters survive project calls (issue 15, item 5): an agent that alternates the
        published client's `Workspace` operations (each one project call) with cells keeps its
        notebook state; the cells after `Workspace.exec`, `write` and `read` say no fresh
        interpreter started. Fails on main, where every project call ended the interpreters."""
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = SessionDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    session = client.open_session(minimum_isolation=TIERS[runtime])
                    with Workspace(session) as ws:
                        first = session.run_cell("rows = [1, 2, 3]\nlen(rows)")
                        self.assertEqual((first.stdout, first.exit_code), (b"3\n", 0), first.stderr)
                        self.assertTrue(first.interpreter_started)
                        js = session.run_cell("let seen = 6 * 7", language="javascript")
                        self.assertEqual(js.exit_code, 0, js.stderr)
                        ran = ws.exec("echo hi")
                        self.assertEqual((ran.exit_code, ran.stdout_text), (0, "hi\n"), ran.stderr_text)
                        after = session.run_cell("rows.append(4)\nsum(rows)")
                        self.assertEqual((after.stdout, after.exit_code), (b"10\n", 0), after.stderr)
                        self.assertFalse(after.interpreter_started)
                        ws.write("data.txt", "from the workspace\n")
                        read = session.run_cell("open('data.txt').read().strip() + ' ' + str(len(rows))")
                        self.assertEqual(read.stdout, b"'from the workspace 4'\n", read.stderr)
                        self.assertFalse(read.interpreter_started)
                        self.assertEqual(ws.read("data.txt"), b"from the workspace\n")
                        js_after = session.run_cell("seen", language="javascript")
                        self.assertEqual((js_after.stdout, js_after.interpreter_started), (b"42\n", False))
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_a_hinted_open_is_served_by_a_warm_pool_member(self) -> None:
        """SANDBOX_SESSION_POOL (providers.md 9.8): the client's `languages` hint reaches the
        pool; the session is a member made before the open, its python interpreter already
        running, and the client reads Describe with the pool in it unchanged."""
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = DockerDaemon(
                    runtime,
                    {"SANDBOX_MAX_SESSIONS": "2", "SANDBOX_SESSION_POOL": "1", "SANDBOX_RATE_PER_MIN": "0"},
                )
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    self.assertTrue(client.describe().supports_sessions)
                    # The startup proof took the first member: wait for the refill.
                    wait_for_member(self, daemon)
                    with client.open_session(minimum_isolation=TIERS[runtime], languages=["python"]) as s:
                        cell = s.run_cell("6 * 7")
                        self.assertEqual((cell.stdout, cell.exit_code), (b"42\n", 0))
                        self.assertTrue(cell.interpreter_started)
                        container = cell.record.instance.removeprefix("docker-container:")
                        label = docker("inspect", "--format", '{{index .Config.Labels "io.plimsoll.pool"}}', container)
                        self.assertEqual(label.returncode, 0, label.stderr)
                        self.assertEqual(label.stdout.strip(), "javascript,python")
                    self.assertEqual(s.close().end, "closed")
                    served = [line for line in daemon.log if "session served by a warm pool member" in line]
                    # The startup proof's session, then this open.
                    self.assertEqual(len(served), 2, "\n".join(daemon.log))
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_an_expired_session_reports_its_end(self) -> None:
        runtime = RUNTIMES[0]
        daemon = SessionDaemon(runtime)
        try:
            client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
            s = client.open_session(lifetime=2.0)
            s.run_javascript("console.log(1)")
            time.sleep(4.0)
            with self.assertRaises(pc.SessionEndedError) as raised:
                s.run_javascript("console.log(2)")
            self.assertEqual(raised.exception.reason, "expired")
            self.assertIsNotNone(raised.exception.not_dispatched)
            summary = s.close()
            self.assertEqual((summary.calls, summary.end), (1, "expired"))
        finally:
            code = daemon.stop()
        self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))


if __name__ == "__main__":
    unittest.main(verbosity=2)
