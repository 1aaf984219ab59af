"""Hostile credential sources through a real daemon's C{POST /models/create} (issue 35: A10, A12-A14).

The daemon runs in this process (its Docker config is this process's environment, as C{twistd}'s is),
the registry is the stand-in (Bearer tokens, a token service that wants basic credentials), and the
helpers are real programs on PATH. Each pull answers in the API's JSON shape, never twisted.web's HTML.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred

from mrunner.store.artifact import OCI_MANIFEST
from mrunner.store.local import ModelStore
from tests.support.daemon import http
from tests.support.daemon_cases import DaemonTestCase
from tests.support.ggufs import write_tiny_gguf
from tests.support.registry_server import StandInRegistry

SECRETS = {"HF_TOKEN": "hf-secret-for-tests", "ALICE_KEY": "named-key-secret-for-tests"}


class HostileCredentialsTests(DaemonTestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        await self.start()
        self.bin = self.home / "bin"
        self.bin.mkdir()
        self.docker = self.home / "docker"
        self.docker.mkdir()
        for name, value in {
            **SECRETS,
            "DOCKER_CONFIG": str(self.docker),
            "PATH": f"{self.bin}:{os.environ['PATH']}",
        }.items():  # what the daemon's Credentials read at each lookup: this process's environment
            self.addCleanup(_restore, name, os.environ.get(name))
            os.environ[name] = value
        source = ModelStore(self.home / "source", reactor)  # type: ignore[arg-type]
        write_tiny_gguf(self.home / "served.gguf")
        with (self.home / "served.gguf").open("rb") as f:
            model = await source.import_gguf("served", f)
        manifest = source.manifest(model.id)
        blobs = {blob.digest: source.blobs.read(blob.digest) for blob in manifest.blobs}
        self.registry = StandInRegistry({"v1": (OCI_MANIFEST, manifest.to_bytes())}, blobs, auth="bearer")
        self.host = await self.registry.start()
        self.addCleanup(lambda: ensureDeferred(self.registry.stop()))
        self.auths = {self.host: {"auth": base64.b64encode(b"alice:secret").decode()}}

    def config(self, value: dict[str, Any] | bytes) -> None:
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        (self.docker / "config.json").write_bytes(data)

    def program(self, path: Path, script: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)

    async def pull(self) -> tuple[int, str, list[dict[str, Any]]]:
        """C{POST /models/create}: its status, content type and NDJSON lines (the body must be JSON)."""
        response = await http.post(
            self.daemon.url + "/models/create", json={"from": f"{self.host}/team/m:v1"}
        )
        body = await response.text()
        kind = response.headers.getRawHeaders("content-type", [""])[0]
        return response.code, kind, [json.loads(line) for line in body.splitlines()]

    async def test_a_token_that_is_no_header_value(self) -> None:
        self.registry.token_answer = json.dumps({"token": "tok-€"}).encode()
        self.config({"auths": self.auths})
        code, kind, [body] = await self.pull()
        self.assertEqual((code, kind), (502, "application/json"))
        self.assertIn("answered a token that cannot be sent in a header", body["error"]["message"])

    async def test_a_config_nested_too_deep(self) -> None:
        self.config(b"[" * 100_000)
        code, kind, [body] = await self.pull()
        self.assertEqual((code, kind), (401, "application/json"), "no credentials: the token service refuses")
        self.assertIn("token service", body["error"]["message"])

    async def test_a_helper_answer_nested_too_deep_then_auths(self) -> None:
        self.program(self.bin / "docker-credential-deep", "head -c 60000 /dev/zero | tr '\\0' '['")
        self.config({"credsStore": "deep", "auths": self.auths})
        code, _, lines = await self.pull()
        self.assertEqual((code, lines[-1]["type"]), (200, "success"))

    async def test_a_helper_sees_no_secret_and_a_path_is_no_helper(self) -> None:
        seen = self.home / "helper-saw"
        answer = json.dumps({"Username": "alice", "Secret": "secret"})
        self.program(self.bin / "docker-credential-env", f"env > {seen}; echo '{answer}'")
        # As the issue found it: a name that, taken as a path, is a program relative to the working directory.
        (Path.cwd() / "docker-credential-x").mkdir()
        self.addCleanup((Path.cwd() / "docker-credential-x").rmdir)
        evil, ran = Path.cwd() / "evil", self.home / "evil-ran"
        self.program(evil, f"touch {ran}")
        self.addCleanup(evil.unlink)
        self.config({"credHelpers": {self.host: "x/../evil"}, "auths": self.auths})
        code, _, lines = await self.pull()
        self.assertEqual((code, lines[-1]["type"], ran.exists()), (200, "success", False))
        self.config({"credsStore": "env"})
        await http.delete(self.daemon.url + f"/models/{self.host}/team/m:v1")
        code, _, lines = await self.pull()
        self.assertEqual((code, lines[-1]["type"]), (200, "success"))
        environment = seen.read_text()
        self.assertIn(f"DOCKER_CONFIG={self.docker}", environment)
        for value in SECRETS.values():
            self.assertNotIn(value, environment)

    async def test_a_logout_counts_at_the_next_pull(self) -> None:
        self.config({"auths": self.auths})
        code, _, lines = await self.pull()
        self.assertEqual((code, lines[-1]["type"]), (200, "success"))
        self.config({"auths": {}})
        await http.delete(self.daemon.url + f"/models/{self.host}/team/m:v1")
        code, kind, [body] = await self.pull()
        self.assertEqual((code, kind), (401, "application/json"), "the first pull's token is not sent again")
        self.assertIn("refused the credentials", body["error"]["message"])


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
