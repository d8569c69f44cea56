"""The openshell provider through the published Python client, plimsoll-client 0.23.0 from
PyPI and unchanged, against the real plimsolld on the OpenShell gateway simulator.

No OpenShell gateway is reachable here: the daemon talks to tests/simulators/openshell
(target/debug/openshell-simulator, built by `cargo build --workspace`), whose sandboxes are
local containers under each runtime PLIMSOLL_TEST_DOCKER_RUNTIMES names. The client runs a
snippet, a timed-out snippet and a project; it verifies each run record against the request
it sent and the floor `container` against the answer, and the test checks what the records
state: provider openshell, tier container, the image as the environment, an
`openshell-sandbox:` instance, and `Describe`'s policy digest.

Docker and the project image are required: when missing the test FAILS unless
PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_openshell.py
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
import simulated  # noqa: E402
from plimsolld_process import Plimsolld  # noqa: E402
from simulated import REQUEST_TIMEOUT, RUNTIMES, START_TIMEOUT  # noqa: E402

PREFIX = os.environ.get("PLIMSOLL_IMAGE_PREFIX") or "plimsoll"
PROJECT_IMAGE = f"{PREFIX}/sandbox:latest"
SIMULATOR = simulated.simulator_binary("openshell-simulator")


def problem() -> str:
    return simulated.problem(PROJECT_IMAGE, "images/build", SIMULATOR)


class Simulator(simulated.Simulator):
    """The gateway simulator; its certificates go to `cert_dir`."""

    def __init__(self, runtime: str, cert_dir: str) -> None:
        super().__init__(SIMULATOR, ["--cert-dir", cert_dir, "--runtime", runtime, "--exit-on-stdin-eof"])


class OpenShellInteropTest(unittest.TestCase):

    def setUp(self) -> None:
        simulated.require(self, problem())

    def test_snippets_and_a_project_on_the_simulated_gateway_with_verified_records(self) -> None:
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime), tempfile.TemporaryDirectory() as certs:
                sim = Simulator(runtime, certs)
                try:
                    ready = sim.ready
                    daemon = Plimsolld(
                        {
                            "SANDBOX_PROVIDER": "openshell",
                            "SANDBOX_OPENSHELL_GATEWAY_URL": ready["grpc_url"],
                            "SANDBOX_OPENSHELL_CA_FILE": ready["ca_file"],
                            "SANDBOX_OPENSHELL_CERT_FILE": ready["cert_file"],
                            "SANDBOX_OPENSHELL_KEY_FILE": ready["key_file"],
                            "SANDBOX_OPENSHELL_IMAGE": PROJECT_IMAGE,
                        },
                        start_timeout=START_TIMEOUT,
                        stop_timeout=90.0,
                        token=True,
                    )
                    try:
                        client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                        info = client.describe()
                        self.assertEqual((info.provider, info.isolation), ("openshell", "container"))
                        self.assertRegex(info.policy, re.compile(r"^openshell-policy:sha256:[0-9a-f]{64}$"))
                        self.assertTrue(info.supports_project)
                        result = client.run_javascript("console.log(6*7)", minimum_isolation="container")
                        self.assertEqual((result.stdout, result.stderr, result.exit_code), (b"42\n", b"", 0))
                        self.assertEqual((result.provider, result.isolation), ("openshell", "container"))
                        self.assertEqual(result.record.environment, f"openshell-image:{PROJECT_IMAGE}")
                        self.assertRegex(result.record.instance, re.compile(r"^openshell-sandbox:\S+$"))
                        self.assertEqual(result.record.policy, info.policy)
                        timed = client.run_javascript("for (;;) {}", timeout=1.5)
                        self.assertEqual((timed.exit_code, timed.timed_out), (124, True))
                        project = client.run_project(
                            [("main.js", "console.log(require('./lib.js'))"), ("lib.js", "module.exports = 42")],
                            ["node main.js > out.txt", "cat out.txt"],
                            ["out.txt"],
                            minimum_isolation="container",
                        )
                        self.assertEqual(project.outcome, "completed", project.detail)
                        self.assertEqual(project.steps[1].stdout, b"42\n")
                        self.assertEqual([(a.path, a.content) for a in project.artifacts], [("out.txt", b"42\n")])
                        with self.assertRaises(pc.InsufficientIsolationError):
                            client.run_javascript("1", minimum_isolation="kernel")
                    finally:
                        code = daemon.stop()
                    self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))
                finally:
                    sim.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
