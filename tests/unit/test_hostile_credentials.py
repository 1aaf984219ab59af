"""Registry credentials from hostile sources (issue 35: A10, A12-A15, A23), and what a user is told about
them (issue 36: N11, N12).

Docker's config.json, a credential helper's answer and a token service's answer are written by others;
each that cannot be used is a logged error naming its source, then the next source, never a crash.
"""

from __future__ import annotations

import base64
import io
import json
import os
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

from klein import Klein
from rich.console import Console
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request

from mrunner import docker_config as dc
from mrunner.api.errors import handle_json_errors
from mrunner.api.manage.status import StatusAPI
from mrunner.cli.context import Context
from mrunner.cli.errors import DaemonError, explain
from mrunner.cli.login import registry
from mrunner.cli.main import parser
from mrunner.cli.status import status
from mrunner.config import RegistryConfig
from mrunner.docker_config import Credential
from mrunner.errors import BadGateway
from mrunner.names import parse
from mrunner.store.credentials import Credentials
from mrunner.store.registry import RegistryClient, Unauthorized, unreachable

HOST = "localhost:5000"
DEEP_CONFIG = b"[" * 100_000
DEEP_ANSWER = b"[" * 60_000


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


class HelperReactor(Clock):
    """A clock whose C{spawnProcess} records each helper run and answers as C{answers} says."""

    def __init__(self, answers: dict[str, tuple[bytes, int]]) -> None:
        super().__init__()
        self.answers = answers
        self.spawned: list[tuple[str, list[str], dict[str, str]]] = []

    def spawnProcess(self, protocol: Any, executable: str, args: list[str], env: dict[str, str]) -> object:
        self.spawned.append((executable, args, env))
        output, code = self.answers[Path(executable).name]
        protocol.makeConnection(_Pipes())
        protocol.childDataReceived(1, output)
        protocol.processExited(Failure(ProcessDone(0) if code == 0 else ProcessTerminated(code)))
        return object()


class _Pipes:
    def write(self, data: bytes) -> None:
        pass

    def closeStdin(self) -> None:
        pass


class Home:
    """A temporary DOCKER_CONFIG with a bin/ of helper programs (never run: L{HelperReactor} answers)."""

    def __init__(self, test: SynchronousTestCase, **environ: str) -> None:
        self.root = Path(test.mktemp()).absolute()
        (self.root / "bin").mkdir(parents=True)
        self.environ = {"DOCKER_CONFIG": str(self.root), "PATH": str(self.root / "bin"), **environ}

    def config(self, value: object | bytes) -> None:
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        (self.root / "config.json").write_bytes(data)

    def helper(self, name: str) -> None:
        program = self.root / "bin" / dc.program(name)
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)


