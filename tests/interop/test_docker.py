"""The docker provider through the published Python client, plimsoll-client 0.23.0 from PyPI
and unchanged, against the real plimsolld.

For each runtime this machine's docker registers (runc always; runsc when
PLIMSOLL_TEST_DOCKER_RUNTIMES names it, as scripts/test-docker does), one daemon with
SANDBOX_PROVIDER=docker runs `6*7` through `Client.run_javascript`, which verifies the run
record against the request it sent; the test then checks what the record states: provider
docker, the runtime's tier, the snippet image's content id as the environment, and a typed
`docker-container:` instance.

Docker and the images (scripts/setup-docker, images/build) are required: when they are
missing the test FAILS unless PLIMSOLL_TEST_DOCKER_SKIP=1. The images are those images/build
tags under PLIMSOLL_IMAGE_PREFIX (default plimsoll), and every daemon here is given them.

Run it with the venv that scripts/setup makes:

    tests/interop/.venv/bin/python -I tests/interop/test_docker.py
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import unittest
from typing import Dict, Optional

# The shared plimsolld_process module sits beside this file; -I leaves it off sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsolld_process import Plimsolld  # noqa: E402

PREFIX = os.environ.get("PLIMSOLL_IMAGE_PREFIX") or "plimsoll"
SNIPPET_IMAGE = f"{PREFIX}/sandbox-node:latest"
PROJECT_IMAGE = f"{PREFIX}/sandbox:latest"
START_TIMEOUT = 120.0
REQUEST_TIMEOUT = 60.0
TIERS = {"runc": "container", "runsc": "kernel"}
RUNTIMES = [r for r in os.environ.get("PLIMSOLL_TEST_DOCKER_RUNTIMES", "runc runsc").split() if r]


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def docker_problem() -> Optional[str]:
    try:
        if docker("version", "--format", "{{.Server.Version}}").returncode != 0:
            return "docker does not answer; run scripts/setup-docker"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker is not usable ({e}); run scripts/setup-docker"
    for image in (SNIPPET_IMAGE, PROJECT_IMAGE):
        if docker("image", "inspect", image).returncode != 0:
            return f"image {image} is missing; run images/build"
    return None


class DockerDaemon(Plimsolld):
    """A running plimsolld with the docker provider and exactly this environment (plus PATH)."""

    token: str

    def __init__(self, runtime: str, extra: Optional[Dict[str, str]] = None) -> None:
        env = {
            "SANDBOX_PROVIDER": "docker",
            "SANDBOX_DOCKER_IMAGE": SNIPPET_IMAGE,
            "SANDBOX_DOCKER_PROJECT_IMAGE": PROJECT_IMAGE,
            **(extra or {}),
        }
        if runtime != "runc":
            env["SANDBOX_DOCKER_RUNTIME"] = runtime
        super().__init__(env, start_timeout=START_TIMEOUT, stop_timeout=60.0, token=True)


class NeedsDocker(unittest.TestCase):
    """Fails each test when docker or an image is missing, unless PLIMSOLL_TEST_DOCKER_SKIP=1."""

    def setUp(self) -> None:
        problem = docker_problem()
        if problem is None:
            return
        if os.environ.get("PLIMSOLL_TEST_DOCKER_SKIP") == "1":
            self.skipTest(f"PLIMSOLL_TEST_DOCKER_SKIP=1: {problem}")
        self.fail(f"{problem} (set PLIMSOLL_TEST_DOCKER_SKIP=1 to skip on a developer machine)")


class DockerInteropTest(NeedsDocker):

    def test_six_times_seven_under_each_runtime_with_a_verified_record(self) -> None:
        image_id = docker("image", "inspect", "--format", "{{.Id}}", SNIPPET_IMAGE).stdout.strip()
        self.assertTrue(image_id.startswith("sha256:"), image_id)
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = DockerDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    info = client.describe()
                    self.assertEqual((info.provider, info.isolation), ("docker", TIERS[runtime]))
                    self.assertEqual(info.javascript_environment.identity, image_id)
                    # run_javascript verifies the record against the request it sent, and the
                    # floor against the answer's tier.
                    result = client.run_javascript("console.log(6*7)", minimum_isolation=TIERS[runtime])
                    self.assertEqual((result.stdout, result.stderr, result.exit_code), (b"42\n", b"", 0))
                    self.assertFalse(result.timed_out or result.stdout_truncated or result.stderr_truncated)
                    self.assertEqual((result.provider, result.isolation), ("docker", TIERS[runtime]))
                    self.assertEqual((result.environment, result.record.environment), (image_id, image_id))
                    self.assertRegex(result.record.instance, re.compile(r"docker-container:[0-9a-f]{64}"))
                    timed = client.run_javascript("for (;;) {}", timeout=1.0)
                    self.assertEqual((timed.exit_code, timed.timed_out), (124, True))
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_the_golden_project_and_a_failing_step_with_verified_records(self) -> None:
        image_id = docker("image", "inspect", "--format", "{{.Id}}", PROJECT_IMAGE).stdout.strip()
        self.assertTrue(image_id.startswith("sha256:"), image_id)
        files = [("main.js", "console.log(require('./lib.js'))"), ("lib.js", "module.exports = 42")]
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = DockerDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    info = client.describe()
                    self.assertTrue(info.supports_project)
                    self.assertEqual(info.project_environment.identity, image_id)
                    self.assertEqual(info.project_environment.max_timeout_ms, 120_000)
                    self.assertIn("javascript", info.project_environment.languages)
                    # run_project verifies the record against the request it sent.
                    result = client.run_project(
                        files,
                        ["node main.js > out.txt", "cat out.txt"],
                        ["out.txt"],
                        minimum_isolation=TIERS[runtime],
                    )
                    self.assertEqual(result.outcome, "completed", result.detail)
                    self.assertEqual([s.exit_code for s in result.steps], [0, 0])
                    self.assertEqual(result.steps[1].stdout, b"42\n")
                    self.assertEqual([(a.path, a.content) for a in result.artifacts], [("out.txt", b"42\n")])
                    self.assertFalse(result.artifacts_truncated)
                    self.assertEqual((result.environment, result.record.environment), (image_id, image_id))
                    stopped = client.run_project({}, ["true", "exit 3", "echo never"])
                    self.assertEqual(stopped.outcome, "completed")
                    self.assertEqual([s.exit_code for s in stopped.steps], [0, 3])
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))


if __name__ == "__main__":
    unittest.main(verbosity=2)
