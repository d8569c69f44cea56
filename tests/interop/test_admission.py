"""Admission through the published Python client, plimsoll-client 0.23.0 from PyPI and
unchanged, against the real plimsolld (issue 6, wire.md §8.3).

The daemon is target/debug/plimsolld (or $PLIMSOLLD) with SANDBOX_PROVIDER=wasm, a fresh
token, a run cap of 1, no per-caller cap and no rate limit, on ephemeral loopback ports.
A busy loop holds the one slot until its deadline; a second run meanwhile must come back
as the client's AtCapacityError, marked not dispatched for capacity.

Run it with the venv that scripts/setup makes:

    tests/interop/.venv/bin/python -I tests/interop/test_admission.py
"""

from __future__ import annotations

import pathlib
import sys
import threading
import time
import unittest
from typing import Dict

# The shared plimsolld_process module sits beside this file; -I leaves it off sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsolld_process import Plimsolld  # noqa: E402

# The first start on a machine compiles the guest (tens of seconds in a debug build).
START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 60.0
SLOW_RUN_S = 3.0


class CappedDaemon(Plimsolld):
    """plimsolld with the wasm provider and one run slot, metrics on loopback."""

    token: str

    def __init__(self) -> None:
        env = {
            "SANDBOX_PROVIDER": "wasm",
            "PLIMSOLL_METRICS_ADDR": "127.0.0.1:0",
            "SANDBOX_MAX_CONCURRENT": "1",
            "SANDBOX_PER_KEY_CONCURRENT": "0",
            "SANDBOX_RATE_PER_MIN": "0",
        }
        super().__init__(env, start_timeout=START_TIMEOUT, token=True)

    def inflight(self) -> float:
        _, body = self.raw("GET", "/metrics", timeout=10, addr=self.line["metrics_addr"])
        text = body.decode()
        for line in text.splitlines():
            if line.startswith("plimsoll_inflight "):
                return float(line.split()[1])
        raise AssertionError("no plimsoll_inflight sample:\n" + text)

    def wait_inflight(self, n: int, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while self.inflight() != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"plimsoll_inflight did not reach {n} within {within} s")
            time.sleep(0.01)


class AdmissionTest(unittest.TestCase):
    daemon: CappedDaemon
    client: pc.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = CappedDaemon()
        cls.client = pc.Client(cls.daemon.url, cls.daemon.token, request_timeout=REQUEST_TIMEOUT)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop_expecting_zero()

    def test_a_run_beside_a_full_cap_raises_at_capacity_marked_not_dispatched(self) -> None:
        slow: Dict[str, pc.JavaScriptResult] = {}
        holder = threading.Thread(
            target=lambda: slow.update(result=self.client.run_javascript("for (;;) {}", timeout=SLOW_RUN_S))
        )
        holder.start()
        self.daemon.wait_inflight(1)
        started = time.monotonic()
        with self.assertRaises(pc.AtCapacityError) as caught:
            self.client.run_javascript("console.log('never')")
        took = time.monotonic() - started
        err = caught.exception
        self.assertEqual(err.not_dispatched, "capacity")
        self.assertEqual(err.code, "resource_exhausted")
        self.assertEqual(err.http_status, 429)
        self.assertIn("at capacity", str(err))
        self.assertLess(took, 1.0, "refused at once, not after the slow run")
        holder.join(REQUEST_TIMEOUT)
        self.assertFalse(holder.is_alive())
        self.assertEqual((slow["result"].exit_code, slow["result"].timed_out), (124, True))
        # The slot came back with the sandbox: the next run is admitted.
        self.assertEqual(self.client.run_javascript("console.log(6*7)").stdout, b"42\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
