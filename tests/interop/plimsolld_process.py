"""The interop tests' plimsolld: start target/debug/plimsolld (or $PLIMSOLLD) as a
subprocess with an exact environment, read its address from the `plimsolld listening` log
line, talk raw HTTP/1.1 to it, and stop it with SIGTERM.

A plain module beside the tests, which put their own directory on sys.path before
importing it (they run with `python -I`, which does not). It does not import the client.
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
from typing import Dict, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("PLIMSOLLD") or ROOT / "target" / "debug" / "plimsolld")
LISTENING = "plimsolld listening"


def split_addr(addr: object) -> Tuple[str, int]:
    """`host:port` from a listening line, as (host, port)."""
    host, _, port = str(addr).rpartition(":")
    return host, int(port)


class Plimsolld:
    """A running plimsolld with exactly the given environment (plus PATH).

    `env` goes on top of PLIMSOLL_ADDR=127.0.0.1:0 and PLIMSOLL_METRICS_ADDR=off. With
    `token=True` the daemon gets a fresh PLIMSOLL_TOKEN, kept in `self.token`. The start
    waits `start_timeout` seconds for the listening line; `stop` waits `stop_timeout`.
    """

    def __init__(
        self,
        env: Optional[Dict[str, str]] = None,
        *,
        start_timeout: float,
        stop_timeout: float = 30.0,
        token: bool = False,
    ) -> None:
        if not BINARY.is_file():
            raise RuntimeError(f"{BINARY} does not exist: run `cargo build -p plimsolld` first")
        full = {"PATH": os.environ.get("PATH", ""), "PLIMSOLL_ADDR": "127.0.0.1:0", "PLIMSOLL_METRICS_ADDR": "off"}
        self.token: Optional[str] = None
        if token:
            self.token = secrets.token_hex(24)
            full["PLIMSOLL_TOKEN"] = self.token
        full.update(env or {})
        self.stop_timeout = stop_timeout
        self.log: List[str] = []
        self.line: Dict[str, object] = {}
        self._listening = threading.Event()
        self.proc = subprocess.Popen(
            [str(BINARY)], env=full, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(start_timeout) or not self.line:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(5)
            raise RuntimeError("plimsolld did not start listening; its log:\n" + "\n".join(self.log))
        self.host, self.port = split_addr(self.line["addr"])
        self.url = f"http://{self.host}:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            text = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(text)
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("msg") == LISTENING and not self._listening.is_set():
                self.line = record
                self._listening.set()
        self._listening.set()  # the log ended: stop waiting either way

    def raw(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Optional[Dict[str, str]] = None,
        timeout: float = 15.0,
        addr: Optional[object] = None,
    ) -> Tuple[http.client.HTTPResponse, bytes]:
        """One raw HTTP/1.1 exchange with the RPC listener (or `addr`, a `host:port` such as
        the listening line's `metrics_addr`); returns the answer and its body."""
        host, port = split_addr(addr) if addr is not None else (self.host, self.port)
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp, resp.read()
        finally:
            conn.close()

    def stop(self) -> int:
        """SIGTERM, then the exit code (the process is killed after `stop_timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"plimsolld did not exit within {self.stop_timeout:g} s of SIGTERM")
        finally:
            self._reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()

    def stop_expecting_zero(self) -> None:
        """`stop`, raising AssertionError with the log unless plimsolld exits 0."""
        code = self.stop()
        if code != 0:
            raise AssertionError(f"plimsolld exited {code} after SIGTERM; its log:\n" + "\n".join(self.log))