class CredentialSourceTests(SynchronousTestCase):
    """A10, A13, A14: each hostile source is a warning that names it, and the next source is used."""

    def find(self, home: Home, answers: dict[str, tuple[bytes, int]]) -> tuple[Any, list[str], HelperReactor]:
        reactor = HelperReactor(answers)
        with capturedLogs() as events:
            found = self.successResultOf(ensureDeferred(Credentials({}, reactor, home.environ).find(HOST)))
        return found, [formatEvent(e) for e in events], reactor

    def test_a_config_nested_too_deep_is_an_error_naming_the_file(self) -> None:
        home = Home(self)
        home.config(DEEP_CONFIG)
        found, logged, _ = self.find(home, {})
        self.assertIsNone(found, "no credentials: the pull goes on without them")
        self.assertEqual(logged, [f"Docker credentials for {HOST} not used: {home.root}/config.json cannot be"
                                  " read: it is nested too deeply"])  # fmt: skip

    def test_a_helper_answer_nested_too_deep_falls_back_to_auths(self) -> None:
        home = Home(self)
        home.helper("deep")
        home.config({"credHelpers": {HOST: "deep"}, "auths": {HOST: {"auth": basic("u", "p")}}})
        found, logged, _ = self.find(home, {"docker-credential-deep": (DEEP_ANSWER, 0)})
        self.assertEqual(found, Credential("u", "p"))
        self.assertEqual(len(logged), 1)
        self.assertIn(
            "docker-credential-deep get: its answer cannot be read: it is nested too deeply", logged[0]
        )

    def test_a_helper_name_that_is_a_path_is_never_run(self) -> None:
        home = Home(self)
        evil = home.root / "elsewhere" / "evil"
        evil.parent.mkdir()
        evil.write_text("#!/bin/sh\n")
        evil.chmod(0o755)
        home.config(
            {"credHelpers": {HOST: "x/../../../elsewhere/evil"}, "auths": {HOST: {"auth": basic("u", "p")}}}
        )
        found, logged, reactor = self.find(home, {})
        self.assertEqual(reactor.spawned, [])
        self.assertEqual(found, Credential("u", "p"), "auths is the next source")
        self.assertIn("is not a credential helper's name", logged[0])
        home.config({"credsStore": "../evil"})
        self.assertIsNone(self.find(home, {})[0])

    def test_a_helper_is_found_on_absolute_path_entries_only(self) -> None:
        home = Home(self)
        home.helper("here")
        relative = os.path.relpath(home.root / "bin")
        home.environ["PATH"] = f"{relative}:"  # a relative entry, and the empty one (the working directory)
        home.config({"credsStore": "here"})
        found, logged, reactor = self.find(home, {"docker-credential-here": (b"{}", 0)})
        self.assertEqual((found, reactor.spawned), (None, []))
        self.assertIn("docker-credential-here is not on PATH", logged[0])

    def test_a_helper_gets_only_what_helpers_need(self) -> None:
        home = Home(
            self,
            HOME="/home/u",
            HF_TOKEN="hf-secret",
            ALICE_KEY="key-secret",
            MRUNNER_API_KEYS="admin-secret",
            AWS_PROFILE="ecr",
            PASSWORD_STORE_DIR="/home/u/.password-store",
        )
        home.environ["PATH"] += ":relative/bin"
        home.helper("pass")
        home.config({"credsStore": "pass"})
        answer = json.dumps({"Username": "u", "Secret": "s"}).encode()
        found, _, reactor = self.find(home, {"docker-credential-pass": (answer, 0)})
        self.assertEqual(found, Credential("u", "s"))
        [(executable, args, env)] = reactor.spawned
        self.assertEqual((executable, args[1:]), (str(home.root / "bin" / "docker-credential-pass"), ["get"]))
        self.assertEqual(
            env,
            {
                "DOCKER_CONFIG": str(home.root),
                "PATH": str(home.root / "bin"),
                "HOME": "/home/u",
                "AWS_PROFILE": "ecr",
                "PASSWORD_STORE_DIR": "/home/u/.password-store",
            },
        )

    def test_the_config_file_is_named(self) -> None:
        self.assertEqual(Credentials({}, Clock(), {"HOME": "/h"}).config_file, "/h/.docker/config.json")
        self.assertIsNone(Credentials({}).config_file, "only [registry.auth]")


class RegistryNameTests(SynchronousTestCase):
    """A23: what `mrunner login` and `logout` take as a registry; nothing else reaches config.json."""

    def test_names(self) -> None:
        for good in ("localhost:5000", "docker.io", "10.0.0.1:443", "r-1.example.com"):
            self.assertEqual(registry(good), good)
        self.assertEqual(registry("Registry.Example.com"), "registry.example.com", "as pulls name it")
        for bad in ("../etc", "a;b", "a\nb", "", "a/b", "host:99999", "https://r.test/v1/"):
            for command in ("login", "logout"):
                said = io.StringIO()
                with self.assertRaises(SystemExit) as exit, redirect_stderr(said):
                    parser().parse_args([command, bad])
                self.assertEqual(exit.exception.code, 2, f"{command} {bad!r}: a usage error")
                self.assertIn(f"{bad!r} is not a registry's host[:port]", said.getvalue())

    def test_the_help_says_whose_config_the_daemon_reads(self) -> None:
        login = parser()._subparsers._group_actions[0].choices["login"]  # type: ignore[union-attr]
        text = " ".join(login.format_help().split())
        self.assertIn("The daemon reads the config of the user it runs as", text)
        self.assertIn("`mrunner status` names the file", text)


