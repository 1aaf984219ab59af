"""Pull and push against real registries: docker-registry, and a stand-in that misbehaves.

These tests use the real reactor, real sockets and a real child process;
each finishes in well under a second.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import attrs
import treq
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Site

from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import ModelsAPI
from mrunner.cli.package import TarStream, members
from mrunner.config import RegistryConfig
from mrunner.errors import BadGateway, NotFound
from mrunner.names import parse
from mrunner.store.artifact import (
    GGUF,
    MMPROJ,
    MODEL_CONFIG,
    OCI_MANIFEST,
    Descriptor,
    canonical,
    sha256,
)
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.registry import MAX_TOKEN_ANSWER, RegistryClient, Repository, Unauthorized
from tests.support.ggufs import write_tiny_gguf
from tests.support.registry_cases import RegistryTestCase, StandInTestCase
from tests.support.registry_server import SKIP, RealRegistry, StandInRegistry

MiB = 1024 * 1024


class RealRegistryTests(RegistryTestCase):
    skip = SKIP

    async def setUpRegistry(self) -> None:
        self.registry = RealRegistry(self.dir / "registry")
        await self.registry.start()
        self.addCleanup(lambda: ensureDeferred(self.registry.stop()))
        self.name = f"{self.registry.host}/team/tiny:v1"
        self.source.store.tag("tiny", self.name)

    async def test_push_then_pull(self) -> None:
        await self.setUpRegistry()
        digest = await self.source.push(self.name)
        self.assertEqual(digest, self.model.id)
        pushed = [line for line in self.source.lines if line["type"] == "progress"]
        self.assertEqual(pushed[-1]["layer"]["current"], pushed[-1]["layer"]["size"])
        self.assertEqual(pushed[-1]["mode"], "push")

        other = self.side("other")
        pulled = await other.pull(self.name)
        self.assertEqual(pulled.id, self.model.id)
        self.assertEqual(pulled.tags, (self.name,))
        self.assertEqual(Path(pulled.gguf).read_bytes(), self.weights)
        self.assertEqual(other.store.resolve(self.name), pulled)
        progress = [line for line in other.lines if line["type"] == "progress"]
        self.assertEqual(progress[0]["total"], sum(b.size for b in other.store.manifest(pulled.id).blobs))
        self.assertEqual(
            {line["layer"]["id"] for line in progress},
            {b.digest for b in other.store.manifest(pulled.id).blobs},
        )
        self.assertFalse([f for f in other.files() if f.endswith(".incomplete")])

    async def test_a_split_vision_model_keeps_its_layers_in_order(self) -> None:
        await self.setUpRegistry()
        write_tiny_gguf(self.dir / "big.gguf", shards=True, seed=5)
        write_tiny_gguf(self.dir / "mmproj.gguf", architecture="clip", seed=6)
        stream = TarStream(members(self.dir / "big-00001-of-00002.gguf", [], self.dir / "mmproj.gguf"))
        data = io.BytesIO(b"".join(stream.chunks(lambda _: None)))
        model = await self.source.store.import_package("big", data)
        name = f"{self.registry.host}/team/big:v1"
        self.source.store.tag("big", name)
        await self.source.push(name)
        other = self.side("other")
        pulled = await other.pull(name)
        self.assertEqual(pulled.id, model.id)
        self.assertEqual(
            [layer.media_type for layer in other.store.manifest(pulled.id).layers], [GGUF, GGUF, MMPROJ]
        )
        self.assertEqual(
            [Path(p).read_bytes() for p in pulled.shards], [Path(p).read_bytes() for p in model.shards]
        )
        await other.store.ready(other.store.resolve(name))
        self.assertEqual(Path(pulled.gguf).resolve(), Path(pulled.shards[0]).resolve())

    async def test_repull_and_repush_transfer_no_blobs(self) -> None:
        await self.setUpRegistry()
        await self.source.push(self.name)
        other = self.side("other")
        await other.pull(self.name)
        self.assertEqual(len(other.http.blob_gets()), 2)  # config and weights
        other.http.requests.clear()
        again = await other.pull(self.name)
        self.assertEqual(again.id, self.model.id)
        self.assertEqual(other.http.blob_gets(), [])
        self.source.http.requests.clear()
        await self.source.push(self.name)
        methods = {method for method, _ in self.source.http.requests}
        self.assertEqual(methods, {"HEAD", "PUT"})  # the manifest only

    async def test_tag_push_and_delete(self) -> None:
        await self.setUpRegistry()
        await self.source.push(self.name)
        other = self.side("other")
        await other.pull(self.name)
        second = f"{self.registry.host}/team/copy:v2"
        other.store.tag(self.name, second)
        await other.push(second)
        third = self.side("third")
        self.assertEqual((await third.pull(second)).id, self.model.id)
        other.store.delete(self.model.id, force=True)  # by id: under both of its names
        self.assertEqual(other.files(), [])

    async def test_unknown_model(self) -> None:
        await self.setUpRegistry()
        error = await self.assertFailure(
            ensureDeferred(self.side("other").pull(f"{self.registry.host}/team/nothing")),
            NotFound,
        )
        self.assertIn("not found in registry", error.message)

    async def test_progress_stream_over_http(self) -> None:
        await self.setUpRegistry()
        await self.source.push(self.name)
        other = self.side("other")
        other.client = RegistryClient(self.config, reactor)  # type: ignore[arg-type]
        self.addCleanup(other.client.close)  # its own persistent connection pool
        other.puller = Puller(other.store, other.client)
        operations = ModelOperations(other.store, None, other.puller, other.pusher, reactor)  # type: ignore[arg-type]
        api = ModelsAPI(other.store, operations)
        port = reactor.listenTCP(0, Site(api.app.resource()), interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/create"
        response = await treq.post(url, json={"from": self.name}, persistent=False)
        lines = [json.loads(line) for line in (await response.content()).splitlines()]
        self.assertEqual(response.code, 200)
        self.assertEqual(lines[-1]["type"], "success")
        self.assertEqual({line["type"] for line in lines[:-1]}, {"progress"})
        self.assertEqual(other.store.resolve(self.name).id, self.model.id)


class StandInTests(RegistryTestCase):
    async def serve(self, **kw: Any) -> str:
        store = self.source.store
        manifest = store.manifest(self.model.id)
        blobs = {b.digest: store.blobs.read(b.digest) for b in manifest.blobs}
        entry = (OCI_MANIFEST, store.manifest_bytes(self.model.id))
        self.registry = StandInRegistry({"v1": entry, self.model.id: entry}, blobs, **kw)
        host = await self.registry.start()
        self.addCleanup(lambda: ensureDeferred(self.registry.stop()))
        return f"{host}/team/tiny:v1"

    async def test_resume_after_cut(self) -> None:
        name = await self.serve(cut_at=100_000)
        other = self.side("other")
        model = await other.pull(name)
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights)
        ranges = [s.range for s in self.registry.blob_requests() if s.range]
        self.assertEqual(ranges, ["bytes=100000-"])

    async def test_resume_in_the_next_pull(self) -> None:
        name = await self.serve(cut_at=100_000)
        other = self.side("other", attempts=1)
        error = await self.assertFailure(ensureDeferred(other.pull(name)), BadGateway)
        self.assertIn("resumes next time", error.message)
        partial = [f for f in other.files() if f.endswith(".incomplete")]
        self.assertEqual(len(partial), 1)
        self.assertEqual(os.path.getsize(other.store.blobs.root / partial[0]), 100_000)
        self.assertEqual(other.store.list(), [])
        self.registry.cut_at = None
        again = self.side("other")
        model = await again.pull(name)
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights)
        self.assertEqual(self.registry.blob_requests()[-1].range, "bytes=100000-")

    async def test_wrong_digest_leaves_nothing(self) -> None:
        name = await self.serve(corrupt=True)
        other = self.side("other")
        error = await self.assertFailure(ensureDeferred(other.pull(name)), BadGateway)
        self.assertIn("corrupt blob", error.message)
        self.assertEqual(other.files(), [])
        self.assertEqual(other.store.list(), [])

    async def test_by_digest(self) -> None:
        name = await self.serve()
        ref = name.replace(":v1", f"@{self.model.id}")
        model = await self.side("other").pull(ref)
        self.assertEqual((model.id, model.tags), (self.model.id, ()))

    async def test_bearer_token_flow(self) -> None:
        name = await self.serve(auth="bearer")
        host = name.split("/")[0]
        self.config = RegistryConfig(auth={host: {"username": "alice", "password": "secret"}})
        other = self.side("other")
        await other.pull(name)
        token_requests = [s for s in self.registry.seen if s.path == "/token"]
        self.assertEqual(len(token_requests), 1)  # the token is reused
        self.assertEqual(token_requests[0].authorization, self.registry.basic)
        self.assertEqual(self.registry.blob_requests()[-1].authorization, "Bearer token-for-tests")

    async def test_bearer_without_credentials(self) -> None:
        name = await self.serve(auth="bearer")
        error = await self.assertFailure(ensureDeferred(self.side("other").pull(name)), Unauthorized)
        self.assertIn("refused the credentials", error.message)
        self.assertEqual(error.status, 401)

    async def test_basic_auth(self) -> None:
        name = await self.serve(auth="basic")
        host = name.split("/")[0]
        self.config = RegistryConfig(auth={host: {"username": "alice", "password": "secret"}})
        model = await self.side("other").pull(name)
        self.assertEqual(model.id, self.model.id)

    async def test_basic_auth_without_credentials(self) -> None:
        name = await self.serve(auth="basic")
        error = await self.assertFailure(ensureDeferred(self.side("other").pull(name)), Unauthorized)
        self.assertIn("registry.auth", error.message)

    async def test_mirror(self) -> None:
        name = await self.serve()
        mirror = name.split("/")[0]
        self.config = RegistryConfig(mirrors={"127.0.0.1:9": mirror})
        model = await self.side("other").pull("127.0.0.1:9/team/tiny:v1")
        self.assertEqual((model.id, model.tags), (self.model.id, ("127.0.0.1:9/team/tiny:v1",)))

    async def test_mirror_falls_back_to_the_registry(self) -> None:
        name = await self.serve()
        self.config = RegistryConfig(mirrors={name.split("/")[0]: "127.0.0.1:9"})
        model = await self.side("other").pull(name)
        self.assertEqual(model.id, self.model.id)

    async def test_unreachable(self) -> None:
        name = await self.serve()
        await self.registry.stop()
        self.addCleanup(lambda: None)
        error = await self.assertFailure(ensureDeferred(self.side("other").pull(name)), BadGateway)
        self.assertIn("unreachable", error.message)


class HostileRegistryTests(StandInTestCase):
    """What a registry announces or answers cannot make a pull spend without bound, or go elsewhere."""

    async def test_token_answer_is_read_with_a_cap(self) -> None:
        huge = json.dumps({"token": "t" * 2 * MiB}).encode()
        await self.refused(
            await self.serve(auth="bearer", token_answer=huge), f"larger than {MAX_TOKEN_ANSWER}"
        )

    async def test_token_realm_must_be_https_or_an_insecure_host(self) -> None:
        name = await self.serve(auth="bearer", realm="http://localhost:{port}/token")
        await self.refused(name, "neither https")
        self.assertEqual([s.path for s in self.registry.seen if "token" in s.path], [])

    async def test_token_redirects_are_not_followed(self) -> None:
        await self.refused(
            await self.serve(auth="bearer", token_redirect=True), "answered 302 without a token"
        )
        self.assertEqual([s.path for s in self.registry.seen if "token" in s.path], ["/token"])

    async def test_small_blobs_announced_large_are_refused_before_download(self) -> None:
        stored = self.source.store.manifest(self.model.id)
        config = json.loads(self.source.store.blobs.read(stored.config.digest))
        config["padding"] = "x" * 2 * MiB
        big = canonical(config)
        self.extra_blobs = {sha256(big): big}
        manifest = attrs.evolve(stored, config=Descriptor.of(MODEL_CONFIG, big))
        await self.refused(await self.serve(manifest), f"config of {len(big)} bytes")
        self.assertEqual(self.registry.blob_requests(), [])

    async def test_a_corrupt_blob_in_the_store_is_fetched_again(self) -> None:
        name = await self.serve()
        model = await self.side("other").pull(name)
        with open(model.gguf, "r+b") as f:
            f.write(b"X")
        fetched = len(self.registry.blob_requests())
        restarted = self.side("other")  # a new daemon: nothing is known to be verified
        again = await restarted.pull(name)
        self.assertEqual(Path(again.gguf).read_bytes(), self.weights)
        self.assertEqual(len(self.registry.blob_requests()), fetched + 1)
        self.assertEqual(os.listdir(restarted.store.blobs.quarantine_root), [])


class PullLimitTests(SynchronousTestCase):
    """At most max_pulls pulls talk to registries at once; the others wait their turn."""

    def test_waits_for_a_slot(self) -> None:
        started: list[Deferred[bytes]] = []

        class HangingClient:
            def repositories(self, ref: Any) -> list[Repository]:
                return [Repository("stand-in", "http://stand-in", ref.repository)]

            def manifest(self, repo: Any, reference: str) -> Deferred[bytes]:
                started.append(Deferred())
                return started[-1]

        store = ModelStore(Path(self.mktemp()), Clock())  # type: ignore[arg-type]
        puller = Puller(store, HangingClient(), max_pulls=2)  # type: ignore[arg-type]
        progress = Progress(lambda _: None, None, "pull")  # type: ignore[arg-type]
        pulls = [puller.pull(parse(f"m{i}"), progress) for i in range(3)]
        self.assertEqual(len(started), 2)
        pulls[2].cancel()  # a waiter whose client went away leaves the queue
        self.failureResultOf(pulls[2], CancelledError)
        started[0].callback(b"not json")
        self.failureResultOf(pulls[0], BadGateway)
        self.assertEqual(len(started), 2)
        pulls.append(puller.pull(parse("m3"), progress))
        self.assertEqual(len(started), 3)
        self.assertNoResult(pulls[1])


class ProgressTests(SynchronousTestCase):
    """Progress lines are throttled to one per 100 ms or MiB per layer, plus each layer's end."""

    def test_throttle(self) -> None:
        clock = Clock()
        lines: list[dict[str, Any]] = []
        progress = Progress(lines.append, clock, "pull")
        progress.total = 3 * MiB
        progress.update("a", 3 * MiB, 1000)
        progress.update("a", 3 * MiB, 2000)  # too soon, too little
        progress.update("b", 10, 5)  # another layer has its own pace
        clock.advance(0.1)
        progress.update("a", 3 * MiB, 3000)
        progress.update("a", 3 * MiB, 3000 + MiB)
        progress.update("a", 3 * MiB, 3000 + MiB + 1)
        progress.update("a", 3 * MiB, 3 * MiB)  # the last byte always shows
        currents = [(line["layer"]["id"], line["layer"]["current"]) for line in lines]
        self.assertEqual(currents, [("a", 1000), ("b", 5), ("a", 3000), ("a", 3000 + MiB), ("a", 3 * MiB)])
        self.assertEqual(
            lines[-1],
            {
                "type": "progress",
                "message": "Downloaded: 3.00 MB",
                "total": 3 * MiB,
                "layer": {"id": "a", "size": 3 * MiB, "current": 3 * MiB},
                "mode": "pull",
            },
        )
