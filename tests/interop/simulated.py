"""What the interop tests of a daemon on a vendor's simulator (e2b, dockercloud, openshell)
share: the runtimes, the simulator's binary and its ready line, and the rule that a missing
docker, image or simulator fails the test unless PLIMSOLL_TEST_DOCKER_SKIP=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import unittest
from typing import Any, Dict, List

from plimsolld_process import ROOT

START_TIMEOUT = 180.0
REQUEST_TIMEOUT = 90.0
RUNTIMES = [r for r in os.environ.get("PLIMSOLL_TEST_DOCKER_RUNTIMES", "runc runsc").split() if r]


def simulator_binary(name: str) -> pathlib.Path:
    """target/debug/<name>, built by `cargo build --workspace`."""
    return pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target") / "debug" / name


def problem(image: str, fix: str, simulator: pathlib.Path) -> str:
    """Why the test cannot run (docker, `image` or `simulator` missing), or ""."""
    try:
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60).returncode:
            return f"image {image} is missing; run {fix}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker is not usable ({e}); run scripts/setup-docker"
    if not simulator.is_file():
        return f"{simulator} is missing; run cargo build --workspace"
    return ""


def require(test: unittest.TestCase, why: str) -> None:
    """Fails `test` with `why`, or skips it when PLIMSOLL_TEST_DOCKER_SKIP=1; nothing when ""."""
    if not why:
        return
    if os.environ.get("PLIMSOLL_TEST_DOCKER_SKIP") == "1":
        test.skipTest(f"PLIMSOLL_TEST_DOCKER_SKIP=1: {why}")
    test.fail(f"{why} (set PLIMSOLL_TEST_DOCKER_SKIP=1 to skip on a developer machine)")


class Simulator:
    """A simulator process; it stops (and removes its containers) when its stdin closes."""

    def __init__(self, binary: pathlib.Path, args: List[str]) -> None:
        self.proc = subprocess.Popen([str(binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"{binary.name} exited before it was ready")
        self.ready: Dict[str, Any] = json.loads(line)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
