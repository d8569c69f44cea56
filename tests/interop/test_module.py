"""Module runs on docker through the published Python client, plimsoll-client 0.23.0 from PyPI
and unchanged: `Client.run_module(model, rows, end_time=, step=)` against the real plimsolld
with the module image (images/module/build), under each runtime this machine's docker
registers (runc always; runsc when PLIMSOLL_TEST_DOCKER_RUNTIMES names it).

Every answer's record is verified by the client itself. The models' results are checked
against values computed here, independently of the models' code: the damped oscillator's
closed forms, the bouncing ball's exact flights between impacts, and for Lotka-Volterra a
reference Runge-Kutta integration with a step 25 times finer plus the orbit's conserved
quantity. Beside them: a failing row among rows that succeed, an unknown model, a table of
the wrong width, the results budget (refused before dispatch), a model that loops forever
(stopped at the run's deadline) and one that allocates without bound (stopped by the memory
limit).

Docker and the images (scripts/setup-docker, images/build) are required: when they are
missing the test FAILS unless PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_module.py
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time
import unittest
from typing import Callable, List, Sequence, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True

import plimsoll_client as pc  # noqa: E402
from test_docker import PREFIX, RUNTIMES, TIERS, DockerDaemon, NeedsDocker, docker, docker_problem  # noqa: E402

# The module image images/build tags under PLIMSOLL_IMAGE_PREFIX, beside the others.
MODULE_IMAGE = f"{PREFIX}/sandbox-module:latest"
REQUEST_TIMEOUT = 120.0
DEADLINE = -1002
MEMORY = -1003


def times(end_time: float, step: float, steps: int) -> List[float]:
    """The grid's output times (docs/modules.md): k·step, the last exactly end_time."""
    return [end_time if k == steps else k * step for k in range(1, steps + 1)]


def oscillator(omega: float, zeta: float, x0: float, v0: float, t: float) -> Tuple[float, float]:
    """x'' + 2ζωx' + ω²x = 0 in closed form: under-, critically and over-damped."""
    if zeta < 1:
        wd = omega * math.sqrt(1 - zeta * zeta)
        a, b = x0, (v0 + zeta * omega * x0) / wd
        decay = math.exp(-zeta * omega * t)
        c, s = math.cos(wd * t), math.sin(wd * t)
        x = decay * (a * c + b * s)
        v = -zeta * omega * x + decay * (-a * wd * s + b * wd * c)
        return x, v
    if zeta == 1:
        b = v0 + omega * x0
        decay = math.exp(-omega * t)
        return (x0 + b * t) * decay, (b - omega * (x0 + b * t)) * decay
    root = math.sqrt(zeta * zeta - 1)
    r1, r2 = -omega * (zeta - root), -omega * (zeta + root)
    b = (v0 - r1 * x0) / (r2 - r1)
    a = x0 - b
    return a * math.exp(r1 * t) + b * math.exp(r2 * t), a * r1 * math.exp(r1 * t) + b * r2 * math.exp(r2 * t)


REST_SPEED = 1e-6  # the bouncing-ball model's documented rest rule


def ball(h0: float, v0: float, g: float, e: float, t: float) -> Tuple[float, float, int]:
    """The ball at time t, from its impacts in closed form: each flight is a parabola, each
    impact reverses the speed times e; a rebound slower than REST_SPEED leaves it at rest."""
    h, v, bounces, now = h0, v0, 0, 0.0
    while True:
        speed = math.sqrt(v * v + 2 * g * h)
        impact = now + (v + speed) / g
        if impact > t:
            dt = t - now
            return h + v * dt - g * dt * dt / 2, v - g * dt, bounces
        now, h = impact, 0.0
        if e * speed < REST_SPEED:
            return 0.0, 0.0, bounces
        v, bounces = e * speed, bounces + 1


