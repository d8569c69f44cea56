"""Docker's own published SDK for the sandboxes API (`docker-sbx-api` 0.36.0 from PyPI,
unmodified: its generated messages and Connect clients) drives the Docker Cloud
simulator, so the simulator is held to Docker's contract, not to plimsoll's provider.

The clients are the package's generated `*ClientSync` classes with the JSON codec (the
codec plimsoll speaks; the package's facade defaults to binary protobuf, which the
simulator does not serve) and no request compression (as the facade sends). The codec
parses every answer with the package's message classes and refuses a field the schema
does not have, so each answer below is also a schema check.

It starts the built target/debug/dockercloud-simulator (runtime from
PLIMSOLL_TEST_DOCKER_RUNTIME, runc by default, account quota 2) and checks:

- capabilities: the cloud backend, the four permissions plimsoll needs, the ranges;
- create (CloudCreateOptions, Resources) as an Operation, WaitOperation, the response
  unpacked as a Sandbox, Get by id and name, List; the create refusals (inline network
  policy INTERNAL, no cpus INVALID_ARGUMENT, quota RESOURCE_EXHAUSTED);
- the effective network policy (deny-all, nothing allowed; after the policy PUT and under
  the seal faults, the layers and modes as the schema names them);
- Exec, Upload (client stream; missing parents NOT_FOUND) and Download (server stream,
  per-file errors) on the sandbox endpoint;
- delete as an Operation, then NOT_FOUND; the binary codec refused.

Every container the simulator made must be gone afterwards.

Run: tests/simulators/dockercloud/.venv/bin/python -I tests/simulators/dockercloud/fidelity/test_client.py
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import traceback
import urllib.request

from connectrpc.code import Code
from connectrpc.codec import proto_json_codec
from connectrpc.errors import ConnectError
from docker.sbx.common.v1 import common_pb2 as common
from docker.sbx.extensions.cloud.v1 import cloud_pb2 as cloud
from docker.sbx.files.v1 import files_connect, files_pb2 as files
from docker.sbx.process.v1 import process_connect, process_pb2 as process
from docker.sbx.v1 import netpolicy_connect, netpolicy_pb2 as netpolicy
from docker.sbx.v1 import operation_connect, operation_pb2 as operation
from docker.sbx.v1 import policy_pb2 as policy_types
from docker.sbx.v1 import sandbox_connect, sandbox_pb2 as sandbox
from google.protobuf import duration_pb2, empty_pb2  # noqa: F401 - Empty answers a delete

ROOT = pathlib.Path(__file__).resolve().parents[4]
BINARY = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "dockercloud-simulator"
IMAGE = "plimsoll-sim/dockercloud-sandbox:latest"
RUNTIME = os.environ.get("PLIMSOLL_TEST_DOCKER_RUNTIME", "") or "runc"

results: list[tuple[str, bool]] = []


def check(name):
    def wrap(fn):
        def run(*args):
            try:
                value = fn(*args)
                results.append((name, True))
                print(f"ok    {name}")
                return value
            except Exception:  # noqa: BLE001 - report every failure and go on
                results.append((name, False))
                print(f"FAIL  {name}")
                traceback.print_exc()
                return None

        run.__name__ = fn.__name__
        return run

    return wrap


class Simulator:
    def __init__(self):
        if not BINARY.exists():
            sys.exit(f"{BINARY} is missing: cargo build --workspace first")
        self.proc = subprocess.Popen(
            [str(BINARY), "--runtime", RUNTIME, "--exit-on-stdin-eof", "--max-running", "2", "--log", "warn"],
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


def exchange(ready) -> str:
    body = json.dumps({"identifier": ready["username"], "secret": ready["token"]}).encode()
    request = urllib.request.Request(ready["auth_url"], data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)["access_token"]


class Clients:
    """The package's generated clients, JSON codec, uncompressed, bearer on every call."""

    def __init__(self, ready, bearer: str):
        api = ready["api_url"]
        kw = dict(codec=proto_json_codec(), send_compression=None, timeout_ms=60_000)
        self.headers = {"authorization": f"Bearer {bearer}"}
        self.kw = kw
        self.capabilities = sandbox_connect.CapabilityServiceClientSync(api, **kw)
        self.sandboxes = sandbox_connect.SandboxServiceClientSync(api, **kw)
        self.operations = operation_connect.OperationServiceClientSync(api, **kw)
        self.policies = netpolicy_connect.NetworkPolicyServiceClientSync(api, **kw)

    def endpoint(self, uri: str):
        return (
            process_connect.ProcessServiceClientSync(uri, **self.kw),
            files_connect.FileServiceClientSync(uri, **self.kw),
        )


