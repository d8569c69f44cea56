"""The dockercloud provider through the published Python client, plimsoll-client 0.23.0 from
PyPI and unchanged, against the real plimsolld on the Docker Cloud simulator.

No Docker account is reachable here: the daemon talks to tests/simulators/dockercloud
(target/debug/dockercloud-simulator, built by `cargo build --workspace`; its fidelity is checked
by Docker's published SDK), whose sandboxes are local containers under each runtime
PLIMSOLL_TEST_DOCKER_RUNTIMES names. The client runs a snippet, a timed-out snippet, an output
flood and a project, verifying each record; then each seal fault of the simulator (a policy
that is not deny-all, one more allowed network, a booted digest other than the pinned one)
must refuse the run as not dispatched (environment), and the quota as capacity; SIGTERM must
end the daemon cleanly with no sandbox left.

Docker and the simulator's sandbox image are required: when missing the test FAILS unless
PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_dockercloud.py
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time
import unittest
import urllib.request
from typing import Any, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsoll_client import errors  # noqa: E402
import simulated  # noqa: E402
from plimsolld_process import Plimsolld  # noqa: E402
from simulated import REQUEST_TIMEOUT, RUNTIMES, START_TIMEOUT  # noqa: E402

SANDBOX_IMAGE = "plimsoll-sim/dockercloud-sandbox:latest"
SIMULATOR = simulated.simulator_binary("dockercloud-simulator")


def problem() -> str:
    return simulated.problem(SANDBOX_IMAGE, "tests/simulators/dockercloud/image/build", SIMULATOR)


class Simulator(simulated.Simulator):
    """The Docker Cloud simulator, with its admin API."""

    def __init__(self, runtime: str) -> None:
        super().__init__(SIMULATOR, ["--exit-on-stdin-eof", "--runtime", runtime])

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.ready["admin_url"] + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            return json.loads(answer.read())

    def faults(self, **faults: Any) -> None:
        self.admin("PUT", "/faults", faults)

    def names(self) -> List[str]:
        return [s["name"] for s in self.admin("GET", "/state")["sandboxes"]]

    def wait_empty(self, bound: float = 60.0) -> None:
        deadline = time.monotonic() + bound
        while self.names():
            if time.monotonic() > deadline:
                raise AssertionError(f"sandboxes left: {self.names()}")
            time.sleep(0.2)


class DockerCloudInteropTest(unittest.TestCase):

    def setUp(self) -> None:
        simulated.require(self, problem())

    def test_runs_seal_faults_and_drain_in_simulated_sandboxes(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                sim = Simulator(runtime)
                try:
                    self.one_runtime(sim, runtime)
                finally:
                    sim.stop()

    def one_runtime(self, sim: Simulator, runtime: str) -> None:
        ready = sim.ready
        self.assertEqual(ready["runtime"], runtime)
        image = ready["images"][0]
        pinned = image["reference"].rsplit(":", 1)[0] + "@" + image["digest"]
        daemon = Plimsolld(
            {
                "SANDBOX_PROVIDER": "dockercloud",
                "DOCKER_SBX_USERNAME": ready["username"],
                "DOCKER_SBX_TOKEN": ready["token"],
                "SANDBOX_DOCKERCLOUD_AUTH_URL": ready["auth_url"],
                "SANDBOX_DOCKERCLOUD_API_URL": ready["api_url"],
                "SANDBOX_DOCKERCLOUD_POLICY_URL": ready["policy_url"],
                "SANDBOX_DOCKERCLOUD_API": "connect",
                "SANDBOX_DOCKERCLOUD_IMAGE": pinned,
                "SANDBOX_REQUIRE_PINNED_IMAGES": "1",
                "SANDBOX_MEMORY_MB": "1024",
            },
            start_timeout=START_TIMEOUT,
            stop_timeout=90.0,
            token=True,
        )
        try:
            client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
            info = client.describe()
            self.assertEqual((info.provider, info.isolation), ("dockercloud", "vm"))
            self.assertTrue(info.supports_project)
            result = client.run_javascript("console.log(6*7)", minimum_isolation="kernel")
            self.assertEqual((result.stdout, result.stderr, result.exit_code), (b"42\n", b"", 0))
            self.assertEqual((result.provider, result.isolation), ("dockercloud", "vm"))
            self.assertEqual(result.record.environment, "dockercloud-image:" + pinned)
            self.assertRegex(result.record.instance, re.compile(r"^dockercloud-sandbox:[A-Za-z0-9_-]+$"))
            timed = client.run_javascript("for (;;) {}", timeout=2, minimum_isolation="vm")
            self.assertEqual((timed.exit_code, timed.timed_out), (124, True))
            flood = client.run_javascript("process.stdout.write('x'.repeat(1 << 20))", minimum_isolation="vm")
            self.assertTrue(flood.stdout_truncated)
            self.assertEqual(len(flood.stdout), 64 * 1024)
            project = client.run_project(
                [("main.js", "console.log(require('./lib/answer.js'))"), ("lib/answer.js", "module.exports = 42")],
                ["node main.js > out.txt", "cat out.txt"],
                ["out.txt"],
                minimum_isolation="vm",
            )
            self.assertEqual(project.outcome, "completed", project.detail)
            self.assertEqual(project.steps[1].stdout, b"42\n")
            self.assertEqual([(a.path, a.content) for a in project.artifacts], [("out.txt", b"42\n")])
            # Each seal fault: refused, nothing ran, the sandbox deleted.
            for faults in (
                {"policy_not_deny_all": True},
                {"extra_allowed_network": "example.com:443"},
                {"booted_digest": "sha256:" + "0" * 64},
            ):
                sim.faults(**faults)
                with self.assertRaises(errors.PlimsollError) as caught:
                    client.run_javascript("console.log('ran')", minimum_isolation="vm")
                self.assertEqual(caught.exception.not_dispatched, "environment", f"{faults}: {caught.exception}")
                sim.wait_empty()
            sim.faults(quota_reached=True)
            with self.assertRaises(errors.AtCapacityError) as caught:
                client.run_javascript("console.log('ran')", minimum_isolation="vm")
            self.assertEqual(caught.exception.not_dispatched, "capacity")
            sim.faults()
        finally:
            code = daemon.stop()
        self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))
        sim.wait_empty()


if __name__ == "__main__":
    unittest.main(verbosity=2)
