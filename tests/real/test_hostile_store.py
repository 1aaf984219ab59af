"""A hostile registry, Hub and uploader against the store and its model files (issue 22).

Each case is what a hostile peer sent in the issue's probe: a size that lies
about a blob the store holds (H1), GGUF headers that declare more than their
file holds (M1, L6), a file that is not GGUF under a good sha256 (L6), a full
disk (L1) and a download that stalls (L5). The header bounds are tested on the
parser itself (no child, no time); everything else runs the real parts: the
real registry and the stand-in Hub on loopback, the header reader's child, an
in-process daemon, the ``mrunner`` command, and (as root) a small tmpfs.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
from gguf import GGUFReader, GGUFValueType
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from mrunner.config import HuggingFaceConfig, RegistryConfig
from mrunner.errors import BadGateway, BadRequest
from mrunner.names import parse
from mrunner.store import gguf_meta
from mrunner.store.artifact import OCI_MANIFEST
from mrunner.store.blobs import Blobs, BlobWriter
from mrunner.store.gguf_header import MAX_ARRAY, MAX_STRING, HeaderError, read_header
from mrunner.store.huggingface import HubClient
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.registry import RegistryClient, Repository
from mrunner.store.stall import Stalled
from mrunner.testing.tinymodel import write_tiny_llama, write_tiny_mmproj
from tests.support.cli_cases import MRUNNER, CLITestCase
from tests.support.daemon import InProcessDaemon, eventually, http
from tests.support.daemon_cases import MODEL, DaemonTestCase
from tests.support.ggufs import flip_last_byte, write_tiny_gguf
from tests.support.hub_cases import HubTestCase
from tests.support.hub_server import Repo, StandInHub
from tests.support.registry_cases import RegistryTestCase, StandInTestCase
from tests.support.registry_server import SKIP, RealRegistry, StandInRegistry

GiB = 1024**3
UINT8, UINT32, STRING, ARRAY = 0, 4, 8, 9


def string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def kv(key: bytes, kind: int, value: bytes) -> bytes:
    return string(key) + struct.pack("<I", kind) + value


def gguf(*kvs: bytes, tensors: int = 0, keys: int | None = None, pad_to: int = 0) -> bytes:
    """A GGUF v3 header with C{kvs}, declaring C{tensors} tensors and C{keys} keys (their count)."""
    count = len(kvs) if keys is None else keys
    data = b"GGUF" + struct.pack("<IQQ", 3, tensors, count) + b"".join(kvs)
    return data.ljust(pad_to, b"\0")


#: The issue's probes: 159 bytes declaring a uint8 array of 2^40 elements, and 200 bytes
#: declaring a 2^40-byte string.
HUGE_ARRAY = gguf(kv(b"tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", UINT8, 2**40)), pad_to=159)
HUGE_STRING = gguf(kv(b"general.name", STRING, struct.pack("<Q", 2**40)), pad_to=200)


class HeaderBoundsTests(SynchronousTestCase):
    """M1, L6: every length is bounded by the bytes left and by limits, before anything is read."""

    def refused(self, data: bytes, fragment: str) -> None:
        error = self.assertRaises(HeaderError, read_header, io.BytesIO(data), len(data))
        self.assertIn(fragment, str(error))

    def test_the_issues_probes_are_refused(self) -> None:
        self.assertEqual((len(HUGE_ARRAY), len(HUGE_STRING)), (159, 200))
        self.refused(HUGE_ARRAY, f"is {2**40}; at most {MAX_ARRAY} are read")
        self.refused(HUGE_STRING, f"is {2**40}; at most {MAX_STRING} are read")

    def test_counts_within_the_limits_are_bounded_by_the_bytes_left(self) -> None:
        ten_million = 10_000_000
        for kind, least in ((UINT8, 1), (UINT32, 4), (STRING, 8)):  # a string is at least its length
            data = gguf(kv(b"tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", kind, ten_million)))
            self.refused(data, f"declares {ten_million * least} bytes")
        self.refused(gguf(tensors=2**30), f"is {2**30}; at most")
        self.refused(gguf(tensors=1000), "the tensor count of 1000 declares 24000 bytes")
        self.refused(gguf(keys=1000), "the metadata count of 1000 declares 12000 bytes")
        self.refused(gguf(kv(b"k", STRING, string(b"x" * 100))[:-50]), "declares 100 bytes")

    def test_a_true_array_of_ten_million_elements_is_passed_in_one_seek(self) -> None:
        items = struct.pack("<IQ", UINT8, 10_000_000) + bytes(10_000_000)
        array = kv(b"tokenizer.ggml.token_type", ARRAY, items)
        data = gguf(array, kv(b"general.name", STRING, string(b"after")))
        reads: list[int] = []

        class Counted(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                reads.append(size or 0)
                return super().read(size)

        header = read_header(Counted(data), len(data))
        self.assertEqual(header.metadata, {"general.name": "after"})
        self.assertLess(len(reads), 20)
        self.assertLess(sum(reads), 200)

    def test_string_arrays_are_walked_by_their_lengths(self) -> None:
        after = kv(b"general.name", STRING, string(b"after"))
        for strings in ([b"tok"] * 200_000, [b"a" * 3_000_000, b"b", b"c" * 2_000_000]):  # across windows
            items = struct.pack("<IQ", STRING, len(strings)) + b"".join(map(string, strings))
            data = gguf(kv(b"tokenizer.ggml.tokens", ARRAY, items), after)
            self.assertEqual(read_header(io.BytesIO(data), len(data)).metadata, {"general.name": "after"})
        lies = struct.pack("<IQ", STRING, 2) + string(b"tok") + struct.pack("<Q", 2**40)
        self.refused(gguf(kv(b"tokenizer.ggml.tokens", ARRAY, lies)), f"is {2**40}; at most")
        short = struct.pack("<IQ", STRING, 2) + string(b"tok") + struct.pack("<Q", 100) + b"x" * 50
        self.refused(gguf(kv(b"tokenizer.ggml.tokens", ARRAY, short)), "declares 100 bytes")

    def test_tensors_must_lie_inside_the_file(self) -> None:
        def tensor(dims: list[int], kind: int = 0, offset: int = 0) -> bytes:
            return (
                string(b"t")
                + struct.pack("<I", len(dims))
                + b"".join(struct.pack("<Q", d) for d in dims)
                + struct.pack("<IQ", kind, offset)
            )

        for info, fragment in [
            (tensor([1, 1, 1, 1, 1]), "has 5 dimensions"),
            (tensor([16], kind=999), "unknown type 999"),
            (tensor([2**32, 2**20]), "past the end of the file"),
            (tensor([16], offset=3), "not aligned"),
        ]:
            self.refused(gguf(tensors=1) + info, fragment)

    def test_every_cut_of_a_real_file_is_refused_as_a_header_error(self) -> None:
        path = Path(self.mktemp())
        write_tiny_gguf(path)
        data = path.read_bytes()
        self.assertEqual(read_header(io.BytesIO(data), len(data)).metadata["general.name"], "tiny")
        for end in range(len(data) - 1):
            self.assertRaises(HeaderError, read_header, io.BytesIO(data[:end]), end)

    def test_what_is_kept_is_what_gguf_reader_read(self) -> None:
        """The config blob's metadata is unchanged by the new reader: a re-pull yields the same model."""
        directory = Path(self.mktemp())
        directory.mkdir()
        write_tiny_gguf(directory / "tiny.gguf", rows=64)
        write_tiny_llama(directory / "llama.gguf")  # a real vocabulary, merges, scores
        write_tiny_mmproj(directory / "mmproj.gguf")
        for path in sorted(directory.iterdir()):
            reader = GGUFReader(path)
            expected = {
                field.name: str(field.contents())
                for field in reader.fields.values()
                if field.types[0] != GGUFValueType.ARRAY and not field.name.startswith("GGUF.")
            }
            info = gguf_meta.read(path)
            self.assertEqual(info.metadata, expected, path.name)
            self.assertEqual(info.parameters, sum(int(t.n_elements) for t in reader.tensors), path.name)