class TokenRegistry(Resource):
    """One repository behind a Bearer (or Basic) challenge, and its token service; records every request."""

    isLeaf = True

    def __init__(
        self, scheme: str = "Bearer", realm: str = "http://localhost:5000/token", token: bytes = b""
    ) -> None:
        super().__init__()
        self.scheme = scheme
        self.realm = realm
        self.token = token or json.dumps({"token": "good-token"}).encode()
        self.password = "p"
        self.seen: list[tuple[bytes, str | None]] = []

    def render(self, request: Request) -> bytes:
        given = request.getHeader("authorization")
        self.seen.append((request.uri, given))
        if request.path == b"/token":
            return self.token
        if given in ("Bearer good-token", f"Basic {basic('u', self.password)}"):
            return b'{"manifest": true}'
        request.setResponseCode(401)
        challenge = (
            f'Bearer realm="{self.realm}",service="s"' if self.scheme == "Bearer" else 'Basic realm="r"'
        )
        request.setHeader("www-authenticate", challenge)
        return b""

    def tokens(self) -> list[bytes]:
        return [uri for uri, _ in self.seen if uri.startswith(b"/token")]


class RegistryClientTests(SynchronousTestCase):
    """A10 (a token that is no header value), A12 (credentials read at each pull), A15 (a realm's query)."""

    def setUp(self) -> None:
        self.home = Home(self)
        self.clients: dict[int, tuple[RegistryClient, StubTreq]] = {}

    def manifest(self, server: TokenRegistry) -> Deferred[bytes]:
        """One pull's manifest request, as a pull makes it: its own fresh repository, from the one client
        the daemon has (per server, here)."""
        if id(server) not in self.clients:
            clock, http = Clock(), StubTreq(server)
            credentials = Credentials({}, clock, self.home.environ)
            self.clients[id(server)] = (
                RegistryClient(RegistryConfig(), clock, http, credentials=credentials),
                http,
            )
        client, http = self.clients[id(server)]
        [repo] = client.repositories(parse(f"{HOST}/team/model:v1"))
        result = ensureDeferred(client.manifest(repo, "v1"))
        http.flush()
        return result

    def test_a_logout_counts_at_the_next_pull(self) -> None:
        server = TokenRegistry(scheme="Basic")
        self.home.config({"auths": {HOST: {"auth": basic("u", "p")}}})
        self.assertEqual(self.successResultOf(self.manifest(server)), b'{"manifest": true}')
        self.home.config({"auths": {}})  # mrunner logout
        self.failureResultOf(self.manifest(server), Unauthorized)

    def test_a_changed_password_counts_at_the_next_pull(self) -> None:
        server = TokenRegistry(scheme="Basic")
        self.home.config({"auths": {HOST: {"auth": basic("u", "p")}}})
        self.successResultOf(self.manifest(server))
        server.password = "new"
        self.home.config({"auths": {HOST: {"auth": basic("u", "new")}}})
        before = len(server.seen)
        self.successResultOf(self.manifest(server))
        sent = [authorization for _, authorization in server.seen[before:]]
        self.assertEqual(sent, [None, f"Basic {basic('u', 'new')}"], "the old password is not sent again")

    def test_each_pull_asks_for_its_own_token(self) -> None:
        server = TokenRegistry()
        self.successResultOf(self.manifest(server))
        self.successResultOf(self.manifest(server))
        self.assertEqual(len(server.tokens()), 2)

    def test_a_realm_with_a_query_gets_the_rest_with_an_ampersand(self) -> None:
        server = TokenRegistry(realm="http://localhost:5000/token?mode=x")
        self.successResultOf(self.manifest(server))
        self.assertEqual(server.tokens(), [b"/token?mode=x&service=s&scope=repository%3Ateam%2Fmodel%3Apull"])

    def test_a_token_that_is_no_header_value_is_the_token_services_error(self) -> None:
        for token in ("tok-€", "tok en", "tok\r\nX-Injected: 1"):
            server = TokenRegistry(token=json.dumps({"token": token}).encode())
            error = self.failureResultOf(self.manifest(server), BadGateway).value
            self.assertIn(
                "token service http://localhost:5000/token answered a token that cannot be", error.message
            )

    def test_a_realm_that_is_no_url_is_the_registrys_error(self) -> None:
        error = self.failureResultOf(
            self.manifest(TokenRegistry(realm="http://[bad/token")), BadGateway
        ).value
        self.assertIn("names a token service 'http://[bad/token' that is not a URL", error.message)


