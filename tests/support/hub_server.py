"""A stand-in Hugging Face Hub: the documented API shape over real files, and a separate "CDN".

The Hub answers ``/api/models/{repo}/revision/main`` with the commit, its
date and every file with its LFS sha256, and redirects
``/{repo}/resolve/{commit}/{path}`` to the CDN, another server (another
host:port), which serves ranges and can cut a download once. As the real Hub
does, an unknown repository is 401 ``RepoNotFound`` without a token (404
with one), a private one the same without the right token, and a gated one
lists its files but refuses them (403 without a token, 401 with a wrong one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs
from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from tests.support.registry_server import serve_range

TOKEN = "hf_test_token"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@attrs.define
class Repo:
    files: Mapping[str, bytes]
    gated: bool = False
    private: bool = False
    sizes: Mapping[str, int] = attrs.field(factory=dict)  # sizes the listing gives instead of the true ones


@attrs.frozen
class Seen:
    host: str
    path: str
    range: str | None
    authorization: str | None


class _Server(Resource):
    isLeaf = True

    def __init__(self, seen: list[Seen]) -> None:
        super().__init__()
        self.seen = seen
        self.port: Any = None

    def start(self) -> str:
        self.port = reactor.listenTCP(0, Site(self), interface="127.0.0.1")  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def note(self, request: Request) -> None:
        header = request.getHeader
        self.seen.append(
            Seen(header("host") or "", request.path.decode(), header("range"), header("authorization"))
        )


class CDN(_Server):
    """Blobs by sha256, with ranges; C{cut_at} cuts the first download of each blob there,
    C{stall_at} stalls every download there."""

    def __init__(self, seen: list[Seen], cut_at: int | None = None, stall_at: int | None = None) -> None:
        super().__init__(seen)
        self.blobs: dict[str, bytes] = {}
        self.cut_at = cut_at
        self.stall_at = stall_at
        self._cut: set[str] = set()

    def render_GET(self, request: Request) -> bytes | int:
        self.note(request)
        sha = request.path.decode().rsplit("/", 1)[-1]
        data = self.blobs.get(sha)
        if data is None:
            request.setResponseCode(404)
            return b"not found"
        cut = self.cut_at if sha not in self._cut and (self.cut_at or 0) < len(data) else None
        self._cut.add(sha)
        return serve_range(request, data, cut, self.stall_at)


class StandInHub(_Server):
    """Repositories by ``org/repo`` (lowercase), their files served through the L{CDN}."""

    def __init__(
        self, repos: Mapping[str, Repo], cut_at: int | None = None, stall_at: int | None = None
    ) -> None:
        self.seen: list[Seen] = []
        super().__init__(self.seen)
        self.repos = dict(repos)
        self.cdn = CDN(self.seen, cut_at, stall_at)
        self.cdn_url = ""

    def start(self) -> str:
        self.cdn_url = self.cdn.start()
        return super().start()

    async def stop(self) -> None:
        for server in (self, self.cdn):
            if server.port is not None and server.port.connected:
                await server.port.stopListening()

    def add(self, name: str, repo: Repo) -> None:
        self.repos[name] = repo
        for data in repo.files.values():
            self.cdn.blobs[hashlib.sha256(data).hexdigest()] = data

    def render_GET(self, request: Request) -> bytes:
        self.note(request)
        parts = request.path.decode().split("/")
        if parts[1:3] == ["api", "models"] and parts[-2:] == ["revision", "main"]:
            return self._revision(request, "/".join(parts[3:-2]))
        if len(parts) > 5 and parts[3] == "resolve":
            return self._resolve(request, "/".join(parts[1:3]), "/".join(parts[5:]))
        request.setResponseCode(404)
        return b"{}"

    def _access(self, request: Request, name: str, download: bool) -> Repo | None:
        """The repo if this request may see it; else the Hub's error status and code are set."""
        given = request.getHeader("authorization")
        good = given == f"Bearer {TOKEN}"
        repo = self.repos.get(name)
        if repo is None or (repo.private and not good):
            request.setResponseCode(404 if given else 401)
            request.setHeader("x-error-code", "RepoNotFound")
            return None
        if repo.gated and download and not good:
            request.setResponseCode(401 if given else 403)
            request.setHeader("x-error-code", "GatedRepo")
            return None
        return repo

    def _revision(self, request: Request, name: str) -> bytes:
        repo = self._access(request, name, download=False)
        if repo is None:
            return b'{"error": "Repository not found"}'
        siblings = [
            {
                "rfilename": path,
                "size": repo.sizes.get(path, len(data)),
                "lfs": {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": repo.sizes.get(path, len(data)),
                    "pointerSize": 134,
                },
            }
            if path.endswith((".gguf", ".safetensors", ".bin"))
            else {"rfilename": path, "size": len(data)}
            for path, data in repo.files.items()
        ]
        value = {
            "id": name,
            "sha": COMMIT,
            "lastModified": "2025-01-02T03:04:05.000Z",
            "gated": "manual" if repo.gated else False,
            "private": repo.private,
            "siblings": siblings,
        }
        request.setHeader("content-type", "application/json")
        return json.dumps(value).encode()

    def _resolve(self, request: Request, name: str, path: str) -> bytes:
        repo = self._access(request, name, download=True)
        if repo is None:
            return b'{"error": "Access denied"}'
        data = repo.files.get(path)
        if data is None:
            request.setResponseCode(404)
            request.setHeader("x-error-code", "EntryNotFound")
            return b"{}"
        request.redirect(f"{self.cdn_url}/repos/{hashlib.sha256(data).hexdigest()}".encode())
        return b""
