"""The published Python client, plimsoll-client 0.23.0 from PyPI and unchanged, against
the real plimsolld.

Each test class starts its own target/debug/plimsolld (or $PLIMSOLLD) on an ephemeral
loopback port, reads the port from the daemon's `plimsolld listening` log line, and
stops it with SIGTERM, expecting exit 0. Where the client could have refused a request
by itself, the test shows the daemon refused it: the error carries the HTTP status of
the daemon's answer (a local refusal has none), and a raw request shows the
NotDispatched detail on the wire.

Run with tests/interop/run (or scripts/test), which uses tests/interop/.venv.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import pathlib
import secrets
import sys
import tempfile
import unittest
from typing import Dict, Optional

# The shared plimsolld_process module sits beside this file; -I leaves it off sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no __pycache__ beside the tests

import plimsoll_client as pc  # noqa: E402  (from the venv's site-packages)
from plimsolld_process import Plimsolld  # noqa: E402

SERVICE = "/plimsoll.v1.SandboxService/"
REQUEST_ID = "Plimsoll-Request-Id"
NOT_DISPATCHED = "Plimsoll-Not-Dispatched"
START_TIMEOUT = 30.0
IO_TIMEOUT = 15.0


class Daemon(Plimsolld):
    """A running plimsolld with exactly the given environment (plus PATH)."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        super().__init__(env, start_timeout=START_TIMEOUT)


def connect_headers(request_id: str, token: Optional[str] = None) -> Dict[str, str]:
    h = {"Content-Type": "application/json", "Connect-Protocol-Version": "1", REQUEST_ID: request_id}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def not_dispatched_detail(body: bytes) -> Optional[bytes]:
    """The binary value of the NotDispatched detail of a Connect error body."""
    for d in json.loads(body).get("details", []):
        if d.get("type", "").rsplit("/", 1)[-1] == "plimsoll.v1.NotDispatched":
            v = d["value"]
            return base64.b64decode(v + "=" * (-len(v) % 4))
    return None


class OpenDevModeTest(unittest.TestCase):
    """The default daemon: disabled provider, tier none, no authentication."""

    daemon: Daemon
    client: pc.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon()
        cls.client = pc.Client(cls.daemon.url, request_timeout=IO_TIMEOUT)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop_expecting_zero()

    def test_describe_states_disabled_provider_tier_none_protocol_4(self) -> None:
        info = self.client.describe()
        self.assertEqual(info.provider, "disabled")
        self.assertEqual(info.isolation, "none")
        self.assertEqual(info.protocol, 4)
        self.assertEqual(info.protocol, pc.PROTOCOL)
        self.assertFalse(info.supports_sessions)

    def test_async_client_describes_too(self) -> None:
        info = asyncio.run(pc.AsyncClient(self.daemon.url, request_timeout=IO_TIMEOUT).describe())
        self.assertEqual((info.provider, info.isolation, info.protocol), ("disabled", "none", 4))

    def test_run_is_refused_as_disabled_and_not_dispatched(self) -> None:
        with self.assertRaises(pc.DisabledError) as cm:
            self.client.run_javascript("console.log(6*7)")
        e = cm.exception
        self.assertEqual(e.not_dispatched, "unsupported")
        self.assertEqual(e.code, "failed_precondition")
        self.assertEqual(e.http_status, 400)
        self.assertFalse(e.answer_not_bound)

    def test_project_run_is_refused_not_dispatched(self) -> None:
        with self.assertRaises(pc.PlimsollError) as cm:
            self.client.run_project({"main.py": "print(1)"}, ["python3 main.py"])
        self.assertEqual(cm.exception.not_dispatched, "unsupported")
        self.assertIsNotNone(cm.exception.http_status)

    def test_floor_above_the_tier_is_refused_by_the_daemon(self) -> None:
        with self.assertRaises(pc.InsufficientIsolationError) as cm:
            self.client.run_javascript("console.log(1)", minimum_isolation="process")
        e = cm.exception
        self.assertEqual(e.not_dispatched, "isolation")
        self.assertEqual(e.code, "failed_precondition")
        # A refusal the client made itself has no HTTP status: this one was answered.
        self.assertEqual(e.http_status, 400)
        self.assertFalse(e.answer_not_bound)
        # And on the wire: the daemon's own detail, NotDispatched{isolation} = 08 05.
        rid = secrets.token_hex(16)
        body = json.dumps({"protocol": 4, "minimumIsolation": "process", "javascript": {"code": "1"}}).encode()
        resp, raw = self.daemon.raw("POST", SERVICE + "Run", body, connect_headers(rid))
        self.assertEqual(resp.status, 400)
        self.assertEqual(json.loads(raw)["code"], "failed_precondition")
        self.assertEqual(not_dispatched_detail(raw), b"\x08\x05")
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])

    def test_sessions_off_is_unsupported(self) -> None:
        with self.assertRaises(pc.UnsupportedError) as cm:
            self.client.open_session()
        self.assertEqual(cm.exception.not_dispatched, "unsupported")
        self.assertIsNotNone(cm.exception.http_status)

    def test_request_id_is_echoed_on_an_error(self) -> None:
        rid = secrets.token_hex(16)
        body = json.dumps({"protocol": 4, "javascript": {"code": "1"}}).encode()
        resp, raw = self.daemon.raw("POST", SERVICE + "Run", body, connect_headers(rid))
        self.assertEqual(resp.status, 400)
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])
        self.assertEqual(not_dispatched_detail(raw), b"\x08\x04")

    def test_request_id_is_echoed_on_healthz(self) -> None:
        rid = secrets.token_hex(16)
        resp, raw = self.daemon.raw("GET", "/healthz", headers={REQUEST_ID: rid})
        self.assertEqual((resp.status, raw), (200, b"ok\n"))
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])

    def test_request_id_is_echoed_on_a_404(self) -> None:
        rid = secrets.token_hex(16)
        resp, _ = self.daemon.raw("GET", "/no/such/path", headers={REQUEST_ID: rid})
        self.assertEqual(resp.status, 404)
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])
        self.assertEqual(resp.headers.get_all(NOT_DISPATCHED), ["unsupported"])

    def test_describe_answer_is_bound_and_json(self) -> None:
        rid = secrets.token_hex(16)
        resp, raw = self.daemon.raw("POST", SERVICE + "Describe", b"{}", connect_headers(rid))
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])
        self.assertEqual((resp.getheader("Content-Type") or "").split(";")[0].strip(), "application/json")
        self.assertEqual(json.loads(raw)["protocol"], 4)


