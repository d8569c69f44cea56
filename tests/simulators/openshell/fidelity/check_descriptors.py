"""Proves plimsoll's OpenShell protocol definitions (proto/openshell/*.proto) against the
descriptors shipped in OpenShell's published Python package (`openshell` 0.1.5, from PyPI,
unmodified), which carry the gateway's own compiled .proto files.

For every file we define: the same package. For every message we define (nested ones and
map entries too): the same full name and exactly the same fields, each with the same
number, name, label, type, message or enum type, oneof and proto3 `optional`; a message
missing a field would drop it on decode, so fewer fields is a failure too. For every enum:
the same values. For the service: the same full name, and each method we list exists
there with the same request and response types and the same streaming on each side.

Before judging, it proves it can fail: a handful of deliberately broken copies of our
descriptors must each be refused.

Run with the venv scripts/setup makes: tests/simulators/openshell/.venv/bin/python -I
tests/simulators/openshell/fidelity/check_descriptors.py
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

PINNED = "0.1.5"
ROOT = pathlib.Path(__file__).resolve().parents[4]
PROTO_DIR = ROOT / "proto" / "openshell"

FDP = descriptor_pb2.FieldDescriptorProto


def ours() -> descriptor_pb2.FileDescriptorSet:
    """Our .proto files compiled by protoc (the same compiler the build uses)."""
    protoc = shutil.which("protoc")
    if protoc is None:
        sys.exit("protoc is not installed: run scripts/setup")
    files = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    if not files:
        sys.exit(f"no .proto files under {PROTO_DIR}")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "set.pb"
        subprocess.run(
            [protoc, f"-I{PROTO_DIR}", "--include_imports", f"--descriptor_set_out={out}", *files],
            check=True,
        )
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    # The well-known types come from protoc's own include directory, not from us.
    kept = [f for f in fds.file if not f.name.startswith("google/")]
    del fds.file[:]
    fds.file.extend(kept)
    return fds


def theirs() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The package's serialized file descriptors, by file name."""
    version = importlib.metadata.version("openshell")
    if version != PINNED:
        sys.exit(f"openshell {version} is installed; this check is pinned to {PINNED}")
    from openshell._proto import datamodel_pb2, openshell_pb2, options_pb2, sandbox_pb2

    files = {}
    for module in (openshell_pb2, sandbox_pb2, datamodel_pb2, options_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files[proto.name] = proto
    return files


def field_shape(message: descriptor_pb2.DescriptorProto, field: FDP) -> tuple:
    oneof = message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else ""
    return (
        field.name,
        FDP.Label.Name(field.label),
        FDP.Type.Name(field.type),
        field.type_name,
        oneof,
        field.proto3_optional,
    )


def compare_message(prefix: str, mine, reference, problems: list[str], counts: dict) -> None:
    name = f"{prefix}.{mine.name}"
    counts["messages"] += 1
    if mine.options.map_entry != reference.options.map_entry:
        problems.append(f"{name}: map entry {mine.options.map_entry}, package {reference.options.map_entry}")
    a = {f.number: field_shape(mine, f) for f in mine.field}
    b = {f.number: field_shape(reference, f) for f in reference.field}
    for number in sorted(set(a) | set(b)):
        counts["fields"] += 1
        if number not in b:
            problems.append(f"{name}: field {number} {a[number][0]} is not in the package")
        elif number not in a:
            problems.append(f"{name}: lacks field {number} {b[number]} (decoding would drop it)")
        elif a[number] != b[number]:
            problems.append(f"{name}: field {number} is {a[number]}, package has {b[number]}")
    refs = {m.name: m for m in reference.nested_type}
    for nested in mine.nested_type:
        if nested.name not in refs:
            problems.append(f"{name}.{nested.name}: not in the package")
        else:
            compare_message(name, nested, refs[nested.name], problems, counts)
    enum_refs = {e.name: e for e in reference.enum_type}
    for enum in mine.enum_type:
        compare_enum(name, enum, enum_refs.get(enum.name), problems, counts)


def compare_enum(prefix: str, mine, reference, problems: list[str], counts: dict) -> None:
    name = f"{prefix}.{mine.name}"
    counts["enums"] += 1
    if reference is None:
        problems.append(f"{name}: enum not in the package")
        return
    a = {v.name: v.number for v in mine.value}
    b = {v.name: v.number for v in reference.value}
    if a != b:
        problems.append(f"{name}: values {sorted(a.items())}, package {sorted(b.items())}")


def compare(fds: descriptor_pb2.FileDescriptorSet, reference: dict) -> tuple[list[str], dict]:
    problems: list[str] = []
    counts = {"files": 0, "messages": 0, "fields": 0, "enums": 0, "methods": 0}
    for mine in fds.file:
        counts["files"] += 1
        ref = reference.get(mine.name)
        if ref is None:
            problems.append(f"{mine.name}: no file of that name in the package")
            continue
        if mine.package != ref.package:
            problems.append(f"{mine.name}: package {mine.package}, package's is {ref.package}")
        if mine.syntax != ref.syntax:
            problems.append(f"{mine.name}: syntax {mine.syntax}, package's is {ref.syntax}")
        prefix = f".{mine.package}"
        messages = {m.name: m for m in ref.message_type}
        for message in mine.message_type:
            if message.name not in messages:
                problems.append(f"{prefix}.{message.name}: not in the package")
            else:
                compare_message(prefix, message, messages[message.name], problems, counts)
        enums = {e.name: e for e in ref.enum_type}
        for enum in mine.enum_type:
            compare_enum(prefix, enum, enums.get(enum.name), problems, counts)
        services = {s.name: s for s in ref.service}
        for service in mine.service:
            sname = f"{prefix}.{service.name}"
            if service.name not in services:
                problems.append(f"{sname}: service not in the package")
                continue
            methods = {m.name: m for m in services[service.name].method}
            for method in service.method:
                counts["methods"] += 1
                other = methods.get(method.name)
                if other is None:
                    problems.append(f"{sname}/{method.name}: method not in the package")
                    continue
                shape = lambda m: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)  # noqa: E731
                if shape(method) != shape(other):
                    problems.append(f"{sname}/{method.name}: {shape(method)}, package has {shape(other)}")
    return problems, counts


