"""Docker's credentials, end to end: `mrunner login` stores them where `docker login` would, and the
daemon's registry client finds them for a real docker-registry that wants basic auth (htpasswd).

The helper is Debian's docker-credential-pass over a real `pass` store with a GPG key made for the
test (batch mode, no passphrase, in a temporary GNUPGHOME); a helper that hangs is a script.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from mrunner.config import RegistryConfig
from mrunner.names import parse
from mrunner.store.artifact import OCI_MANIFEST
from mrunner.store.credentials import Credentials
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.registry import RegistryClient, Unauthorized
from tests.support.ggufs import write_tiny_gguf
from tests.support.registry_server import SKIP, RealRegistry, StandInRegistry

MRUNNER = str(Path(sys.executable).with_name("mrunner"))
USER, PASSWORD = "alice", "s3cret-for-tests"
NEEDED = ("htpasswd", "pass", "gpg", "docker-credential-pass")
MISSING = [name for name in NEEDED if shutil.which(name) is None]


class DockerCredentialsTests(TestCase):
    skip = SKIP or (f"{', '.join(MISSING)} missing: `make system-deps`" if MISSING else None)
    timeout = 120

    async def setUp(self) -> None:  # type: ignore[override]
        self.dir = Path(tempfile.mkdtemp(prefix="mr-dc-"))  # short: gpg-agent's socket path has a limit
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        bin = self.dir / "bin"
        bin.mkdir()
        self.env = {
            "HOME": str(self.dir),
            "PATH": f"{bin}:{os.environ['PATH']}",
            "DOCKER_CONFIG": str(self.dir / "docker"),
            "GNUPGHOME": str(self.dir / "gnupg"),
            "PASSWORD_STORE_DIR": str(self.dir / "password-store"),
        }
        htpasswd = self.dir / "htpasswd"
        htpasswd.write_bytes(
            subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, check=True).stdout
        )
        self.registry = RealRegistry(self.dir / "registry", htpasswd)
        await self.registry.start()
        self.addCleanup(lambda: ensureDeferred(self.registry.stop()))
        self.host = self.registry.host
        self.name = f"{self.host}/team/tiny:v1"
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def client(self, name: str, configured: RegistryConfig | None = None, timeout: float = 10.0) -> Any:
        """A store and a registry client as the daemon builds them, Docker's config read from C{self.env}."""
        config = configured or RegistryConfig()
        store = ModelStore(self.dir / name, reactor)  # type: ignore[arg-type]
        credentials = Credentials(config.auth, reactor, self.env, timeout)
        client = RegistryClient(config, reactor, credentials=credentials)  # type: ignore[arg-type]
        self.addCleanup(client.close)
        return store, Puller(store, client), Pusher(store, client, reactor)  # type: ignore[arg-type]

    async def push_and_pull(self, **kw: Any) -> None:
        store, _, pusher = self.client("source", **kw)
        gguf = self.dir / "tiny.gguf"
        write_tiny_gguf(gguf)
        with gguf.open("rb") as f:
            await store.import_gguf(self.name, f)
        await pusher.push(parse(self.name), Progress(lambda line: None, reactor, "push"))  # type: ignore[arg-type]
        await self.pull("other", **kw)

    async def pull(self, name: str, **kw: Any) -> None:
        _store, puller, _ = self.client(name, **kw)
        model = await puller.pull(parse(self.name), Progress(lambda line: None, reactor, "pull"))  # type: ignore[arg-type]
        self.assertEqual(model.tags, (self.name,))

    async def mrunner(self, *args: str, stdin: bytes = b"") -> str:
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, args, env=self.env, reactor=reactor, stdinBytes=stdin
        )
        self.assertEqual(code, 0, err)
        return out.decode()

    def docker_config(self) -> dict[str, Any]:
        return json.loads((self.dir / "docker" / "config.json").read_text())

    def write_docker_config(self, value: dict[str, Any]) -> None:
        (self.dir / "docker").mkdir(exist_ok=True)
        (self.dir / "docker" / "config.json").write_text(json.dumps(value))

    def assertNoSecretLogged(self) -> None:
        text = repr(self.events)
        self.assertNotIn(PASSWORD, text)

    async def test_login_to_the_config_file_then_logout(self) -> None:
        out = await self.mrunner("login", self.host, "-u", USER, stdin=PASSWORD.encode() + b"\n")
        self.assertIn(str(self.dir / "docker" / "config.json"), out)
        self.assertEqual(oct((self.dir / "docker" / "config.json").stat().st_mode & 0o777), "0o600")
        self.assertIn("auth", self.docker_config()["auths"][self.host])
        await self.push_and_pull()
        self.assertEqual(await self.mrunner("logout", self.host), f"Removed the login for {self.host}\n")
        self.assertEqual(self.docker_config()["auths"], {})
        error = await self.assertFailure(ensureDeferred(self.pull("third")), Unauthorized)
        self.assertIn(f"`mrunner login {self.host}`", error.message)
        self.assertNoSecretLogged()

    async def test_login_through_pass(self) -> None:
        """credsStore "pass": the secret goes to docker-credential-pass (GPG-encrypted), not into the file."""
        gpg = {**os.environ, **self.env}
        (self.dir / "gnupg").mkdir(mode=0o700)
        self.addCleanup(subprocess.run, ["gpgconf", "--kill", "gpg-agent"], env=gpg, check=False)
        subprocess.run(
            ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
             "mrunner test <test@mrunner.invalid>", "future-default", "default", "never"],
            env=gpg, check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(["pass", "init", "test@mrunner.invalid"], env=gpg, check=True, capture_output=True)
        self.write_docker_config({"credsStore": "pass"})
        out = await self.mrunner("login", self.host, "-u", USER, "--password-stdin", stdin=PASSWORD.encode())
        self.assertIn("docker-credential-pass", out)
        self.assertNotIn(PASSWORD, (self.dir / "docker" / "config.json").read_text())
        self.assertEqual(self.docker_config()["auths"], {self.host: {}})
        await self.push_and_pull()
        await self.mrunner("logout", self.host)
        await self.assertFailure(ensureDeferred(self.pull("third")), Unauthorized)
        self.assertNoSecretLogged()

    async def test_a_hanging_helper_is_killed_and_auths_used(self) -> None:
        hang = self.dir / "bin" / "docker-credential-hang"
        hang.write_text("#!/bin/sh\nexec sleep 600\n")
        hang.chmod(0o755)
        pair = f"{USER}:{PASSWORD}".encode()
        self.write_docker_config(
            {
                "credHelpers": {self.host: "hang"},
                "auths": {f"http://{self.host}/v1/": {"auth": base64.b64encode(pair).decode()}},
            }
        )
        await self.push_and_pull(timeout=0.5)
        warnings = [e for e in self.events if "docker-credential-hang did not answer" in str(e.get("error"))]
        self.assertTrue(warnings)
        self.assertNoSecretLogged()

    async def test_username_and_password_and_a_missing_helper(self) -> None:
        """A helper that is not installed is told; auths' username/password still serve."""
        self.write_docker_config(
            {
                "credHelpers": {self.host: "absent"},
                "auths": {self.host: {"username": USER, "password": PASSWORD}},
            }
        )
        await self.push_and_pull()
        self.assertTrue(
            [e for e in self.events if "docker-credential-absent is not on PATH" in str(e.get("error"))]
        )

    async def test_registry_auth_in_tap_conf_wins(self) -> None:
        self.write_docker_config({"auths": {self.host: {"username": USER, "password": "wrong"}}})
        configured = RegistryConfig(auth={self.host: {"username": USER, "password": PASSWORD}})
        await self.push_and_pull(configured=configured)
        await self.assertFailure(ensureDeferred(self.pull("third")), Unauthorized)