class ClientsFileTest(unittest.TestCase):
    """A daemon with a clients file: the token `python` holds, and one without scope."""

    daemon: Daemon
    token: str
    scopeless: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.token = secrets.token_hex(32)
        cls.scopeless = secrets.token_hex(32)
        cls.dir = tempfile.TemporaryDirectory()
        path = pathlib.Path(cls.dir.name) / "clients.json"
        clients = [
            {"id": "python", "token_sha256": hashlib.sha256(cls.token.encode()).hexdigest(), "scopes": ["code:run"]},
            {"id": "nobody", "token_sha256": hashlib.sha256(cls.scopeless.encode()).hexdigest(), "scopes": []},
        ]
        path.write_text(json.dumps({"clients": clients}))
        cls.daemon = Daemon({"PLIMSOLL_CLIENTS_FILE": str(path)})

    @classmethod
    def tearDownClass(cls) -> None:
        code = cls.daemon.stop()
        cls.dir.cleanup()
        if code != 0:
            raise AssertionError(f"plimsolld exited {code} after SIGTERM")

    def test_listed_token_describes_and_its_run_is_disabled(self) -> None:
        client = pc.Client(self.daemon.url, token=self.token, request_timeout=IO_TIMEOUT)
        self.assertEqual(client.describe().protocol, 4)
        with self.assertRaises(pc.DisabledError) as cm:
            client.run_javascript("1")
        self.assertEqual(cm.exception.not_dispatched, "unsupported")

    def assert_unauthenticated(self, e: pc.PlimsollError) -> None:
        self.assertEqual(e.code, "unauthenticated")
        self.assertEqual(e.not_dispatched, "permission")
        self.assertEqual(e.http_status, 401)
        self.assertFalse(e.answer_not_bound)

    def test_missing_token_is_unauthenticated(self) -> None:
        client = pc.Client(self.daemon.url, request_timeout=IO_TIMEOUT)
        for call in (client.describe, lambda: client.run_javascript("1")):
            with self.assertRaises(pc.PlimsollError) as cm:
                call()
            self.assert_unauthenticated(cm.exception)
            self.assertIn("missing bearer token", str(cm.exception))

    def test_wrong_token_is_unauthenticated(self) -> None:
        client = pc.Client(self.daemon.url, token=secrets.token_hex(32), request_timeout=IO_TIMEOUT)
        with self.assertRaises(pc.PlimsollError) as cm:
            client.run_javascript("1")
        self.assert_unauthenticated(cm.exception)
        self.assertIn("invalid or expired token", str(cm.exception))

    def test_caller_without_scope_is_permission_denied(self) -> None:
        client = pc.Client(self.daemon.url, token=self.scopeless, request_timeout=IO_TIMEOUT)
        with self.assertRaises(pc.PlimsollError) as cm:
            client.describe()
        e = cm.exception
        self.assertEqual((e.code, e.not_dispatched, e.http_status), ("permission_denied", "permission", 403))

    def test_request_id_is_echoed_on_401(self) -> None:
        rid = secrets.token_hex(16)
        body = json.dumps({"protocol": 4, "javascript": {"code": "1"}}).encode()
        resp, raw = self.daemon.raw("POST", SERVICE + "Run", body, connect_headers(rid))
        self.assertEqual(resp.status, 401)
        self.assertEqual(resp.headers.get_all(REQUEST_ID), [rid])
        self.assertEqual(not_dispatched_detail(raw), b"\x08\x02")

    def test_token_never_reaches_the_log(self) -> None:
        pc.Client(self.daemon.url, token=self.token, request_timeout=IO_TIMEOUT).describe()
        for line in self.daemon.log:
            self.assertNotIn(self.token, line)


if __name__ == "__main__":
    unittest.main(verbosity=2)