class ReaderChildTests(SynchronousTestCase):
    """M1: the child that reads headers has its address space capped, and a lie is a 400."""

    def test_the_childs_address_space_is_capped(self) -> None:
        reader = gguf_meta.Reader()
        self.addCleanup(reader.close)
        limits = Path(f"/proc/{reader._child.pid}/limits")
        for _ in range(1000):  # until the child has set it, before it reads anything
            line = next(line for line in limits.read_text().splitlines() if "address space" in line)
            if str(gguf_meta.MAX_MEMORY) in line:
                break
            time.sleep(0.01)
        self.assertEqual(line.split()[3:5], [str(gguf_meta.MAX_MEMORY)] * 2)

    def test_a_lie_is_a_bad_request(self) -> None:
        path = Path(self.mktemp())
        for data in (HUGE_ARRAY, HUGE_STRING):
            path.write_bytes(data)
            error = self.assertRaises(BadRequest, gguf_meta.read, path)
            self.assertEqual(error.code, "invalid_gguf")
            self.assertIn(f"is {2**40}; at most", error.message)


class HostileUploadTests(DaemonTestCase):
    """M1, L6: ``POST /models/load`` with a header that lies, or no GGUF at all: a 400, nothing kept."""

    async def test_lies_are_400s_that_leave_nothing(self) -> None:
        await self.start()
        blobs = self.home / "models" / "blobs" / "sha256"
        before = sorted(os.listdir(blobs))
        for body in (HUGE_ARRAY, HUGE_STRING, b"0123456789"):
            response = await http.post(self.daemon.url + "/models/load", params={"name": "x"}, data=body)
            error = (await response.json())["error"]
            self.assertEqual((response.code, error["code"]), (400, "invalid_gguf"), error)
            self.assertEqual(sorted(os.listdir(blobs)), before)
        response = await http.get(self.daemon.url + "/models")
        self.assertEqual([model["tags"] for model in await response.json()], [[MODEL]])