def expect_code(code, fn):
    try:
        fn()
    except ConnectError as e:
        assert e.code == code, f"expected {code}, got {e.code}: {e.message}"
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def create_request(name: str, **extra) -> sandbox.CreateSandboxRequest:
    options = cloud.CloudCreateOptions(
        image_ref=IMAGE,
        start_cmd=["tail", "-f", "/dev/null"],
        timeout=duration_pb2.Duration(seconds=300),
        on_timeout=cloud.ON_TIMEOUT_DELETE,
        auto_resume=False,
        platform=common.Platform(os="linux", architecture="amd64"),
    )
    resources = common.Resources(cpus=1, memory_mib=1024)
    return sandbox.CreateSandboxRequest(name=name, request_id=name, cloud=options, resources=resources, **extra)


def wait(c: Clients, op: operation.Operation) -> operation.Operation:
    for _ in range(30):
        if op.done:
            return op
        op = c.operations.wait_operation(
            operation.WaitOperationRequest(id=op.id, timeout=duration_pb2.Duration(seconds=10)), headers=c.headers
        )
    raise AssertionError(f"operation {op.id} not done")


@check("capabilities: the cloud backend, plimsoll's four permissions, CPU and memory ranges")
def t_capabilities(c: Clients):
    caps = c.capabilities.get_capabilities(sandbox.GetCapabilitiesRequest(), headers=c.headers)
    assert caps.backend == 2, caps  # BACKEND_CLOUD
    for needed in (common.PERMISSION_SANDBOXES_READ, common.PERMISSION_SANDBOXES_CREATE,
                   common.PERMISSION_SANDBOXES_DELETE, common.PERMISSION_NETWORK_POLICIES_READ):
        assert needed in caps.permissions, caps.permissions
    assert caps.resources.cpu_min >= 1 and caps.resources.cpu_max >= caps.resources.cpu_min
    assert caps.resources.memory_mib_max >= 1024 >= caps.resources.memory_mib_min
    assert caps.can_attach_policies


@check("create is an Operation; done, its response is the running Sandbox; get and list")
def t_create(c: Clients) -> sandbox.Sandbox:
    op = c.sandboxes.create_sandbox(create_request("fid-1"), headers=c.headers)
    assert op.id and not op.done
    assert op.metadata.kind == operation.OPERATION_KIND_CREATE_SANDBOX
    op = wait(c, op)
    assert op.WhichOneof("result") == "response", op
    created = sandbox.Sandbox()
    assert op.response.Unpack(created), op.response.type_url
    core = created.core
    assert core.status == common.SANDBOX_STATUS_RUNNING and core.name == "fid-1" and core.id
    assert core.endpoint.protocol == common.SANDBOX_ENDPOINT_PROTOCOL_CONNECT and core.endpoint.uri
    assert core.resources.cpus == 1 and core.resources.memory_mib == 1024
    assert created.cloud.image_digest.startswith("sha256:")
    assert created.cloud.on_timeout == cloud.ON_TIMEOUT_DELETE
    by_id = c.sandboxes.get_sandbox(sandbox.GetSandboxRequest(sandbox=common.SandboxRef(id=core.id)), headers=c.headers)
    by_name = c.sandboxes.get_sandbox(sandbox.GetSandboxRequest(sandbox=common.SandboxRef(name="fid-1")), headers=c.headers)
    assert by_id == by_name and by_id.core.id == core.id
    listed = c.sandboxes.list_sandboxes(sandbox.ListSandboxesRequest(page_size=10), headers=c.headers)
    assert [s.core.name for s in listed.sandboxes] == ["fid-1"] and not listed.next_page_token
    same = c.sandboxes.create_sandbox(create_request("fid-1"), headers=c.headers)
    assert same.id == op.id, "the request id replays the create"
    return by_id


