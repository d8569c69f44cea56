"""The simulator's fidelity, judged by E2B's own Python SDK: `e2b` 2.63.0 from PyPI,
unmodified (tests/simulators/e2b/.venv, made by scripts/setup-e2b-simulator), pointed at
target/debug/e2b-simulator the way E2B documents for its own test doubles: E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN.

For each runtime in PLIMSOLL_TEST_DOCKER_RUNTIMES (default "runc runsc") one simulator runs
the SDK's own calls: a secure create, commands (users, exit codes, a timeout, a background
process killed), files written and read, listing by metadata with pages, pause and
resume, a guarded network config whose header reaches a loopback server and never the
guest, and kill. Docker and the template image are required: missing ones FAIL the test
unless PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/simulators/e2b/.venv/bin/python -I tests/simulators/e2b/fidelity/test_sdk.py
"""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import unittest
import uuid

sys.dont_write_bytecode = True

from e2b import Sandbox, SandboxQuery, SandboxState  # noqa: E402
from e2b.exceptions import (  # noqa: E402
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException  # noqa: E402
from e2b.sandbox.network import ALL_TRAFFIC  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[4]
BINARY = pathlib.Path(os.environ.get("E2B_SIMULATOR") or ROOT / "target" / "debug" / "e2b-simulator")
TEMPLATE_IMAGE = "plimsoll-sim/e2b-base:latest"
RUNTIMES = [r for r in os.environ.get("PLIMSOLL_TEST_DOCKER_RUNTIMES", "runc runsc").split() if r]
GUARD = "guard.fidelity.test"
TOKEN = "crg_" + "ab" * 32


def problem() -> str | None:
    from importlib.metadata import version

    if version("e2b") != "2.63.0":
        return f"e2b {version('e2b')} is installed, not 2.63.0; run scripts/setup-e2b-simulator"
    if not BINARY.is_file():
        return f"{BINARY} is missing; run cargo build --workspace"
    try:
        if subprocess.run(["docker", "version"], capture_output=True, timeout=60).returncode != 0:
            return "docker does not answer; run scripts/setup-docker"
        if subprocess.run(["docker", "image", "inspect", TEMPLATE_IMAGE], capture_output=True, timeout=60).returncode != 0:
            return f"{TEMPLATE_IMAGE} is missing; run scripts/setup-e2b-simulator"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker is not usable: {e}"
    return None


class Recorder(http.server.BaseHTTPRequestHandler):
    """The loopback stand-in for plimsoll's guard: records headers, answers 200."""

    seen: list = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        Recorder.seen.append({"path": self.path, "guard": self.headers.get("X-Plimsoll-Guard"), "body": body.decode()})
        answer = b'{"guard":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


class Simulator:
    """target/debug/e2b-simulator under one runtime; stopped (VMs removed) by stop()."""

    def __init__(self, runtime: str, guard_port: int) -> None:
        self.process = subprocess.Popen(
            [str(BINARY), "--watch-stdin", "--runtime", runtime, "--host", f"{GUARD}=http://127.0.0.1:{guard_port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("e2b-simulator exited before listening")
        self.info = json.loads(line)

    def environment(self) -> dict:
        return {
            "E2B_API_URL": self.info["api"],
            "E2B_SANDBOX_URL": self.info["envd"],
            "E2B_API_KEY": self.info["apiKey"],
            "E2B_DOMAIN": self.info["domain"],
        }

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def suite_for(runtime: str):
    class Fidelity(unittest.TestCase):
        sim: Simulator
        server: http.server.HTTPServer

        @classmethod
        def setUpClass(cls) -> None:
            cls.server = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
            threading.Thread(target=cls.server.serve_forever, daemon=True).start()
            cls.sim = Simulator(runtime, cls.server.server_address[1])
            cls.saved = {k: os.environ.get(k) for k in cls.sim.environment()}
            os.environ.update(cls.sim.environment())

        @classmethod
        def tearDownClass(cls) -> None:
            cls.sim.stop()
            cls.server.shutdown()
            for k, v in cls.saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=io.plimsoll.simulator.instance={cls.sim.info['instance']}"],
                capture_output=True, text=True, timeout=60,
            ).stdout.split()
            assert not left, f"the simulator left containers: {left}"

        def test_secure_create_commands_and_files(self) -> None:
            self.assertEqual(self.sim.info["runtime"], runtime)
            sbx = Sandbox.create(secure=True, timeout=120, metadata={"suite": "fidelity"})
            try:
                self.assertIsNotNone(sbx._envd_access_token)
                info = sbx.get_info()
                self.assertEqual(info.state, SandboxState.RUNNING)
                self.assertEqual(info.metadata, {"suite": "fidelity"})
                self.assertEqual((info.cpu_count, info.memory_mb), (2, 512))

                r = sbx.commands.run("echo hello && id -un && pwd")
                self.assertEqual((r.stdout, r.exit_code, r.error), ("hello\nuser\n/home/user\n", 0, None))
                self.assertEqual(sbx.commands.run("id -u", user="root").stdout, "0\n")
                r = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp")
                self.assertEqual(r.stdout, "hi\n/tmp\n")
                with self.assertRaises(CommandExitException) as failed:
                    sbx.commands.run("echo bad >&2; exit 3")
                self.assertEqual((failed.exception.exit_code, failed.exception.stderr), (3, "bad\n"))
                with self.assertRaises(TimeoutException):
                    sbx.commands.run("sleep 30", timeout=2)
                handle = sbx.commands.run("sleep 60", background=True)
                self.assertIn(handle.pid, [p.pid for p in sbx.commands.list()])
                self.assertTrue(handle.kill())
                with self.assertRaises(CommandExitException) as killed:
                    handle.wait()
                self.assertEqual(killed.exception.exit_code, -1)
                self.assertEqual(killed.exception.error, "signal: killed")

                info = sbx.files.write("/home/user/project/src/main.py", "print('hi')\n")
                self.assertEqual((info.path, info.name), ("/home/user/project/src/main.py", "main.py"))
                self.assertEqual(sbx.files.read("/home/user/project/src/main.py"), "print('hi')\n")
                self.assertEqual(sbx.commands.run("python3 project/src/main.py").stdout, "hi\n")
                written = sbx.files.write_files([
                    {"path": "/tmp/a.bin", "data": b"\x00\x01"},
                    {"path": "rel/b.txt", "data": "b"},
                ])
                self.assertEqual([w.path for w in written], ["/tmp/a.bin", "/home/user/rel/b.txt"])
                self.assertEqual(bytes(sbx.files.read("/tmp/a.bin", format="bytes")), b"\x00\x01")
                sbx.files.write("/root/secret", "root only", user="root")
                self.assertEqual(sbx.files.read("/root/secret", user="root"), "root only")
                with self.assertRaises(CommandExitException):
                    sbx.commands.run("cat /root/secret")
                with self.assertRaises(NotFoundException):
                    sbx.files.read("/no/such/file")
                self.assertTrue(sbx.is_running())
            finally:
                sbx.kill()

        def test_list_by_metadata_in_pages(self) -> None:
            tag = uuid.uuid4().hex
            made = [Sandbox.create(metadata={"run": tag, "odd key": "a&b=c"}) for _ in range(3)]
            other = Sandbox.create(metadata={"run": "other"})
            try:
                paginator = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "odd key": "a&b=c"}), limit=2)
                pages = []
                while paginator.has_next:
                    pages.append([s.sandbox_id for s in paginator.next_items()])
                self.assertEqual([len(p) for p in pages], [2, 1])
                listed = [i for p in pages for i in p]
                self.assertEqual(listed, [s.sandbox_id for s in reversed(made)])
                made[0].pause()
                paused = Sandbox.list(query=SandboxQuery(metadata={"run": tag}, state=[SandboxState.PAUSED])).next_items()
                self.assertEqual([s.sandbox_id for s in paused], [made[0].sandbox_id])
            finally:
                for s in made + [other]:
                    Sandbox.kill(s.sandbox_id)

        def test_pause_resume_keeps_files_and_kill_ends_it(self) -> None:
            sbx = Sandbox.create(timeout=120)
            sbx.files.write("/home/user/kept.txt", "kept")
            self.assertTrue(sbx.pause())
            self.assertFalse(sbx.is_running())
            self.assertEqual(sbx.get_info().state, SandboxState.PAUSED)
            resumed = Sandbox.connect(sbx.sandbox_id)
            self.assertTrue(resumed.is_running())
            self.assertEqual(resumed.files.read("/home/user/kept.txt"), "kept")
            self.assertEqual(resumed.commands.run("echo again").stdout, "again\n")
            self.assertTrue(resumed.kill())
            self.assertFalse(Sandbox.kill(sbx.sandbox_id))
            self.assertFalse(resumed.is_running())
            with self.assertRaises(SandboxException):
                Sandbox.get_info(sbx.sandbox_id)

        def test_guarded_network_header_reaches_the_guard_not_the_guest(self) -> None:
            network = {
                "deny_out": [ALL_TRAFFIC],
                "allow_out": [GUARD],
                "rules": {GUARD: [{"transform": {"headers": {"X-Plimsoll-Guard": TOKEN}}}]},
            }
            sbx = Sandbox.create(timeout=120, network=network)
            try:
                Recorder.seen.clear()
                probe = (
                    "for (const u of ['https://%s/v1/e2b/guard', 'https://example.com/']) {"
                    " try { const r = await fetch(u, {method: 'POST', body: '{}', signal: AbortSignal.timeout(4000)});"
                    " console.log(r.status); } catch (e) { console.log('blocked'); } }" % GUARD
                )
                sbx.files.write("/tmp/probe.mjs", probe)
                r = sbx.commands.run("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt node /tmp/probe.mjs")
                self.assertEqual(r.stdout, "200\nblocked\n")
                self.assertEqual(len(Recorder.seen), 1)
                self.assertEqual(Recorder.seen[0]["guard"], TOKEN)
                look = sbx.commands.run("t=abababab; env; grep -rsl \"$t$t$t$t\" /home /tmp /etc /run; echo end", user="root")
                self.assertNotIn(TOKEN[4:40], look.stdout)
                info = sbx.get_info()
                self.assertEqual(info.network["allow_out"], [GUARD])
                sbx.update_network({"deny_out": ["0.0.0.0/0"]})
                r = sbx.commands.run("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt node /tmp/probe.mjs")
                self.assertEqual(r.stdout, "blocked\nblocked\n")
            finally:
                sbx.kill()

        def test_stdin_and_the_traffic_token(self) -> None:
            # What plimsoll's held cells and creates rest on: a process started with stdin
            # open, fed by SendInput and ended by CloseStdin; and a create with public traffic
            # off answers a traffic access token.
            sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
            try:
                self.assertTrue(sbx.traffic_access_token)
                self.assertIs(sbx.get_info().network.get("allow_public_traffic"), False)
                handle = sbx.commands.run("cat", background=True, stdin=True)
                sbx.commands.send_stdin(handle.pid, "one\n")
                sbx.commands.send_stdin(handle.pid, b"two\n")
                sbx.commands.close_stdin(handle.pid)
                result = handle.wait()
                self.assertEqual((result.stdout, result.exit_code), ("one\ntwo\n", 0))
            finally:
                sbx.kill()

        def test_no_dns_servers_means_no_name_resolves_but_the_name_still_matches(self) -> None:
            # dns_servers [] (the SDK sends it as dnsServers): the guard's name no longer
            # resolves in the VM, and a client that connects to an address of its own with
            # that name still reaches the guard, which E2B matches by name.
            network = {
                "deny_out": [ALL_TRAFFIC],
                "allow_out": [GUARD],
                "dns_servers": [],
                "rules": {GUARD: [{"transform": {"headers": {"X-Plimsoll-Guard": TOKEN}}}]},
            }
            sbx = Sandbox.create(timeout=120, network=network)
            try:
                self.assertEqual(sbx.get_info().network.get("dns_servers"), [])
                Recorder.seen.clear()
                probe = (
                    "const https = require('https');"
                    " const lookup = (h, o, cb) => o && o.all ? cb(null, [{address: '127.0.0.1', family: 4}]) : cb(null, '127.0.0.1', 4);"
                    " const go = (extra) => new Promise((ok) => { const r = https.request(Object.assign({host: '%s', path: '/v1/e2b/guard', method: 'POST', timeout: 4000}, extra), (res) => { res.resume(); ok(String(res.statusCode)); }); r.on('error', (e) => ok(e.code || 'error')); r.on('timeout', () => r.destroy()); r.end('{}'); });"
                    " (async () => { console.log(await go({})); console.log(await go({lookup})); })();" % GUARD
                )
                sbx.files.write("/tmp/named.cjs", probe)
                r = sbx.commands.run("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt node /tmp/named.cjs")
                lines = r.stdout.splitlines()
                self.assertEqual(len(lines), 2, r.stdout)
                self.assertIn(lines[0], ("ENOTFOUND", "EAI_AGAIN"), r.stdout)
                self.assertEqual(lines[1], "200", r.stdout)
                self.assertEqual(len(Recorder.seen), 1)
            finally:
                sbx.kill()

    Fidelity.__name__ = Fidelity.__qualname__ = f"Fidelity_{runtime}"
    return Fidelity


def load_tests(loader, tests, pattern):
    suite = unittest.TestSuite()
    for runtime in RUNTIMES:
        suite.addTests(loader.loadTestsFromTestCase(suite_for(runtime)))
    return suite


if __name__ == "__main__":
    why = problem()
    if why:
        if os.environ.get("PLIMSOLL_TEST_DOCKER_SKIP") == "1":
            print(f"PLIMSOLL_TEST_DOCKER_SKIP=1: skipping: {why}")
            sys.exit(0)
        print(f"e2b fidelity: {why}", file=sys.stderr)
        sys.exit(1)
    started = time.monotonic()
    result = unittest.main(exit=False, verbosity=2).result
    print(f"e2b fidelity: {time.monotonic() - started:.0f} s")
    sys.exit(0 if result.wasSuccessful() else 1)
