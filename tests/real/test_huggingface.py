"""Hugging Face pulls: file selection (a table), and pulls from a stand-in Hub with a separate CDN."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import SynchronousTestCase

from mrunner.config import RegistryConfig
from mrunner.errors import BadGateway, BadRequest, NotFound
from mrunner.names import parse
from mrunner.store import artifact
from mrunner.store.huggingface import (
    HubFile,
    HubForbidden,
    HubRefused,
    parse_revision,
    quant_of,
    safe_path,
    select,
)
from mrunner.store.progress import Progress
from mrunner.store.push import Pusher
from mrunner.store.registry import RegistryClient
from tests.support.hub_cases import HubTestCase
from tests.support.hub_server import COMMIT, TOKEN


def files(*paths: str) -> list[HubFile]:
    return [HubFile(path, 1, "0" * 64) for path in paths]


class SelectionTests(SynchronousTestCase):
    def test_quant_of_file_names(self) -> None:
        for name, quant in [
            ("SmolLM2-135M-Instruct-Q4_K_M.gguf", "Q4_K_M"),
            ("smollm2.q8_0.gguf", "Q8_0"),
            ("Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf", "Q4_K_M"),
            ("model-IQ3_XXS.gguf", "IQ3_XXS"),
            ("model-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
            ("model-f16.gguf", "F16"),
            ("model-BF16.gguf", "BF16"),
            ("model.gguf", None),
        ]:
            self.assertEqual(quant_of(name), quant, name)

    def test_choices(self) -> None:
        repo = files("m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "README.md")
        chosen = select("o/m", repo, None)
        self.assertEqual(([f.path for f in chosen.weights], chosen.quant), (["m-Q4_K_M.gguf"], "Q4_K_M"))
        self.assertEqual(chosen.mmproj and chosen.mmproj.path, "mmproj-m-f16.gguf")
        self.assertEqual([f.path for f in select("o/m", repo, "q8_0").weights], ["m-Q8_0.gguf"])
        self.assertEqual(
            [f.path for f in select("o/m", files("only-Q6_K.gguf"), "latest").weights], ["only-Q6_K.gguf"]
        )

    def test_a_projector_of_the_weights_quant_first(self) -> None:
        repo = files("m-Q8_0.gguf", "mmproj-m-f16.gguf", "mmproj-m-Q8_0.gguf")
        self.assertEqual(select("o/m", repo, None).mmproj.path, "mmproj-m-Q8_0.gguf")  # type: ignore[union-attr]

    def test_a_shard_set_is_taken_whole_and_in_order(self) -> None:
        repo = files(*(f"Q8_0/big-Q8_0-{n:05d}-of-00003.gguf" for n in (3, 1, 2)), "big-Q4_0.gguf")
        chosen = select("o/big", repo, "Q8_0")
        self.assertEqual(
            [f.name for f in chosen.weights], [f"big-Q8_0-{n:05d}-of-00003.gguf" for n in (1, 2, 3)]
        )
        error = self.assertRaises(BadRequest, select, "o/big", repo[1:], "Q8_0")
        self.assertIn("lacks shard(s) [3] of 3", error.message)

    def test_failures_say_what_there_is(self) -> None:
        error = self.assertRaises(BadRequest, select, "o/m", files("m-Q8_0.gguf", "m-Q6_K.gguf"), None)
        self.assertEqual(error.code, "quant_required")
        self.assertIn("hf.co/o/m:QUANT, one of: Q6_K, Q8_0", error.message)
        error = self.assertRaises(NotFound, select, "o/m", files("m-Q8_0.gguf"), "Q2_K")
        self.assertIn("no Q2_K GGUF file; available: Q8_0", error.message)
        error = self.assertRaises(BadRequest, select, "o/m", files("model.safetensors", "config.json"), None)
        self.assertIn("only safetensors weights", error.message)
        self.assertIn("GGUF conversions are usually published as separate repositories", error.message)

    def test_hostile_names_are_not_references(self) -> None:
        for name in ("hf.co/../..", "hf.co/a/b:../../x", "hf.co/a/../../b", "hf.co/a/b/%2e%2e"):
            self.assertRaises(BadRequest, parse, name)

    def test_hostile_file_names_from_the_hub_are_refused(self) -> None:
        for path in ("../../etc/passwd", "a/../../b.gguf", "/abs.gguf", "a//b.gguf", "a\\b.gguf", "a\nb"):
            self.assertFalse(safe_path(path), path)
            listing = {"sha": COMMIT, "siblings": [{"rfilename": path, "size": 1}]}
            self.assertRaises(BadGateway, parse_revision, "o/m", json.dumps(listing).encode())
        self.assertTrue(safe_path("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf"))


class HubPullTests(HubTestCase):
    async def test_default_quant_with_its_projector(self) -> None:
        model = await self.pull(self.puller(token=TOKEN), "hf.co/team/tiny-gguf")
        self.assertEqual(model.tags, ("hf.co/team/tiny-gguf:latest",))
        manifest = self.store.manifest(model.id)
        self.assertEqual([layer.media_type for layer in manifest.layers], [artifact.GGUF, artifact.MMPROJ])
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights["Q4_K_M"])
        self.assertEqual(Path(model.files["mmproj"]).read_bytes(), self.projector)
        self.assertEqual((model.config["format"], model.config["architecture"]), ("gguf", "llama"))
        self.assertEqual(model.created, 1735787045)  # the repository's last change
        progress = [line for line in self.lines if line["type"] == "progress"]
        self.assertEqual(progress[-1]["total"], len(self.weights["Q4_K_M"]) + len(self.projector))
        # The token went to the Hub, and never to the CDN it redirected to.
        hub_host, cdn_host = self.endpoint.split("//")[1], self.hub.cdn_url.split("//")[1]
        self.assertEqual({s.authorization for s in self.hub.seen if s.host == hub_host}, {f"Bearer {TOKEN}"})
        cdn = [s for s in self.hub.seen if s.host == cdn_host]
        self.assertEqual((len(cdn), {s.authorization for s in cdn}), (2, {None}))

    async def test_a_pulled_model_is_pushed_to_a_registry_not_to_the_hub(self) -> None:
        await self.pull(self.puller(), "hf.co/team/tiny-gguf")
        pusher = Pusher(self.store, RegistryClient(RegistryConfig(), reactor), reactor)  # type: ignore[arg-type]
        push = pusher.push(parse("hf.co/team/tiny-gguf"), Progress(self.lines.append, reactor, "push"))  # type: ignore[arg-type]
        error = await self.assertFailure(push, BadRequest)
        self.assertIn("tag the model with a registry name", error.message)
        self.assertEqual([s.path for s in self.hub.seen if "/v2/" in s.path], [])

    async def test_a_named_quant_and_a_whole_shard_set(self) -> None:
        puller = self.puller()
        model = await self.pull(puller, "huggingface.co/team/tiny-gguf:q8_0")
        self.assertEqual(model.tags, ("hf.co/team/tiny-gguf:q8_0",))
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights["Q8_0"])
        model = await self.pull(puller, "hf.co/team/big-gguf:Q8_0")
        self.assertEqual([Path(p).read_bytes() for p in model.shards], self.shards)
        self.assertEqual(Path(model.gguf).name, "model-00001-of-00002.gguf")

    async def test_an_unchanged_repository_moves_no_bytes(self) -> None:
        puller = self.puller()
        first = await self.pull(puller, "hf.co/team/tiny-gguf")
        before = len(self.hub.seen)
        again = await self.pull(puller, "hf.co/team/tiny-gguf")
        self.assertEqual(again.id, first.id)
        self.assertEqual([s.path.split("/")[1] for s in self.hub.seen[before:]], ["api"])

    async def test_a_cut_download_resumes_with_range(self) -> None:
        await self.hub.stop()
        await self.serve(cut_at=100_000)
        model = await self.pull(self.puller(), "hf.co/team/tiny-gguf:Q8_0")
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights["Q8_0"])
        sha = hashlib.sha256(self.weights["Q8_0"]).hexdigest()
        ranges = [s.range for s in self.hub.seen if s.path.endswith(sha)]
        self.assertEqual(ranges, [None, "bytes=100000-"])

    async def test_a_file_that_is_not_what_the_hub_published_is_refused(self) -> None:
        sha = hashlib.sha256(self.weights["Q8_0"]).hexdigest()
        self.hub.cdn.blobs[sha] = self.weights["Q8_0"][:-1] + b"!"
        error = await self.assertFailure(
            ensureDeferred(self.pull(self.puller(), "hf.co/team/tiny-gguf:Q8_0")), BadGateway
        )
        self.assertIn(f"sent a corrupt blob sha256:{sha}", error.message)
        self.assertEqual((self.store.list(), os.listdir(self.store.blobs.root)), ([], []))

    async def test_gated_private_and_unknown_repositories(self) -> None:
        for token, name, error, status, words in [
            (None, "hf.co/team/gated-gguf", HubForbidden, 403, "is gated or private: set HF_TOKEN"),
            ("hf_wrong", "hf.co/team/gated-gguf", HubRefused, 401, "refused the token in HF_TOKEN"),
            (None, "hf.co/team/nothing-here", NotFound, 404, "if it is private, set HF_TOKEN"),
            (TOKEN, "hf.co/team/nothing-here", NotFound, 404, "was not found on"),
            (None, "hf.co/team/private-gguf", NotFound, 404, "if it is private, set HF_TOKEN"),
        ]:
            failure = await self.assertFailure(ensureDeferred(self.pull(self.puller(token), name)), error)
            self.assertEqual(failure.status, status)
            self.assertIn(words, failure.message)
            self.assertNotIn(str(token), failure.message)
        self.assertEqual(self.store.list(), [])
        model = await self.pull(self.puller(TOKEN, home="with-token"), "hf.co/team/gated-gguf")
        self.assertEqual(Path(model.gguf).read_bytes(), self.weights["Q4_K_M"])

    async def test_names_that_are_not_repositories(self) -> None:
        for name in ("hf.co/a/b/c", f"hf.co/a/b@sha256:{'0' * 64}"):
            error = await self.assertFailure(ensureDeferred(self.pull(self.puller(), name)), BadRequest)
            self.assertIn("use hf.co/{org}/{repo}[:{quant}]", error.message)
        self.assertEqual(self.hub.seen, [])

    async def test_a_safetensors_repository_is_explained(self) -> None:
        error = await self.assertFailure(
            ensureDeferred(self.pull(self.puller(), "hf.co/team/safetensors")), BadRequest
        )
        self.assertIn("only safetensors weights; mrunner runs GGUF models", error.message)
