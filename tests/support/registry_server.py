"""Registries for tests: the real CNCF distribution registry, and a small stand-in that misbehaves.

The real one (Debian's C{docker-registry}) is started on a free loopback port
with a temporary storage directory and stopped by PID. The stand-in serves a
fixed repository and can cut a blob mid-way, stall in it, corrupt it, or demand Bearer or
basic authentication, name any token realm, answer for a token with a huge
body or a redirect, to test what a well-behaved registry never does.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

BINARY = "/usr/bin/docker-registry"
SKIP = (
    None
    if os.access(BINARY, os.X_OK)
    else (f"{BINARY} is missing: apt-get install docker-registry (the CNCF distribution registry)")
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Exited(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: Deferred[None] = Deferred()
        self.output = b""

    def errReceived(self, data: bytes) -> None:
        self.output = (self.output + data)[-4000:]

    outReceived = errReceived

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(None)


class RealRegistry:
    """C{docker-registry serve config.yml}, on 127.0.0.1:<free port>."""

    def __init__(self, directory: Path, htpasswd: Path | None = None) -> None:
        """With C{htpasswd} (bcrypt entries, as C{htpasswd -B} writes), every request needs basic auth."""
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        storage = directory / "storage"
        storage.mkdir(parents=True)
        self.config = directory / "config.yml"
        self.config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
            + (f"auth:\n  htpasswd:\n    realm: tests\n    path: {htpasswd}\n" if htpasswd else "")
        )
        self._protocol = _Exited()

    async def start(self) -> None:
        reactor.spawnProcess(  # type: ignore[attr-defined]
            self._protocol, BINARY, [BINARY, "serve", str(self.config)], env=None
        )
        for _ in range(200):
            try:
                response = await treq.get(f"http://{self.host}/v2/", persistent=False)
                await response.content()
                if response.code in (200, 401):
                    return
            except Exception:  # not listening yet
                pass
            await deferLater(reactor, 0.05, lambda: None)
        raise RuntimeError(f"docker-registry did not start: {self._protocol.output!r}")

    async def stop(self) -> None:
        transport = self._protocol.transport
        if transport is not None and transport.pid is not None:  # type: ignore[attr-defined]
            os.kill(transport.pid, signal.SIGTERM)  # type: ignore[attr-defined]
        await self._protocol.ended


@attrs.define
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None


class StandInRegistry(Resource):
    """A registry holding one repository's manifests and blobs, with faults on demand."""

    isLeaf = True

    def __init__(
        self,
        manifests: Mapping[str, tuple[str, bytes]],
        blobs: Mapping[str, bytes],
        *,
        cut_at: int | None = None,
        stall_at: int | None = None,
        corrupt: bool = False,
        auth: str | None = None,
        credentials: tuple[str, str] = ("alice", "secret"),
        realm: str = "http://{host}/token",
        token_answer: bytes | None = None,
        token_redirect: bool = False,
        refresh_token: str | None = None,
    ) -> None:
        super().__init__()
        self.manifests = dict(manifests)
        self.blobs = dict(blobs)
        self.cut_at = cut_at
        self.stall_at = stall_at
        self.corrupt = corrupt
        self.auth = auth
        self.basic = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
        self.token = "token-for-tests"
        self.realm = realm
        self.token_answer = token_answer
        self.token_redirect = token_redirect
        self.refresh_token = refresh_token  # what an OAuth2 POST to the realm must send (an identity token)
        self.seen: list[Seen] = []
        self.port: Any = None

    async def start(self) -> str:
        self.port = reactor.listenTCP(0, Site(self), interface="127.0.0.1")  # type: ignore[attr-defined]
        return f"127.0.0.1:{self.port.getHost().port}"

    async def stop(self) -> None:
        if self.port.connected:
            await self.port.stopListening()

    def blob_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and "/blobs/" in s.path]

    def render(self, request: Request) -> bytes | int:
        path = request.path.decode()
        header = request.getHeader
        self.seen.append(Seen(request.method.decode(), path, header("range"), header("authorization")))
        if path == "/token" and self.token_redirect:
            request.redirect(f"http://{header('host')}/token-elsewhere".encode())
            return b""
        if path == "/token" and request.method == b"POST":
            form = request.args
            if self.refresh_token is None or form.get(b"refresh_token") != [self.refresh_token.encode()]:
                request.setResponseCode(401)
                return b"{}"
            return json.dumps({"access_token": self.token}).encode()
        if path in ("/token", "/token-elsewhere"):
            if header("authorization") != self.basic:
                request.setResponseCode(401)
                return b"{}"
            return self.token_answer or json.dumps({"token": self.token}).encode()
        if not self._authorised(request):
            return b'{"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}'
        parts = path.split("/")
        if "manifests" in parts:
            entry = self.manifests.get(parts[-1])
            if entry is None:
                request.setResponseCode(404)
                return b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}'
            request.setHeader("content-type", entry[0])
            return entry[1]
        if "blobs" in parts and parts[-1] in self.blobs:
            return self._blob(request, self.blobs[parts[-1]])
        request.setResponseCode(404)
        return b"{}"

    def _authorised(self, request: Request) -> bool:
        given = request.getHeader("authorization")
        if self.auth is None:
            return True
        if self.auth == "bearer" and given == f"Bearer {self.token}":
            return True
        if self.auth == "basic" and given == self.basic:
            return True
        realm = self.realm.format(host=request.getHeader("host"), port=self.port.getHost().port)
        request.setResponseCode(401)
        request.setHeader(
            "www-authenticate",
            f'Bearer realm="{realm}",service="stand-in",scope="repository:x:pull"'
            if self.auth == "bearer"
            else 'Basic realm="stand-in"',
        )
        return False

    def _blob(self, request: Request, data: bytes) -> bytes | int:
        if self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        return serve_range(request, data, self.cut_at, self.stall_at)


def serve_range(
    request: Request, data: bytes, cut_at: int | None = None, stall_at: int | None = None
) -> bytes | int:
    """C{data} from the request's C{Range: bytes=N-} (206) or whole (200); cut the connection at C{cut_at}.

    With C{stall_at}, the bytes before it are sent and then nothing more, the connection held
    open (at 0, not even the headers): the client has to give up.
    """
    start = 0
    wanted = request.getHeader("range")
    if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
        start = int(wanted[6:-1])
        request.setResponseCode(206)
        request.setHeader("content-range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    body = data[start:]
    request.setHeader("content-length", str(len(body)))
    if cut_at is not None and start < cut_at:
        request.write(body[: cut_at - start])
        request.loseConnection()
        return NOT_DONE_YET
    if stall_at is not None:
        if stall_at > start:
            request.write(body[: stall_at - start])
        return NOT_DONE_YET
    return body
