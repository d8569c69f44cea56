"""OpenShell's own published client (`openshell` 0.1.5 from PyPI, unmodified) drives the
gateway simulator: if the simulator were faithful only to plimsoll's client, this would
catch it.

It starts the built target/debug/openshell-simulator (runtime from
PLIMSOLL_TEST_DOCKER_RUNTIME, runc by default), then, through `openshell.SandboxClient`
over mutual TLS:

- health and a refused connection without a client certificate;
- create with labels, an image, a policy and resources; wait_ready; get; the gateway's
  own fill-ins (id, created time, default command, attachment epoch);
- list by label selector (only the matching sandboxes, paged);
- exec: stdout, stderr, exit code, stdin, environment, workdir, a quoted argument;
- stop (STOPPED, files kept, processes gone) and start (STARTING, then READY);
- delete (COMPLETED), wait_deleted, a second delete (NOT_FOUND, or ALREADY_ABSENT with
  allow_missing);
- the high-level `openshell.Sandbox` context manager, found through the gateway
  directory layout the OpenShell CLI writes (metadata.json and mtls/), end to end.

Every container the simulator made must be gone afterwards.

Run: tests/simulators/openshell/.venv/bin/python -I tests/simulators/openshell/fidelity/test_client.py
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import grpc
from openshell import DeletionOutcome, Sandbox, SandboxClient, TlsConfig
from openshell._proto import datamodel_pb2 as dm
from openshell._proto import openshell_pb2 as pb
from openshell._proto import sandbox_pb2 as spb
from google.protobuf import struct_pb2

ROOT = pathlib.Path(__file__).resolve().parents[4]
BINARY = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "openshell-simulator"
IMAGE = "plimsoll/sandbox-node:latest"
RUNTIME = os.environ.get("PLIMSOLL_TEST_DOCKER_RUNTIME", "") or "runc"
WS = "default"

results: list[tuple[str, bool]] = []


def check(name):
    def wrap(fn):
        def run(*args):
            try:
                fn(*args)
                results.append((name, True))
                print(f"ok    {name}")
            except Exception:  # noqa: BLE001 - report every failure and go on
                results.append((name, False))
                print(f"FAIL  {name}")
                traceback.print_exc()

        run.__name__ = fn.__name__
        return run

    return wrap


class Simulator:
    def __init__(self, tmp: pathlib.Path):
        if not BINARY.exists():
            sys.exit(f"{BINARY} is missing: cargo build --workspace first")
        self.proc = subprocess.Popen(
            [str(BINARY), "--cert-dir", str(tmp / "certs"), "--runtime", RUNTIME, "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            sys.exit("the simulator exited before its ready line")
        self.ready = json.loads(line)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def tls(ready, *, with_cert=True) -> TlsConfig:
    if not with_cert:
        return TlsConfig(ca_path=pathlib.Path(ready["ca_file"]))
    return TlsConfig(
        ca_path=pathlib.Path(ready["ca_file"]),
        cert_path=pathlib.Path(ready["cert_file"]),
        key_path=pathlib.Path(ready["key_file"]),
    )


def policy() -> spb.SandboxPolicy:
    return spb.SandboxPolicy(
        version=1,
        filesystem=spb.FilesystemPolicy(read_only=["/usr", "/etc"], read_write=["/tmp", "/dev/null"]),
        landlock=spb.LandlockPolicy(compatibility="hard_requirement"),
    )


def spec(command=None) -> pb.SandboxSpec:
    resources = struct_pb2.Struct()
    resources.update({"limits": {"memory": "256Mi", "cpu": "1"}})
    template = pb.SandboxTemplate(image=IMAGE, resources=resources)
    return pb.SandboxSpec(template=template, policy=policy(), command=command or [])


def expect_code(code, fn):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"expected {code}, got {e.code()}: {e.details()}"
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


@check("health over mutual TLS; no client certificate, no service")
def t_tls(ready):
    with SandboxClient(ready["grpc_addr"], tls=tls(ready)) as c:
        assert c.health().status == pb.SERVICE_STATUS_HEALTHY
    with SandboxClient(ready["grpc_addr"], tls=tls(ready, with_cert=False), timeout=5) as c:
        expect_code(grpc.StatusCode.UNAVAILABLE, c.health)


@check("create, wait_ready, get: what was sent, plus the gateway's fill-ins")
def t_create(c: SandboxClient):
    labels = {"plimsoll.run": "1", "plimsoll.instance": "fidelity0001"}
    ref = c.create(workspace=WS, spec=spec(), name="fid-create", labels=labels)
    assert ref.name == "fid-create" and ref.id and ref.workspace == WS
    assert ref.phase == pb.SANDBOX_PHASE_PROVISIONING, ref.phase
    ready = c.wait_ready("fid-create", workspace=WS, timeout_seconds=60)
    assert ready.phase == pb.SANDBOX_PHASE_READY
    assert dict(ready.labels) == labels
    # The client's SandboxRef keeps only a summary; read the whole message with its stub.
    raw = c._stub.GetSandbox(
        pb.GetSandboxRequest(workspace_scope=dm.WorkspaceSelector(workspace=WS), name="fid-create")
    )
    sb = raw.sandbox
    assert sb.spec.policy == policy()
    assert sb.spec.template.image == IMAGE
    assert list(sb.spec.command) == ["/bin/bash", "-l"] and sb.spec.tty
    assert sb.spec.provider_attachment_epoch
    assert sb.metadata.HasField("created_time")
    assert sb.spec.template.resources["limits"]["memory"] == "256Mi"
    expect_code(grpc.StatusCode.ALREADY_EXISTS, lambda: c.create(workspace=WS, spec=spec(), name="fid-create"))
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: c.create(workspace=WS, spec=spec(), name="Not_Valid"))
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: c.get("fid-nobody", workspace=WS))


@check("list by label selector, paged")
def t_list(c: SandboxClient):
    for i in range(3):
        c.create(workspace=WS, spec=spec(), name=f"fid-list-{i}", labels={"fid.group": "a" if i < 2 else "b"})
    names = sorted(s.name for s in c.list_all(workspace=WS, label_selector="fid.group=a"))
    assert names == ["fid-list-0", "fid-list-1"], names
    paged = list(c.list(workspace=WS, page_size=1, label_selector="fid.group=a"))
    assert len(paged) == 2 and all(len(p.items) == 1 for p in paged), paged
    assert [s.name for s in c.list_all(workspace=WS, label_selector="fid.group=b")] == ["fid-list-2"]
    for i in range(3):
        c.wait_ready(f"fid-list-{i}", workspace=WS, timeout_seconds=60)
        assert c.delete(f"fid-list-{i}", workspace=WS).outcome == DeletionOutcome.COMPLETED


@check("exec: stdout, stderr, exit code, stdin, environment, workdir, quoting")
def t_exec(c: SandboxClient):
    r = c.exec("fid-create", ["sh", "-c", 'echo "$GREETING"; echo oops >&2; cat; exit 7'],
               workspace=WS, env={"GREETING": "hello there"}, stdin=b"from stdin\n")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "hello there\nfrom stdin\n", "oops\n"), r
    r = c.exec("fid-create", ["pwd"], workspace=WS, workdir="/tmp")
    assert r.stdout == "/tmp\n", r
    r = c.exec("fid-create", ["node", "-e", "console.log(\"it's\", 1+1)"], workspace=WS, no_login_shell=True)
    assert (r.exit_code, r.stdout) == (0, "it's 2\n"), r
    r = c.exec("fid-create", ["sh", "-c", "echo x > /not-writable"], workspace=WS)
    assert r.exit_code != 0, r


@check("stop keeps files; start answers STARTING then READY")
def t_stop_start(c: SandboxClient):
    c.exec("fid-create", ["sh", "-c", "echo kept > /tmp/kept"], workspace=WS)
    stopped = c.stop("fid-create", workspace=WS)
    assert stopped.phase == pb.SANDBOX_PHASE_STOPPED, stopped.phase
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, lambda: c.exec("fid-create", ["true"], workspace=WS))
    started = c.start("fid-create", workspace=WS)
    assert started.phase == pb.SANDBOX_PHASE_STARTING, started.phase
    c.wait_ready("fid-create", workspace=WS, timeout_seconds=60)
    r = c.exec("fid-create", ["cat", "/tmp/kept"], workspace=WS)
    assert r.stdout == "kept\n", r
    # Starting a READY sandbox answers it as it is.
    assert c.start("fid-create", workspace=WS).phase == pb.SANDBOX_PHASE_READY


@check("delete: COMPLETED, then gone; again: NOT_FOUND, or ALREADY_ABSENT with allow_missing")
def t_delete(c: SandboxClient):
    c.wait_ready("fid-create", workspace=WS, timeout_seconds=60)
    result = c.delete("fid-create", workspace=WS)
    assert result.outcome == DeletionOutcome.COMPLETED and result.sandbox_id, result
    c.wait_deleted("fid-create", workspace=WS, timeout_seconds=10)
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: c.delete("fid-create", workspace=WS))
    assert c.delete("fid-create", workspace=WS, allow_missing=True).outcome == DeletionOutcome.ALREADY_ABSENT


@check("the Sandbox context manager through the CLI's gateway directory")
def t_context(ready, tmp: pathlib.Path):
    config = tmp / "xdg"
    gateway = config / "openshell" / "gateways" / "sim"
    (gateway / "mtls").mkdir(parents=True)
    (gateway / "metadata.json").write_text(json.dumps({"gateway_endpoint": ready["grpc_url"]}))
    for src, dst in (("ca_file", "ca.crt"), ("cert_file", "tls.crt"), ("key_file", "tls.key")):
        shutil.copy(ready[src], gateway / "mtls" / dst)
    os.environ["XDG_CONFIG_HOME"] = str(config)
    with Sandbox(workspace=WS, cluster="sim", spec=spec(["sleep", "600"]), labels={"fid.ctx": "1"}) as sb:
        assert sb.sandbox.phase == pb.SANDBOX_PHASE_READY
        name = sb.sandbox.name
        assert sb.exec(["echo", "inside"]).stdout == "inside\n"
    with SandboxClient(ready["grpc_addr"], tls=tls(ready)) as c:
        expect_code(grpc.StatusCode.NOT_FOUND, lambda: c.get(name, workspace=WS))


def leftover(instance: str) -> int:
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=io.plimsoll.simulator.instance={instance}"],
        capture_output=True, text=True, check=True,
    )
    return len(out.stdout.split())


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="openshell-fidelity-") as tmp:
        tmp = pathlib.Path(tmp)
        sim = Simulator(tmp)
        ready = sim.ready
        print(f"simulator at {ready['grpc_addr']} (runtime {ready['runtime']})")
        try:
            t_tls(ready)
            with SandboxClient(ready["grpc_addr"], tls=tls(ready)) as c:
                t_create(c)
                t_list(c)
                t_exec(c)
                t_stop_start(c)
                t_delete(c)
            t_context(ready, tmp)
        finally:
            sim.stop()
        left = leftover(ready["instance"])
        results.append(("no container left behind", left == 0))
        print(f"{'ok  ' if left == 0 else 'FAIL'}  no container left behind ({left})")
    passed = sum(1 for _, ok in results if ok)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