class IdentityTokenTests(TestCase):
    """An C{identitytoken} is an OAuth2 refresh token: POSTed to the registry's token service for a Bearer."""

    async def test_pull_with_an_identity_token(self) -> None:
        directory = Path(self.mktemp())
        source = ModelStore(directory / "source", reactor)  # type: ignore[arg-type]
        gguf = directory / "tiny.gguf"
        write_tiny_gguf(gguf)
        with gguf.open("rb") as f:
            model = await source.import_gguf("tiny", f)
        blobs = {b.digest: source.blobs.read(b.digest) for b in source.manifest(model.id).blobs}
        entry = (OCI_MANIFEST, source.manifest_bytes(model.id))
        registry = StandInRegistry({"v1": entry}, blobs, auth="bearer", refresh_token="refresh-me")
        host = await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        (directory / "docker").mkdir()
        (directory / "docker" / "config.json").write_text(
            json.dumps({"auths": {host: {"identitytoken": "refresh-me"}}})
        )
        environ = {"DOCKER_CONFIG": str(directory / "docker"), "PATH": os.environ["PATH"]}
        credentials = Credentials({}, reactor, environ)
        client = RegistryClient(RegistryConfig(), reactor, credentials=credentials)  # type: ignore[arg-type]
        self.addCleanup(client.close)
        pulled = await Puller(ModelStore(directory / "other", reactor), client).pull(  # type: ignore[arg-type]
            parse(f"{host}/team/tiny:v1"),
            Progress(lambda line: None, reactor, "pull"),  # type: ignore[arg-type]
        )
        self.assertEqual(pulled.id, model.id)
        tokens = [s for s in registry.seen if s.path == "/token"]
        self.assertEqual([(s.method, s.authorization) for s in tokens], [("POST", None)])
        self.assertEqual(registry.blob_requests()[-1].authorization, "Bearer token-for-tests")