def broken_copies(fds: descriptor_pb2.FileDescriptorSet):
    """Deliberate mistakes the comparison must catch (so it is known to be able to fail)."""

    def find(name: str):
        copy = descriptor_pb2.FileDescriptorSet()
        copy.CopyFrom(fds)
        for f in copy.file:
            for m in f.message_type:
                if m.name == name:
                    return copy, f, m
        raise SystemExit(f"self-test: message {name} missing from our definitions")

    copy, _, m = find("TcpForwardInit")
    m.field[0].number = 2
    yield "a renumbered field", copy
    copy, _, m = find("ObjectMeta")
    del m.field[-1]
    yield "a missing field", copy
    copy, _, m = find("ExecSandboxExit")
    m.field[0].type = FDP.TYPE_UINT32
    yield "a field of another type", copy
    copy, f, _ = find("SandboxPolicy")
    f.package = "openshell.policy.v1"
    yield "another package", copy
    copy = descriptor_pb2.FileDescriptorSet()
    copy.CopyFrom(fds)
    for f in copy.file:
        for s in f.service:
            for method in s.method:
                if method.name == "ExecSandboxInteractive":
                    method.client_streaming = False
    yield "a method with other streaming", copy
    copy, _, m = find("SandboxTemplate")
    m.field.add(name="invented", number=99, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING)
    yield "a field the package lacks", copy


def main() -> int:
    fds = ours()
    reference = theirs()
    passed = failed = 0
    for what, copy in broken_copies(fds):
        problems, _ = compare(copy, reference)
        if problems:
            print(f"self-test: {what} is refused ({problems[0]})")
            passed += 1
        else:
            print(f"self-test FAILED: {what} was not noticed")
            failed += 1
    problems, counts = compare(fds, reference)
    for problem in problems:
        print(f"MISMATCH {problem}")
    print(
        f"checked {counts['files']} files, {counts['messages']} messages, {counts['fields']} fields, "
        f"{counts['enums']} enums and {counts['methods']} methods against openshell {PINNED}"
    )
    if problems:
        failed += 1
    else:
        passed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
