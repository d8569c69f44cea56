"""Software rules end to end through the published Python client, plimsoll-client 0.23.0 from
PyPI and unchanged, against the real plimsolld (wire.md §6.3, records.md §5; issue 16).

For each docker runtime (runc always; runsc when PLIMSOLL_TEST_DOCKER_RUNTIMES names it, as
scripts/test does), one daemon with the docker provider and sessions on:
- `describe()` states each image's software identity, `oci-manifest:<platform>@sha256:<digest>`,
  with the manifest digest docker recorded when images/build pulled the image back from its
  registry (read here with `docker image inspect`, apart from the daemon);
- `software=SoftwareRule.exact(<that identity>)` runs, and so does `approved(...)` naming it
  among others; the client checks each record's rule id and that the rule allows the identity;
- naming another identity raises SoftwareMismatchError with `not_dispatched == "environment"`:
  nothing ran;
- a session whose rule allows the project image's identity opens and states it; a call whose
  rule narrows the session's to another identity is refused before dispatch, and the session
  goes on; a session whose rule does not allow it is refused at open.
The wasm provider states its guest module's content address as its software identity, and a
rule naming it runs there.

Docker and the images (scripts/setup-docker, images/build) are required: when they are
missing the docker tests FAIL unless PLIMSOLL_TEST_DOCKER_SKIP=1.

    tests/interop/.venv/bin/python -I tests/interop/test_software.py
"""

from __future__ import annotations

import pathlib
import re
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.dont_write_bytecode = True

import plimsoll_client as pc  # noqa: E402
from plimsoll_client import SoftwareRule  # noqa: E402
from test_docker import PROJECT_IMAGE, RUNTIMES, SNIPPET_IMAGE, TIERS, DockerDaemon, NeedsDocker, docker  # noqa: E402
from test_wasm import WasmDaemon  # noqa: E402

REQUEST_TIMEOUT = 60.0
IDENTITY = re.compile(r"oci-manifest:linux/[a-z0-9]+(/[a-z0-9]+)?@sha256:[0-9a-f]{64}")


def manifest_identity(image: str) -> str:
    """The identity docker's own records give `image`: its platform and its one repo digest."""
    out = docker("image", "inspect", "--format", "{{.Os}}/{{.Architecture}}{{range .RepoDigests}} {{.}}{{end}}", image)
    if out.returncode != 0:
        raise AssertionError(f"docker image inspect {image}: {out.stderr}")
    platform, *repo_digests = out.stdout.split()
    digests = sorted({r.rpartition("@")[2] for r in repo_digests})
    if len(digests) != 1:
        raise AssertionError(f"{image} must have one repo digest (images/build pulls it by digest): {repo_digests}")
    return f"oci-manifest:{platform}@{digests[0]}"


def another(identity: str) -> str:
    """A well-formed identity no image here has."""
    return identity.rpartition("@")[0] + "@sha256:" + "0" * 64


class SoftwareRuleDaemon(DockerDaemon):
    """plimsolld with the docker provider and sessions on."""

    def __init__(self, runtime: str) -> None:
        super().__init__(runtime, {"SANDBOX_MAX_SESSIONS": "4", "SANDBOX_RATE_PER_MIN": "0"})


