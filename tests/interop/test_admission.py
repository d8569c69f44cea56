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

import http.client
import json
import os
import pathlib
import secrets
import signal
import subprocess
import threading
import time
import unittest
from typing import Dict, List, Optional

import plimsoll_client as pc

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("PLIMSOLLD") or ROOT / "target" / "debug" / "plimsolld")
# The first start on a machine compiles the guest (tens of seconds in a debug build).
START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 60.0
SLOW_RUN_S = 3.0


class CappedDaemon:
    """plimsolld with the wasm provider and one run slot, metrics on loopback."""

    def __init__(self) -> None:
        if not BINARY.is_file():
            raise RuntimeError(f"{BINARY} does not exist: run `cargo build -p plimsolld` first")
        self.token = secrets.token_hex(24)
        env: Dict[str, str] = {
            "PATH": os.environ.get("PATH", ""),
            "SANDBOX_PROVIDER": "wasm",
            "PLIMSOLL_TOKEN": self.token,
            "PLIMSOLL_ADDR": "127.0.0.1:0",
            "PLIMSOLL_METRICS_ADDR": "127.0.0.1:0",
            "SANDBOX_MAX_CONCURRENT": "1",
            "SANDBOX_PER_KEY_CONCURRENT": "0",
            "SANDBOX_RATE_PER_MIN": "0",
        }
        self.log: List[str] = []
        self.line: Dict[str, object] = {}
        self._listening = threading.Event()
        self.proc = subprocess.Popen(
            [str(BINARY)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(START_TIMEOUT) or not self.line:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("plimsolld did not start listening; its log:\n" + "\n".join(self.log))
        self.url = f"http://{self.line['addr']}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            text = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(text)
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("msg") == "plimsolld listening":
                self.line = record
                self._listening.set()
        self._listening.set()

    def inflight(self) -> float:
        host, _, port = str(self.line["metrics_addr"]).rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
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

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("plimsolld did not exit within 30 s of SIGTERM")
        finally:
            self._reader.join(5)


class AdmissionTest(unittest.TestCase):
    daemon: CappedDaemon
    client: pc.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = CappedDaemon()
        cls.client = pc.Client(cls.daemon.url, cls.daemon.token, request_timeout=REQUEST_TIMEOUT)

    @classmethod
    def tearDownClass(cls) -> None:
        code = cls.daemon.stop()
        if code != 0:
            raise AssertionError(f"plimsolld exited {code} after SIGTERM; its log:\n" + "\n".join(cls.daemon.log))

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
