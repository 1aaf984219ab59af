"""Imports through a real daemon's front door: the body is staged in the store as it arrives.

The daemon runs in this process on the real reactor; the blocking clients (a raw socket,
httpx) run in threads, or send no more than the kernel's socket buffer takes.
"""

from __future__ import annotations

import hashlib
import json
import socket
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import httpx2
from twisted.internet.threads import deferToThread

from tests.support.daemon import eventually, http
from tests.support.daemon_cases import MODEL, DaemonTestCase
from tests.support.front_door import port_of
from tests.support.ggufs import package, write_tiny_gguf

TAR = "application/x-tar"


def head(length: int, name: str = "pkg", content_type: str = TAR) -> bytes:
    return (
        f"POST /models/load?name={name} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


def answer(connection: socket.socket) -> tuple[int, Any]:
    """The status and JSON body of the response on C{connection} (blocking: a thread's job)."""
    response = HTTPResponse(connection)
    response.begin()
    return response.status, json.loads(response.read())


class UploadTests(DaemonTestCase):
    async def start(self) -> None:
        await super().start()
        write_tiny_gguf(self.home / "big.gguf", rows=8192)  # 512 KiB: more than a file's write buffer
        self.gguf = (self.home / "big.gguf").read_bytes()
        self.blobs = self.home / "models" / "blobs" / "sha256"

    def stored(self, content: bytes) -> bool:
        blob = self.blobs / hashlib.sha256(content).hexdigest()
        return blob.is_file() and blob.read_bytes() == content

    async def models(self) -> list[list[str]]:
        response = await http.get(self.daemon.url + "/models")
        return [model["tags"] for model in await response.json()]

    def staged(self) -> list[Path]:
        """The import temps in the store (a pull's partials are named by digest)."""
        return sorted(self.blobs.glob("import-*"))

    def connect(self) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", port_of(self.daemon.url)), timeout=30)
        self.addCleanup(connection.close)
        return connection

    async def test_a_package_is_written_to_the_store_as_it_arrives(self) -> None:
        await self.start()
        body = package([("model.gguf", self.gguf), ("licenses/LICENSE", b"MIT\n")])
        half = len(self.gguf) // 2
        connection = self.connect()
        connection.sendall(head(len(body)) + body[: 512 + half])  # the tar header, half the weights
        # Written and hashed before the rest is sent: the route has not run, nothing was spooled.
        await eventually(lambda: len(self.staged()) == 1 and self.staged()[0].stat().st_size > half - 8192)
        connection.sendall(body[512 + half :])
        status, model = await deferToThread(answer, connection)
        self.assertEqual((status, model["tags"]), (201, ["ai/pkg:latest"]), model)
        self.assertTrue(self.stored(self.gguf) and self.stored(b"MIT\n"))
        self.assertEqual(self.staged(), [])

    async def test_a_client_gone_mid_upload_leaves_nothing(self) -> None:
        await self.start()
        for content_type, body in [(TAR, package([("model.gguf", self.gguf)])), ("x/gguf", self.gguf)]:
            connection = self.connect()
            connection.sendall(head(len(body), content_type=content_type) + body[:20_000])
            await eventually(lambda: len(self.staged()) == 1)
            connection.close()
            await eventually(lambda: self.staged() == [], what=lambda: f"{self.staged()} to be removed")
        self.assertEqual(await self.models(), [[MODEL]])

    async def test_a_client_gone_once_its_body_is_in_gets_its_model_all_the_same(self) -> None:
        await self.start()
        connection = self.connect()
        connection.sendall(head(len(self.gguf), "gone", "application/gguf") + self.gguf)
        connection.close()  # the route runs, then Klein cancels it: the files are the store's still
        await eventually(lambda: self.staged() == [] and self.stored(self.gguf))
        self.assertEqual(await self.models(), [[MODEL], ["ai/gone:latest"]])

    async def test_bad_bodies_are_400s_that_leave_nothing(self) -> None:
        await self.start()
        cut = package([("model.gguf", self.gguf)])[:20_000]
        for content_type, body, fragment in [
            ("application/octet-stream", b"junk" * 1000, "not a valid GGUF file"),
            ("application/octet-stream", b"", "the body is empty"),
            (TAR, b"junk" * 1000, "not a tar archive"),
            (TAR, cut, "the package ends in the middle of 'model.gguf': the upload was cut short"),
            (TAR, package([("model.gguf", self.gguf), ("../etc/passwd", b"x")]), "'../etc/passwd'"),
        ]:
            connection = self.connect()
            connection.sendall(head(len(body), content_type=content_type) + body)
            status, error = await deferToThread(answer, connection)
            self.assertEqual(status, 400, error)
            self.assertIn(fragment, error["error"]["message"])
            self.assertEqual(self.staged(), [])
        self.assertEqual(await self.models(), [[MODEL]])

    async def test_a_chunked_upload_is_imported(self) -> None:
        await self.start()
        body = package([("model.gguf", self.gguf)])

        def post() -> httpx2.Response:
            pieces = (body[offset : offset + 10_000] for offset in range(0, len(body), 10_000))
            with httpx2.Client(timeout=30) as client:  # a generator's length is unknown: chunked
                return client.post(
                    f"{self.daemon.url}/models/load", params={"name": "chunked"}, content=pieces,
                    headers={"Content-Type": TAR},
                )  # fmt: skip

        response = await deferToThread(post)
        self.assertEqual(response.status_code, 201, response.text)
        self.assertEqual(response.json()["tags"], ["ai/chunked:latest"])
        self.assertTrue(self.stored(self.gguf))
        self.assertEqual(self.staged(), [])