class DockerSoftwareRuleTest(NeedsDocker):
    def test_rules_naming_the_stated_identity_run_and_others_are_refused_before_dispatch(self) -> None:
        snippet, project = manifest_identity(SNIPPET_IMAGE), manifest_identity(PROJECT_IMAGE)
        self.assertRegex(snippet, IDENTITY)
        self.assertRegex(project, IDENTITY)
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = SoftwareRuleDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    info = client.describe()
                    self.assertEqual(info.isolation, TIERS[runtime])
                    self.assertEqual(info.javascript_environment.software_identity, snippet)
                    self.assertEqual(info.project_environment.software_identity, project)
                    self.assertEqual(info.session_environment.software_identity, project)

                    exact = SoftwareRule.exact(snippet)
                    ran = client.run_javascript("console.log('exact')", software=exact)
                    self.assertEqual((ran.stdout, ran.exit_code), (b"exact\n", 0))
                    self.assertEqual((ran.software_identity, ran.record.software_identity), (snippet, snippet))
                    self.assertEqual(ran.record.software_rule_id, exact.rule_id())

                    approved = SoftwareRule.approved(another(snippet), project, snippet)
                    ran = client.run_javascript("console.log('approved')", software=approved)
                    self.assertEqual(ran.stdout, b"approved\n")
                    self.assertEqual(ran.record.software_rule_id, approved.rule_id())
                    self.assertTrue(ran.record.software_rule_id.startswith("approved:sha256:"))

                    for rule in (SoftwareRule.exact(another(snippet)), SoftwareRule.exact(project)):
                        with self.assertRaises(pc.SoftwareMismatchError) as refused:
                            client.run_javascript("console.log('never')", software=rule)
                        self.assertEqual(refused.exception.not_dispatched, "environment")

                    # A project is held to the project image's identity.
                    done = client.run_project({"a.py": "print(6 * 7)"}, ["python3 a.py"], software=SoftwareRule.exact(project))
                    self.assertEqual((done.outcome, done.steps[0].stdout), ("completed", b"42\n"))
                    self.assertEqual(done.record.software_identity, project)
                    with self.assertRaises(pc.SoftwareMismatchError) as refused:
                        client.run_project({}, ["true"], software=SoftwareRule.exact(snippet))
                    self.assertEqual(refused.exception.not_dispatched, "environment")
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))

    def test_a_session_checks_its_rule_at_open_and_on_every_call(self) -> None:
        project = manifest_identity(PROJECT_IMAGE)
        other = another(project)
        for runtime in RUNTIMES:
            with self.subTest(runtime=runtime):
                daemon = SoftwareRuleDaemon(runtime)
                try:
                    client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
                    with self.assertRaises(pc.SoftwareMismatchError) as refused:
                        client.open_session(software=SoftwareRule.exact(other))
                    self.assertEqual(refused.exception.not_dispatched, "environment")

                    with client.open_session(software=SoftwareRule.approved(other, project)) as s:
                        self.assertEqual(s.software_identity, project)
                        first = s.run_javascript("console.log(1)")
                        self.assertEqual((first.stdout, first.record.software_identity), (b"1\n", project))
                        cell = s.run_cell("import numpy; int(numpy.arange(4).sum())", "python")
                        self.assertEqual(cell.stdout, b"6\n")
                        # The call narrows the session's rule to another identity: refused,
                        # nothing ran, and the session and its chain go on.
                        with self.assertRaises(pc.SoftwareMismatchError) as narrowed:
                            s.run_javascript("console.log('never')", software=SoftwareRule.exact(other))
                        self.assertEqual(narrowed.exception.not_dispatched, "environment")
                        again = s.run_javascript("console.log(2)", software=SoftwareRule.exact(project))
                        self.assertEqual(again.stdout, b"2\n")
                        self.assertEqual(again.record.sequence, 3)
                        self.assertEqual(again.record.software_rule_id, SoftwareRule.exact(project).rule_id())
                    self.assertEqual(s.close().calls, 3)
                finally:
                    code = daemon.stop()
                self.assertEqual(code, 0, "plimsolld after SIGTERM; its log:\n" + "\n".join(daemon.log))


class WasmSoftwareRuleTest(unittest.TestCase):
    def test_the_guest_modules_content_address_is_its_software_identity(self) -> None:
        daemon = WasmDaemon()
        try:
            client = pc.Client(daemon.url, daemon.token, request_timeout=REQUEST_TIMEOUT)
            env = client.describe().javascript_environment
            self.assertRegex(env.software_identity, r"quickjs-wasm:sha256:[0-9a-f]{64}")
            self.assertEqual(env.software_identity, env.identity)
            ran = client.run_javascript("console.log(6*7)", software=SoftwareRule.exact(env.software_identity))
            self.assertEqual((ran.stdout, ran.record.software_identity), (b"42\n", env.software_identity))
            with self.assertRaises(pc.SoftwareMismatchError) as refused:
                client.run_javascript("1", software=SoftwareRule.exact("quickjs-wasm:sha256:" + "0" * 64))
            self.assertEqual(refused.exception.not_dispatched, "environment")
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