class DamagedIndexTests(DaemonTestCase):
    """Issue 35, A22: a daemon restarted on a damaged index starts, and serves the model by its id."""

    async def test_a_restart_on_a_damaged_index(self) -> None:
        await self.start()
        (model,) = await (await http.get(self.daemon.url + "/models")).json()
        await self.daemon.stop()
        index = self.home / "models" / "index.json"
        index.write_bytes(b"[" * 100_000)
        self.daemon = InProcessDaemon(self.daemon.config_path)
        response = await http.get(self.daemon.url + "/models")
        self.assertEqual([(m["id"], m["tags"]) for m in await response.json()], [(model["id"], [])])
        response = await http.post(
            self.daemon.url + "/engines/v1/chat/completions", json=self.chat(model=model["id"])
        )
        self.assertEqual(response.code, 200, await response.text())
        (aside,) = index.parent.glob("index.json.damaged-*")
        self.assertEqual(aside.read_bytes(), b"[" * 100_000)


class RegistrySizeLieTests(RegistryTestCase):
    """H1: the real registry serving a manifest that gives a blob the store holds a size of 1 byte."""

    skip = SKIP

    async def serve_lie(self) -> tuple[str, str]:
        registry = RealRegistry(self.dir / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        good = f"{registry.host}/team/tiny:v1"
        self.source.store.tag("tiny", good)
        await self.source.push(good)
        manifest = self.source.store.manifest(self.model.id)
        (weights,) = manifest.layers
        lie = attrs.evolve(manifest, layers=(attrs.evolve(weights, size=1),))
        (repo,) = self.source.client.repositories(parse(good), pull=False)
        await self.source.client.put_manifest(repo, "lie", lie.to_bytes(), OCI_MANIFEST)
        return good, f"{registry.host}/team/tiny:lie"

    async def test_the_lie_is_the_registrys_error_and_the_blob_stays(self) -> None:
        good, lie = await self.serve_lie()
        other = self.side("other")
        model = await other.pull(good)
        for side in (other, self.side("other")):  # hashed since start, and hashed afresh after a restart
            error = await self.assertFailure(ensureDeferred(side.pull(lie)), BadGateway)
            self.assertEqual(error.code, "registry_size_mismatch")
            self.assertIn(f"announces blob {self.model_weights()} as 1 bytes", error.message)
            self.assertIn(f"but it is {len(self.weights)} bytes", error.message)
            self.assertEqual(os.listdir(side.store.blobs.quarantine_root), [])
            self.assertEqual(Path(model.gguf).read_bytes(), self.weights)
            self.assertEqual(await side.store.ready(side.store.resolve(good)), model)

    async def test_a_held_blob_its_own_bytes_condemn_is_still_quarantined(self) -> None:
        good, lie = await self.serve_lie()
        model = await self.side("other").pull(good)
        flip_last_byte(model.gguf)
        restarted = self.side("other")
        error = await self.assertFailure(ensureDeferred(restarted.pull(lie)), BadGateway)
        self.assertIn("sent a corrupt blob", error.message)
        self.assertEqual(os.listdir(restarted.store.blobs.quarantine_root), [Path(model.gguf).name])

    def model_weights(self) -> str:
        return self.source.store.manifest(self.model.id).layers[0].digest


class HostileHubTests(HubTestCase):
    """H1, L6, L5 against the stand-in Hub."""

    async def serve(self, **kw: Any) -> None:
        await super().serve(**kw)
        self.sha = hashlib.sha256(self.weights["Q8_0"]).hexdigest()
        self.q8 = "hf.co/team/tiny-gguf:Q8_0"

    async def test_a_listing_that_gives_a_held_blob_2_GiB_keeps_it(self) -> None:
        puller = self.puller()
        model = await self.pull(puller, self.q8)
        self.hub.repos["team/tiny-gguf"].sizes = {"tiny-Q8_0.gguf": 2 * GiB}
        error = await self.assertFailure(ensureDeferred(self.pull(puller, self.q8)), BadGateway)
        self.assertIn(f"announces blob sha256:{self.sha} as {2 * GiB} bytes", error.message)
        self.assertEqual(os.listdir(self.store.blobs.quarantine_root), [])
        self.assertEqual(await self.store.ready(self.store.resolve(model.id)), model)

    async def test_a_file_that_is_not_gguf_is_refused_and_removed(self) -> None:
        self.hub.add("team/junk", Repo({"junk-Q4_K_M.gguf": b"0123456789"}))
        pull = ensureDeferred(self.pull(self.puller(), "hf.co/team/junk"))
        error = await self.assertFailure(pull, BadRequest)
        self.assertIn("not a valid GGUF file", error.message)
        self.assertEqual((self.store.list(), os.listdir(self.store.blobs.root)), ([], []))
        self.assertEqual(self.store.partials_usage(), 0)

    async def test_a_stalled_download_times_out_naming_the_host(self) -> None:
        await self.hub.stop()
        await self.serve(stall_at=1000)
        puller = self.puller(attempts=2, read_timeout=0.2)
        error = await self.assertFailure(ensureDeferred(self.pull(puller, self.q8)), BadGateway)
        host = self.endpoint.split("//")[1]
        self.assertIn(f"from {host} failed 2 times", error.message)
        self.assertIn("sent nothing for 0.2 s", error.message)
        ranges = [s.range for s in self.hub.seen if s.path.endswith(self.sha)]
        self.assertEqual(ranges, [None, "bytes=1000-"])  # the stall was cut and resumed once
        self.assertEqual(self.store.partials_usage(), 1000)


class RegistryStallTests(StandInTestCase):
    """L5: a registry that sends nothing, or part of a blob and then nothing: a timeout naming it."""

    async def test_a_stall_before_or_inside_a_blob_times_out(self) -> None:
        blobs = self.source.store.manifest(self.model.id).blobs  # the config (a few hundred bytes) first
        for stall_at in (0, 1000):  # no headers at all; headers and 1,000 bytes
            stalled = next(blob.digest for blob in blobs if blob.size > stall_at)
            name = await self.serve(stall_at=stall_at)
            other = self.side(f"other-{stall_at}", attempts=2, read_timeout=0.2)
            error = await self.assertFailure(ensureDeferred(other.pull(name)), BadGateway)
            host = name.split("/")[0]
            self.assertIn(f"download of {stalled} from {host} failed 2 times", error.message)
            self.assertIn("sent nothing for 0.2 s", error.message)
            self.assertEqual(other.store.partials_usage(), stall_at)

    async def test_a_pull_its_client_gave_up_cuts_the_stalled_download(self) -> None:
        """Cancelled (Klein cancels when the client leaves), the download's connection is cut at
        once, not left to the read timeout: trial fails a test that leaves it open."""
        other = self.side("other", read_timeout=60)  # far longer than this test
        pull = ensureDeferred(other.pull(await self.serve(stall_at=1000)))
        await eventually(lambda: [line for line in other.lines if line["layer"]["current"] == 1000])
        pull.cancel()
        await self.assertFailure(pull, CancelledError)
        self.assertEqual(other.store.partials_usage(), 1000, "kept for the next pull")


def lines_of(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


class DiskFullTests(DaemonTestCase):
    """L1: a write that fails for want of space mid-pull (injected where blobs are written), through
    the daemon's own routes: an error line saying so in both streams, and the partial kept."""

    async def serve(self) -> str:
        source = self.home / "source"
        write_tiny_gguf(self.home / "pulled.gguf", rows=4096, seed=5)  # 256 KiB of weights
        store = ModelStore(source, reactor)  # type: ignore[arg-type]
        with (self.home / "pulled.gguf").open("rb") as f:
            model = await store.import_gguf("pulled", f)
        manifest = store.manifest(model.id)
        blobs = {blob.digest: store.blobs.read(blob.digest) for blob in manifest.blobs}
        self.registry = StandInRegistry({"v1": (OCI_MANIFEST, manifest.to_bytes())}, blobs)
        host = await self.registry.start()
        self.addCleanup(lambda: ensureDeferred(self.registry.stop()))
        self.weights = manifest.layers[0]
        return f"{host}/team/pulled:v1"

    def fill_disk_at(self, limit: int) -> None:
        """Blob writes fail with ENOSPC once C{limit} bytes of a blob are written, until the test ends."""
        write = BlobWriter.write

        def full(writer: BlobWriter, data: bytes | memoryview) -> None:
            if writer.offset + len(data) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write(writer, data)

        BlobWriter.write = full  # type: ignore[method-assign]
        self.restore = lambda: setattr(BlobWriter, "write", write)
        self.addCleanup(self.restore)

    async def test_both_streams_say_the_disk_is_full_and_the_pull_resumes(self) -> None:
        await self.start()
        name = await self.serve()
        self.fill_disk_at(100_000)
        response = await http.post(self.daemon.url + "/models/create", json={"from": name})
        docker = lines_of(await response.content())
        response = await http.post(self.daemon.url + "/api/pull", json={"model": name})
        ollama = lines_of(await response.content())
        for last in (docker[-1]["message"], ollama[-1]["error"]):
            self.assertIn("is full: blob", last)
            self.assertIn("pull again to resume", last)
        self.assertEqual(docker[-1]["type"], "error")
        partial = self.home / "models" / "blobs" / "sha256" / (self.weights.digest[7:] + ".incomplete")
        written = partial.stat().st_size
        self.assertLessEqual(written, 100_000)
        self.assertIn(f"({self.weights.size - written} bytes) more", docker[-1]["message"])
        self.restore()
        response = await http.post(self.daemon.url + "/models/create", json={"from": name})
        self.assertEqual(lines_of(await response.content())[-1]["type"], "success")
        ranges = [s.range for s in self.registry.blob_requests() if s.path.endswith(self.weights.digest)]
        self.assertEqual(ranges[-1], f"bytes={written}-")

    async def test_a_manifest_the_full_disk_refuses_is_an_error_line(self) -> None:
        await self.start()
        name = await self.serve()

        def full(blobs: Blobs, data: bytes) -> str:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        self.patch(Blobs, "put", full)  # the manifest, once the blobs are in
        response = await http.post(self.daemon.url + "/models/create", json={"from": name})
        (last,) = lines_of(await response.content())[-1:]
        self.assertEqual((response.code, last["type"]), (200, "error"))
        self.assertIn(f"is full: {name} could not be written, and", last["message"])


class TmpfsFullTests(CLITestCase):
    """L1 on a real full file system: the store on a 512 KiB tmpfs, a 1 MiB model from the Hub."""

    def prepare_home(self) -> None:
        models = self.home / "models"
        models.mkdir()
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        mount = ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(models)]
        if subprocess.run(mount, check=False).returncode != 0:
            self.skipTest("this machine cannot mount a tmpfs")
        self.addCleanup(subprocess.run, ["umount", "-l", str(models)], check=True)

    def config_text(self) -> str:
        self.hub = StandInHub({})
        self.addCleanup(lambda: ensureDeferred(self.hub.stop()))
        return f'[huggingface]\nendpoint = "{self.hub.start()}"\n'

    async def test_the_command_and_the_ollama_stream_say_the_disk_is_full(self) -> None:
        write_tiny_gguf(self.home / "big.gguf", rows=16384)  # 1 MiB of weights
        self.hub.add("team/big-gguf", Repo({"big-Q4_K_M.gguf": (self.home / "big.gguf").read_bytes()}))
        ran = await self.mrunner("pull", "hf.co/team/big-gguf")
        self.assertEqual(ran.code, 1, ran)
        self.assertIn("is full: blob", ran.err)
        self.assertIn("are free", ran.err)
        self.assertNotIn("Traceback", ran.err)
        response = await http.post(self.daemon.url + "/api/pull", json={"model": "hf.co/team/big-gguf"})
        self.assertIn("is full: blob", lines_of(await response.content())[-1]["error"])
        response = await http.get(self.daemon.url + "/models")
        self.assertEqual(await response.json(), [])


class GarbledStream(Resource):
    """A daemon whose pull stream breaks off into an HTML page, as a 500 inside a stream once did."""

    isLeaf = True

    def render_POST(self, request: Request) -> bytes:
        progress = {"type": "progress", "layer": {"id": "sha256:1", "size": 2, "current": 1}}
        return json.dumps(progress).encode() + b"\n<html>Processing Failed\n"


class GarbledStreamCommandTests(TestCase):
    """L1: whatever the daemon sends, ``mrunner pull`` says what went wrong, never a traceback."""

    async def test_a_line_that_is_not_json_is_an_error_message(self) -> None:
        port = reactor.listenTCP(0, Site(GarbledStream()), interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        _, err, code = await getProcessOutputAndValue(
            MRUNNER, ("--host", f"127.0.0.1:{port.getHost().port}", "pull", "ai/x"), env=dict(os.environ)
        )
        self.assertEqual(code, 1, err)
        self.assertIn(b"the daemon sent a line that is not JSON: '<html>Processing Failed'", err)
        self.assertNotIn(b"Traceback", err)


class Silent(Resource):
    """A registry or Hub that answers every request with C{sent} (nothing: not even headers), then
    nothing more, holding the connection open."""

    isLeaf = True

    def __init__(self, sent: bytes) -> None:
        super().__init__()
        self.sent = sent

    def render(self, request: Request) -> int:
        if self.sent:
            request.setHeader("content-type", OCI_MANIFEST)
            request.setHeader("content-length", str(len(self.sent) + 1000))
            request.write(self.sent)
        return NOT_DONE_YET


class SilentRemoteTests(TestCase):
    """L5 beyond blobs: a manifest or a Hub listing that never comes, or stops halfway."""

    timeout = 20

    def serve(self, sent: bytes) -> str:
        port = reactor.listenTCP(0, Site(Silent(sent)), interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        return f"127.0.0.1:{port.getHost().port}"

    def puller(self, hub_endpoint: str = "http://127.0.0.1:9") -> Puller:
        store = ModelStore(Path(self.mktemp()), reactor)  # type: ignore[arg-type]
        http = HTTPClient(Agent(reactor, pool=None))
        hub = HubClient(HuggingFaceConfig(endpoint=hub_endpoint), http, {}, reactor, 0.2)  # type: ignore[arg-type]
        registry = RegistryClient(RegistryConfig(), reactor, http, 0.2)  # type: ignore[arg-type]
        return Puller(store, registry, hub=hub, read_timeout=0.2)

    async def refused(self, puller: Puller, name: str) -> str:
        pull = puller.pull(parse(name), Progress(lambda line: None, reactor, "pull"))  # type: ignore[arg-type]
        error = await self.assertFailure(pull, BadGateway)
        self.assertEqual((error.status, error.code), (502, "registry_timeout"))
        return error.message

    async def test_a_registry_that_never_sends_its_manifest(self) -> None:
        for sent, what in [
            (b"", "registry {host}"),
            (b'{"schemaVersion": 2, ', "the manifest of team/x from {host}"),
        ]:
            host = self.serve(sent)
            message = await self.refused(self.puller(), f"{host}/team/x:v1")
            self.assertEqual(message, f"{what.format(host=host)} sent nothing for 0.2 s")

    async def test_a_hub_that_never_sends_its_listing(self) -> None:
        for sent, what in [(b"", "{host}"), (b'{"sha": ', "the Hub's listing of team/x")]:
            host = self.serve(sent)
            message = await self.refused(self.puller(f"http://{host}"), "hf.co/team/x")
            self.assertEqual(message, f"{what.format(host=host)} sent nothing for 0.2 s")


class UploadTimeoutTests(SynchronousTestCase):
    """The read timeout is for what a remote sends: a push waits for its answer as long as its
    body takes to send, while a request without a body is given up."""

    def test_only_requests_without_a_body_time_out(self) -> None:
        clock = Clock()

        class Unanswered:
            def request(self, method: str, url: str, **kw: Any) -> Deferred[Any]:
                return Deferred()

        client = RegistryClient(RegistryConfig(), clock, Unanswered(), read_timeout=1)  # type: ignore[arg-type]
        repo = Repository("registry.test", "http://registry.test", "team/x")
        push = ensureDeferred(client.put_manifest(repo, "v1", b"{}", OCI_MANIFEST))
        pull = ensureDeferred(client.manifest(repo, "v1"))
        clock.advance(100)
        self.assertNoResult(push)
        self.assertEqual(
            self.failureResultOf(pull, Stalled).value.message, "registry registry.test sent nothing for 1 s"
        )