@check("creates refused: inline network policy INTERNAL, no cpus INVALID_ARGUMENT, quota RESOURCE_EXHAUSTED")
def t_refusals(c: Clients):
    inline = create_request("fid-inline", network_policies=[netpolicy.NetworkPolicy(mode=netpolicy.NETWORK_POLICY_MODE_DENY_ALL)])
    expect_code(Code.INTERNAL, lambda: c.sandboxes.create_sandbox(inline, headers=c.headers))
    no_cpus = create_request("fid-nocpu")
    no_cpus.resources.ClearField("cpus")
    e = expect_code(Code.INVALID_ARGUMENT, lambda: c.sandboxes.create_sandbox(no_cpus, headers=c.headers))
    assert "cpus" in e.message
    wait(c, c.sandboxes.create_sandbox(create_request("fid-2"), headers=c.headers))
    e = expect_code(Code.RESOURCE_EXHAUSTED, lambda: c.sandboxes.create_sandbox(create_request("fid-3"), headers=c.headers))
    assert e.message == "Maximum running sandboxes quota reached", e.message


@check("effective network policy: deny-all, nothing allowed")
def t_policy(c: Clients, sb: sandbox.Sandbox):
    target = policy_types.PolicyTarget(sandbox=common.SandboxRef(id=sb.core.id))
    policy = c.policies.get_effective_network_policy(netpolicy.GetEffectiveNetworkPolicyRequest(target=target), headers=c.headers)
    assert policy.mode == netpolicy.NETWORK_POLICY_MODE_DENY_ALL and len(policy.allow_networks) == 0, policy


