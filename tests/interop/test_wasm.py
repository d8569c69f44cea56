"""The wasm provider through the published Python client, plimsoll-client 0.23.0 from PyPI
and unchanged, against the real plimsolld.

One daemon serves the whole module: target/debug/plimsolld (or $PLIMSOLLD) with
SANDBOX_PROVIDER=wasm, a fresh token, an ephemeral loopback port and no rate limit. Every
snippet runs through `Client.run_javascript`, which also checks the answer's run record;
after each hostile snippet `/healthz` must still answer ok and a plain snippet must still
run.

Run it with the venv that scripts/setup makes:

    tests/interop/.venv/bin/python -I tests/interop/test_wasm.py
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import sys
import time
import unittest
from typing import Dict, Optional

# The shared plimsolld_process module sits beside this file; -I leaves it off sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsolld_process import Plimsolld  # noqa: E402

# The first start on a machine compiles the guest (tens of seconds in a debug build); later
# starts load the cached artifact in well under a second.
START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 60.0
OUTPUT_CAP = 64 * 1024


class WasmDaemon(Plimsolld):
    """A running plimsolld with the wasm provider and exactly this environment (plus PATH)."""

    token: str

    def __init__(self, extra: Optional[Dict[str, str]] = None) -> None:
        env = {"SANDBOX_PROVIDER": "wasm", "SANDBOX_RATE_PER_MIN": "0"}
        env.update(extra or {})
        super().__init__(env, start_timeout=START_TIMEOUT, token=True)

    def healthz(self) -> int:
        resp, _ = self.raw("GET", "/healthz", timeout=10)
        return resp.status


class WasmProviderTest(unittest.TestCase):
    daemon: WasmDaemon
    client: pc.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = WasmDaemon()
        cls.client = pc.Client(cls.daemon.url, cls.daemon.token, request_timeout=REQUEST_TIMEOUT)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop_expecting_zero()

    def run_js(self, code: str, timeout: Optional[float] = None) -> pc.JavaScriptResult:
        return self.client.run_javascript(code, timeout=timeout)

    def assert_still_serving(self) -> None:
        self.assertEqual(self.daemon.healthz(), 200, "/healthz after the snippet")
        after = self.run_js("console.log('still here')")
        self.assertEqual((after.exit_code, after.stdout), (0, b"still here\n"))

    # --- what the daemon states --------------------------------------------------------

    def test_describe_states_wasm_at_process_with_its_guest_identity(self) -> None:
        info = self.client.describe()
        self.assertEqual((info.provider, info.isolation), ("wasm", "process"))
        env = info.javascript_environment
        self.assertTrue(env.identity.startswith("quickjs-wasm:sha256:"), env.identity)
        self.assertEqual(len(env.identity), len("quickjs-wasm:sha256:") + 64)
        self.assertEqual(env.max_timeout_ms, 30000)
        self.assertFalse(info.supports_project or info.supports_module or info.supports_sessions)
        # wire.md §9: snippets have a credential-safe grant path (host_call).
        self.assertTrue(info.supports_javascript_grants)
        self.assertFalse(info.supports_project_grants)

    def test_six_times_seven_prints_42_and_the_record_checks_out(self) -> None:
        result = self.run_js("console.log(6*7)")
        # run_javascript has already verified the record against the request it sent.
        self.assertEqual(result.stdout, b"42\n")
        self.assertEqual(result.exit_code, 0)
        self.assertFalse(result.timed_out or result.stdout_truncated or result.stderr_truncated)
        self.assertEqual((result.provider, result.isolation), ("wasm", "process"))
        identity = self.client.describe().javascript_environment.identity
        self.assertEqual(result.environment, identity)
        self.assertEqual(result.record.environment, identity)
        self.assertEqual(result.record.instance, "")

    def test_a_failing_snippet_is_a_result_with_its_exit_code(self) -> None:
        result = self.run_js("throw 'boom'")
        self.assertNotEqual(result.exit_code, 0)
        self.assertIn(b"boom", result.stderr)
        self.assertFalse(result.timed_out)

    def test_floor_container_is_refused_before_dispatch(self) -> None:
        with self.assertRaises(pc.InsufficientIsolationError) as caught:
            self.client.run_javascript("console.log('never')", minimum_isolation="container")
        self.assertEqual(caught.exception.not_dispatched, "isolation")
        self.assertEqual(caught.exception.http_status, 400)

    def test_a_module_is_unsupported_and_nothing_runs(self) -> None:
        # Modules run only in the docker provider's module image (providers.md §8).
        with self.assertRaises(pc.UnsupportedError) as caught:
            self.client.run_module("damped-oscillator", [[1.0, 0.1, 1.0, 0.0]], end_time=1.0, step=0.5)
        self.assertEqual(caught.exception.not_dispatched, "unsupported")
        self.assert_still_serving()

    # --- hostile snippets ---------------------------------------------------------------

    def test_infinite_loop_ends_at_the_deadline_with_124(self) -> None:
        started = time.monotonic()
        result = self.run_js("for (;;) {}", timeout=1.0)
        took = time.monotonic() - started
        self.assertEqual((result.exit_code, result.timed_out), (124, True))
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 10.0)
        self.assert_still_serving()

    def test_memory_bomb_fails_inside_the_guest_and_the_next_run_is_unaffected(self) -> None:
        result = self.run_js("const keep = []; for (;;) keep.push(new Array(1 << 20).fill(7));", timeout=30)
        self.assertNotEqual(result.exit_code, 0)
        self.assertFalse(result.timed_out)
        self.assertIn(b"out of memory", result.stderr)
        self.assert_still_serving()

    def test_ten_megabytes_of_output_are_cut_at_64_kib_and_flagged(self) -> None:
        result = self.run_js("const l = 'y'.repeat(1023); for (let i = 0; i < 10240; i++) console.log(l)", timeout=30)
        self.assertEqual(result.exit_code, 0)
        self.assertEqual(len(result.stdout), OUTPUT_CAP)
        self.assertTrue(result.stdout_truncated)
        self.assertEqual(set(result.stdout), {ord("y"), ord("\n")}, "no marker inside the kept output")
        self.assertFalse(result.stderr_truncated)
        self.assert_still_serving()

    def test_deep_recursion_ends_as_a_trap(self) -> None:
        result = self.run_js("function f(n) { return f(n + 1) + 1 } f(0)")
        self.assertNotEqual(result.exit_code, 0)
        self.assertFalse(result.timed_out)
        self.assertTrue(result.stderr)
        self.assert_still_serving()

    def test_huge_string_fails_inside_the_guest(self) -> None:
        result = self.run_js("let s = 'x'; for (;;) s += s;", timeout=30)
        self.assertNotEqual(result.exit_code, 0)
        self.assertFalse(result.timed_out)
        self.assertTrue(result.stderr)
        self.assert_still_serving()

    def test_json_parse_of_a_giant_input_is_a_typed_result(self) -> None:
        code = "const s = '[' + '{\"k\":[1,2,3]},'.repeat(3e6) + '0]'; console.log(JSON.parse(s).length)"
        result = self.run_js(code, timeout=30)
        self.assertFalse(result.timed_out)
        if result.exit_code == 0:
            self.assertEqual(result.stdout, b"3000001\n")
        else:
            self.assertIn(b"memory", result.stderr)
        self.assert_still_serving()

    def test_files_cannot_be_read_through_wasi(self) -> None:
        probes = [
            "console.log(typeof require, typeof process, typeof std, typeof os, typeof fetch)",
            "await import('/etc/passwd')",
            "await import('file:///etc/hostname')",
        ]
        first = self.run_js(probes[0])
        self.assertEqual(first.stdout, b"undefined undefined undefined undefined undefined\n")
        for code in probes[1:]:
            result = self.run_js(code)
            self.assertNotEqual(result.exit_code, 0, code)
            self.assertNotIn(b"root:", result.stdout + result.stderr)
        self.assert_still_serving()

    def test_a_long_run_does_not_hold_up_a_quick_one(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            slow = pool.submit(self.run_js, "for (;;) {}", 3.0)
            time.sleep(0.2)
            started = time.monotonic()
            quick = pool.submit(self.run_js, "console.log('quick')")
            self.assertEqual(quick.result(timeout=30).stdout, b"quick\n")
            self.assertLess(time.monotonic() - started, 2.0)
            self.assertFalse(slow.done(), "the quick run returned first")
            self.assertTrue(slow.result(timeout=30).timed_out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