class TellingTheUserTests(SynchronousTestCase):
    """N11: an unreachable registry says the cause and the next step; the CLI adds no HTTP status."""

    def test_unreachable(self) -> None:
        error = unreachable("registry index.docker.io", OSError("DNS lookup failed"))
        self.assertEqual(error.code, "registry_unreachable")
        self.assertIn(
            "registry index.docker.io is unreachable (DNS lookup failed): check the network", error.message
        )
        self.assertIn("`mrunner package --gguf FILE NAME`", error.message)
        self.assertIn("localhost:5000/NAME", error.message)
        said = explain(DaemonError(error.status, error.message, error.code), "pull", "ai/gemma3")
        self.assertEqual(said, error.message, "no (HTTP 502)")


class FakeDaemon:
    """Answers C{mrunner status}'s calls."""

    url = "http://127.0.0.1:12434"

    def __init__(self, docker_config: str | None) -> None:
        self.answers = {
            "/engines/status": {"llama.cpp": "Running"},
            "/engines/ps": [],
            "/version": {"version": "0", "docker_config": docker_config},
            "/ready": {"preloads": []},
        }

    def call(self, method: str, path: str) -> object:
        return self.answers[path]


class WhichConfigTests(SynchronousTestCase):
    """N12: the daemon names the Docker config it reads, and `mrunner status` shows it."""

    def test_version_names_the_config(self) -> None:
        for docker_config in ("/home/daemon/.docker/config.json", None):
            api = StatusAPI(None, None, None, None, docker_config)  # type: ignore[arg-type]
            response = self.successResultOf(StubTreq(api.app.resource()).get("http://localhost/version"))
            body = self.successResultOf(response.json())
            self.assertEqual(body["docker_config"], docker_config)

    def test_status_shows_it(self) -> None:
        for docker_config, line in [
            (
                "/home/daemon/.docker/config.json",
                "registry logins: read from /home/daemon/.docker/config.json",
            ),
            (None, "registry logins: [registry.auth] in tap.conf only"),
        ]:
            out = io.StringIO()
            console = Console(file=out, width=200)
            daemon = FakeDaemon(docker_config)
            status(Context(lambda daemon=daemon: daemon, console, console), parser().parse_args(["status"]))  # type: ignore[arg-type,return-value]
            self.assertIn(line, out.getvalue())


class UnforeseenErrorTests(SynchronousTestCase):
    """An exception no route foresaw is a 500 in the API's JSON shape, not twisted.web's HTML page."""

    def test_json_500(self) -> None:
        class Broken:
            app = Klein()
            handle_json_errors(app)

            @app.route("/deep")
            def deep(self, request: object) -> bytes:
                raise RecursionError("maximum recursion depth exceeded")

        http = StubTreq(Broken().app.resource())
        with capturedLogs() as events:
            response = self.successResultOf(http.get("http://localhost/deep"))
            body = self.successResultOf(response.json())
        self.assertEqual(response.code, 500)
        self.assertEqual(
            body["error"],
            {
                "message": "the daemon failed on this request (RecursionError); its log has the details",
                "type": "server_error",
                "code": "internal_error",
            },
        )
        self.assertEqual([formatEvent(e) for e in events], ["GET /deep failed"])
        self.assertEqual(len(self.flushLoggedErrors(RecursionError)), 1)