def lotka_volterra(p: Sequence[float], ts: Sequence[float], dt: float) -> List[Tuple[float, float]]:
    """A reference integration: classic RK4 with a fixed step dt, sampled at ts."""
    alpha, beta, delta, gamma, x, y = p

    def f(x: float, y: float) -> Tuple[float, float]:
        return alpha * x - beta * x * y, delta * x * y - gamma * y

    out, now = [], 0.0
    for target in ts:
        n = max(1, round((target - now) / dt))
        h = (target - now) / n
        for _ in range(n):
            k1 = f(x, y)
            k2 = f(x + h / 2 * k1[0], y + h / 2 * k1[1])
            k3 = f(x + h / 2 * k2[0], y + h / 2 * k2[1])
            k4 = f(x + h * k3[0], y + h * k3[1])
            x += h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
            y += h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        out.append((x, y))
        now = target
    return out


def conserved(p: Sequence[float], x: float, y: float) -> float:
    alpha, beta, delta, gamma = p[:4]
    return delta * x - gamma * math.log(x) + beta * y - alpha * math.log(y)


class ModuleChecks:
    """The checks, run against one daemon per runtime (see the classes made below)."""

    runtime = "runc"
    daemon: DockerDaemon
    client: pc.Client
    assertEqual: Callable
    assertTrue: Callable

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = None  # type: ignore[assignment]
        if docker_problem() is not None or docker("image", "inspect", MODULE_IMAGE).returncode != 0:
            return  # each test fails (or skips) in NeedsDocker.setUp with the reason
        cls.daemon = DockerDaemon(
            cls.runtime, {"SANDBOX_DOCKER_MODULE_IMAGE": MODULE_IMAGE, "SANDBOX_RATE_PER_MIN": "0"}
        )
        cls.client = pc.Client(cls.daemon.url, cls.daemon.token, request_timeout=REQUEST_TIMEOUT)

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.daemon is not None:
            cls.daemon.stop_expecting_zero()

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        if docker("image", "inspect", MODULE_IMAGE).returncode != 0:
            problem = f"image {MODULE_IMAGE} is missing; run images/build"
            if os.environ.get("PLIMSOLL_TEST_DOCKER_SKIP") == "1":
                self.skipTest(problem)  # type: ignore[attr-defined]
            self.fail(problem)  # type: ignore[attr-defined]

    def run_module(self, model: str, rows: Sequence[Sequence[float]], **kw) -> pc.ModuleResult:
        """run_module, which verifies the record against the request it sent; the answer's
        evidence is the module image on this runtime's tier."""
        result = self.client.run_module(model, rows, minimum_isolation=TIERS[self.runtime], **kw)
        self.assertEqual((result.provider, result.isolation), ("docker", TIERS[self.runtime]))
        module_id = docker("image", "inspect", "--format", "{{.Id}}", MODULE_IMAGE).stdout.strip()
        self.assertEqual((result.environment, result.record.environment), (module_id, module_id))
        return result

    def assert_close(self, got: float, want: float, tolerance: float, what: str) -> None:
        self.assertTrue(abs(got - want) <= tolerance * max(1.0, abs(want)), f"{what}: {got} != {want}")

    def test_describe_states_modules_and_the_module_image(self) -> None:
        info = self.client.describe()
        self.assertTrue(info.supports_module)
        module_id = docker("image", "inspect", "--format", "{{.Id}}", MODULE_IMAGE).stdout.strip()
        self.assertEqual(info.module_environment.identity, module_id)
        self.assertEqual(info.module_environment.max_timeout_ms, 120_000)

    def test_a_software_rule_is_checked_against_the_module_images_identity(self) -> None:
        # images/build pushes the module image to its registry and pulls it back by digest, so
        # it has a manifest identity; a rule naming it runs, one naming another is refused.
        identity = self.client.describe().module_environment.software_identity
        self.assertRegex(identity, r"^oci-manifest:linux/[a-z0-9]+@sha256:[0-9a-f]{64}$")
        row = [[1.0, 0.1, 1.0, 0.0]]
        ran = self.run_module("damped-oscillator", row, end_time=1.0, step=0.5, software=pc.SoftwareRule.exact(identity))
        self.assertEqual((ran.outcome, ran.software_identity), ("completed", identity))
        self.assertEqual(ran.record.software_identity, identity)
        other = identity[:-1] + ("0" if identity[-1] != "0" else "1")
        with self.assertRaises(pc.SoftwareMismatchError) as refused:  # type: ignore[attr-defined]
            self.client.run_module("damped-oscillator", row, end_time=1.0, step=0.5, software=pc.SoftwareRule.exact(other))
        self.assertEqual(refused.exception.not_dispatched, "environment")

    def test_the_damped_oscillator_matches_its_closed_forms(self) -> None:
        rows = [[1.0, 0.1, 1.0, 0.0], [2.0, 1.0, 0.5, -1.0], [3.0, 2.0, 0.0, 1.0], [1.5, 0.0, 1.0, 1.0]]
        result = self.run_module("damped-oscillator", rows, end_time=10.0, step=0.1)
        self.assertEqual((result.outcome, result.width, len(result.runs)), ("completed", 2, 4), result.detail)
        for row, run in zip(rows, result.runs):
            self.assertEqual(run.status, 100)
            for k, t in enumerate(times(10.0, 0.1, 100)):
                x, v = oscillator(*row, t)
                self.assert_close(run.outputs[2 * k], x, 1e-6, f"x{row} at {t}")
                self.assert_close(run.outputs[2 * k + 1], v, 1e-6, f"v{row} at {t}")

    def test_the_bouncing_ball_matches_its_exact_flights(self) -> None:
        rows = [[1.0, 0.0, 9.81, 0.8], [0.0, 5.0, 9.81, 0.5], [2.0, 1.0, 1.62, 0.9]]
        result = self.run_module("bouncing-ball", rows, end_time=5.0, step=0.05)
        self.assertEqual((result.outcome, result.width), ("completed", 3), result.detail)
        for row, run in zip(rows, result.runs):
            self.assertEqual(run.status, 100)
            for k, t in enumerate(times(5.0, 0.05, 100)):
                h, v, bounces = ball(*row, t)
                self.assert_close(run.outputs[3 * k], h, 1e-9, f"height{row} at {t}")
                self.assert_close(run.outputs[3 * k + 1], v, 1e-9, f"velocity{row} at {t}")
                self.assertEqual(run.outputs[3 * k + 2], bounces, f"bounces{row} at {t}")
        # The first ball bounces while the second rises: events, not a smooth curve.
        self.assertGreater(result.runs[0].outputs[-1], 3)  # type: ignore[attr-defined]

    def test_lotka_volterra_matches_a_reference_integration_and_keeps_its_invariant(self) -> None:
        rows = [[1.1, 0.4, 0.1, 0.4, 10.0, 10.0], [2 / 3, 4 / 3, 1.0, 1.0, 0.9, 0.9]]
        result = self.run_module("lotka-volterra", rows, end_time=20.0, step=0.5)
        self.assertEqual((result.outcome, result.width), ("completed", 2), result.detail)
        ts = times(20.0, 0.5, 40)
        for row, run in zip(rows, result.runs):
            self.assertEqual(run.status, 40)
            reference = lotka_volterra(row, ts, 4e-5)
            v0 = conserved(row, row[4], row[5])
            for k, (x, y) in enumerate(reference):
                self.assert_close(run.outputs[2 * k], x, 1e-6, f"prey{row} at {ts[k]}")
                self.assert_close(run.outputs[2 * k + 1], y, 1e-6, f"predators{row} at {ts[k]}")
                invariant = conserved(row, run.outputs[2 * k], run.outputs[2 * k + 1])
                self.assert_close(invariant, v0, 1e-8, f"invariant{row} at {ts[k]}")

    def test_a_failing_row_has_its_negative_status_beside_rows_that_succeed(self) -> None:
        rows = [[1.0, 0.1, 1.0, 0.0], [-1.0, 0.1, 1.0, 0.0], [1.0, -0.5, 1.0, 0.0], [2.0, 0.0, 1.0, 0.0]]
        result = self.run_module("damped-oscillator", rows, end_time=1.0, step=0.25)
        self.assertEqual(result.outcome, "completed", result.detail)
        self.assertEqual([r.status for r in result.runs], [4, -1, -2, 4])
        self.assertEqual([len(r.outputs) for r in result.runs], [8, 0, 0, 8])
        x, _ = oscillator(2.0, 0.0, 1.0, 0.0, 1.0)
        self.assert_close(result.runs[3].outputs[-2], x, 1e-6, "row 3 at 1.0")

    def test_non_finite_outputs_come_back_with_a_record_that_verifies(self) -> None:
        # Overflow: x and v pass the largest double, and infinity minus infinity is NaN. The
        # daemon canonicalises every NaN before hashing, and the client's own digest of the
        # answer it decoded must agree.
        result = self.run_module("damped-oscillator", [[1.0, 0.0, 1e308, 1e308]], end_time=1.0, step=0.5)
        self.assertEqual((result.outcome, result.runs[0].status), ("completed", 2), result.detail)
        self.assertTrue(any(math.isnan(v) for v in result.runs[0].outputs), result.runs[0].outputs)

    def test_an_unknown_model_or_a_table_of_the_wrong_width_is_setup_failed(self) -> None:
        unknown = self.run_module("no-such-model", [[1.0]], end_time=1.0, step=1.0)
        self.assertEqual((unknown.outcome, unknown.runs), ("setup_failed", ()))
        self.assertIn("no-such-model", unknown.detail)
        self.assertIn("damped-oscillator", unknown.detail)
        narrow = self.run_module("damped-oscillator", [[1.0, 0.1]], end_time=1.0, step=1.0)
        self.assertEqual((narrow.outcome, narrow.runs), ("setup_failed", ()))
        self.assertIn("takes 4 parameters", narrow.detail)

    def test_results_that_could_pass_the_budget_are_refused_before_dispatch(self) -> None:
        # One row of a million steps: within the wire's one-output rule (the client sends it),
        # over 8 MiB at the oscillator's two outputs (the daemon refuses it; nothing ran).
        with self.assertRaises(pc.InvalidRequestError) as raised:  # type: ignore[attr-defined]
            self.client.run_module("damped-oscillator", [[1.0, 0.1, 1.0, 0.0]], end_time=1000.0, step=0.001)
        self.assertEqual(raised.exception.not_dispatched, "request")
        self.assertIn("nothing ran", str(raised.exception))
        # The same horizon for a one-output model fits, and runs.
        fits = self.run_module("probe-grow", [[1.0]], end_time=1000.0, step=0.001)
        self.assertEqual(fits.outcome, "completed", fits.detail)

    def test_a_model_that_loops_forever_ends_at_the_deadline(self) -> None:
        started = time.monotonic()
        result = self.run_module("probe-spin", [[1.0], [2.0], [3.0]], end_time=1.0, step=1.0, timeout=3.0)
        took = time.monotonic() - started
        self.assertEqual(result.outcome, "timed_out", result.detail)
        self.assertEqual([r.status for r in result.runs], [DEADLINE] * 3)
        self.assertIn("row 0", result.detail)
        self.assertTrue(2.0 <= took < 15.0, took)

    def test_a_model_that_allocates_without_bound_is_stopped_by_the_memory_limit(self) -> None:
        rows = [[1.0], [2.0]]
        result = self.run_module("probe-grow", rows, end_time=1.0, step=1.0)
        self.assertEqual(result.outcome, "completed", result.detail)
        self.assertEqual([r.status for r in result.runs], [MEMORY, MEMORY])


# One class per runtime, each with its own daemon for all of its checks.
for _runtime in RUNTIMES:
    _name = f"ModuleOn{_runtime.capitalize()}"
    globals()[_name] = type(_name, (ModuleChecks, NeedsDocker), {"runtime": _runtime})


if __name__ == "__main__":
    unittest.main(verbosity=2)