@check("effective network policy after the policy PUT and under the seal faults (layers, modes)")
def t_policy_layers(c: Clients, ready, bearer: str, sb: sandbox.Sandbox):
    put = urllib.request.Request(
        f"{ready['policy_url']}/sandboxes/{sb.core.id}/network-policy",
        data=json.dumps({"mode": "deny-all", "allowNetworks": ["guard.example:443"]}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {bearer}"},
        method="PUT",
    )
    with urllib.request.urlopen(put, timeout=60) as answer:
        assert json.load(answer) == {"mode": "deny-all", "allowNetworks": ["guard.example:443"]}
    faults = urllib.request.Request(
        f"{ready['admin_url']}/faults",
        data=json.dumps({"policy_not_deny_all": True, "extra_allowed_network": "extra.example:443"}).encode(),
        method="PUT",
    )
    urllib.request.urlopen(faults, timeout=30).close()
    try:
        target = policy_types.PolicyTarget(sandbox=common.SandboxRef(id=sb.core.id))
        policy = c.policies.get_effective_network_policy(netpolicy.GetEffectiveNetworkPolicyRequest(target=target), headers=c.headers)
    finally:
        reset = urllib.request.Request(f"{ready['admin_url']}/faults", data=b"{}", method="PUT")
        urllib.request.urlopen(reset, timeout=30).close()
    assert policy.mode == netpolicy.NETWORK_POLICY_MODE_ALLOW_ALL, policy
    rules = [(r.network, r.layer) for r in policy.allow_networks]
    assert rules == [("guard.example:443", policy_types.POLICY_LAYER_ATTACHED), ("extra.example:443", policy_types.POLICY_LAYER_OWNER)], rules


@check("endpoint: exec, upload (client stream, parents not made), download (server stream)")
def t_endpoint(c: Clients, sb: sandbox.Sandbox):
    processes, fs = c.endpoint(sb.core.endpoint.uri)
    out = processes.exec(process.ExecRequest(cmd=["sh", "-c", "pwd; echo e >&2; exit 4"], working_dir="/tmp"), headers=c.headers)
    assert (out.exit_code, out.stdout, out.stderr) == (4, b"/tmp\n", b"e\n"), out

    def frames():
        yield files.UploadRequest(header=files.FileHeader(path="/tmp/fid/a.txt", mode=0o644))
        yield files.UploadRequest(data=b"alpha")
        yield files.UploadRequest(header=files.FileHeader(path="/tmp/fid/b.bin", mode=0o600))
        yield files.UploadRequest(data=bytes(range(256)) * 2048)

    expect_code(Code.NOT_FOUND, lambda: fs.upload(frames(), headers=c.headers))
    assert processes.exec(process.ExecRequest(cmd=["mkdir", "-p", "/tmp/fid"]), headers=c.headers).exit_code == 0
    written = fs.upload(frames(), headers=c.headers)
    assert written.files_written == 2, written
    stream = fs.download(files.DownloadRequest(paths=["/tmp/fid/a.txt", "/tmp/fid/none", "/tmp/fid/b.bin"]), headers=c.headers)
    got, current, errors = {}, None, []
    for frame in stream:
        kind = frame.WhichOneof("frame")
        if kind == "header":
            current = frame.header.path
            got[current] = (frame.header.mode, b"")
        elif kind == "data":
            got[current] = (got[current][0], got[current][1] + frame.data)
        else:
            errors.append(frame.error.path)
    assert got["/tmp/fid/a.txt"] == (0o644, b"alpha"), got.get("/tmp/fid/a.txt")
    assert got["/tmp/fid/b.bin"] == (0o600, bytes(range(256)) * 2048)
    assert errors == ["/tmp/fid/none"], errors


@check("delete is an Operation; then NOT_FOUND")
def t_delete(c: Clients, sb: sandbox.Sandbox):
    request = sandbox.DeleteSandboxRequest(sandbox=common.SandboxRef(id=sb.core.id), force=True, request_id="del-fid-1")
    op = wait(c, c.sandboxes.delete_sandbox(request, headers=c.headers))
    assert op.WhichOneof("result") == "response", op
    expect_code(Code.NOT_FOUND, lambda: c.sandboxes.get_sandbox(sandbox.GetSandboxRequest(sandbox=common.SandboxRef(id=sb.core.id)), headers=c.headers))
    expect_code(Code.NOT_FOUND, lambda: c.sandboxes.delete_sandbox(request, headers=c.headers))


@check("the binary codec is not served (JSON only)")
def t_binary(ready, bearer: str):
    binary = sandbox_connect.CapabilityServiceClientSync(ready["api_url"], send_compression=None, timeout_ms=30_000)
    try:
        binary.get_capabilities(sandbox.GetCapabilitiesRequest(), headers={"authorization": f"Bearer {bearer}"})
    except ConnectError:
        return
    raise AssertionError("a binary protobuf call was answered")


def leftover(instance: str) -> int:
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=io.plimsoll.simulator.instance={instance}"],
        capture_output=True, text=True, check=True,
    )
    return len(out.stdout.split())


def main() -> int:
    sim = Simulator()
    ready = sim.ready
    print(f"simulator at {ready['api_url']} (runtime {ready['runtime']})")
    try:
        bearer = exchange(ready)
        c = Clients(ready, bearer)
        t_capabilities(c)
        sb = t_create(c)
        t_refusals(c)
        if sb is None:
            # What needs the sandbox fails with the create, never passes by being skipped.
            results.append(("policy, endpoint and delete (no sandbox to run them on)", False))
        else:
            t_policy(c, sb)
            t_policy_layers(c, ready, bearer, sb)
            t_endpoint(c, sb)
            t_delete(c, sb)
        t_binary(ready, bearer)
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
