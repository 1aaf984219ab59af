"""The /models routes, driven in memory with StubTreq; registry work is faked here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.compat.ollama.models import OllamaModelsAPI
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import ModelsAPI
from mrunner.errors import NotFound
from mrunner.store.local import ModelStore
from mrunner.store.progress import Progress
from mrunner.values.model import Reference
from tests.support.ggufs import flip_last_byte, package, write_tiny_gguf
from tests.support.metrics import snapshot
from tests.support.sync_reactor import SyncThreadsClock


class FakeScheduler:
    def __init__(self) -> None:
        self.unloaded: list[dict[str, Any]] = []
        self.runners: list[Any] = []

    def snapshot(self) -> list[Any]:
        return self.runners

    def unload(self, backend: str | None, models: list[str], all: bool) -> Deferred[int]:
        self.unloaded.append({"backend": backend, "models": models, "all": all})
        return succeed(1)


class FakeTransfer:
    """Stands in for Puller and Pusher: reports progress, then fails or succeeds."""

    def __init__(self, error: Exception | None = None, before: int = 2) -> None:
        self.refs: list[Reference] = []
        self.error = error
        self.before = before

    def run(self, ref: Reference, progress: Progress) -> Deferred[None]:
        self.refs.append(ref)
        progress.total = 4 * 1024 * 1024
        for i in range(self.before):
            progress.update("sha256:" + "a" * 64, progress.total, (i + 1) * 2 * 1024 * 1024)
            progress.moved(2 * 1024 * 1024)
        if self.error is not None:
            raise self.error
        return succeed(None)

    pull = push = run


class ModelsAPITests(SynchronousTestCase):
    def setUp(self) -> None:
        self.home = Path(self.mktemp())
        self.clock = SyncThreadsClock()
        self.store = ModelStore(self.home, self.clock)
        self.scheduler = FakeScheduler()
        self.puller = FakeTransfer()
        self.pusher = FakeTransfer()
        self.moved: list[tuple[str, int]] = []
        operations = ModelOperations(
            self.store,
            self.scheduler,  # type: ignore[arg-type]
            self.puller,  # type: ignore[arg-type]
            self.pusher,  # type: ignore[arg-type]
            self.clock,
            lambda mode, count: self.moved.append((mode, count)),
        )
        api = ModelsAPI(self.store, operations)
        self.http = StubTreq(api.app.resource())
        self.ollama = StubTreq(OllamaModelsAPI(self.store, operations, self.scheduler).app.resource())  # type: ignore[arg-type]
        self.gguf = self.home / "tiny.gguf"
        write_tiny_gguf(self.gguf)

    def call(self, method: str, path: str, **kw: Any) -> tuple[int, bytes, Any]:
        response = self.successResultOf(self.http.request(method, f"http://x{path}", **kw))
        body = self.successResultOf(response.content())
        return response.code, body, response.headers

    def json(self, method: str, path: str, status: int = 200, **kw: Any) -> Any:
        code, body, headers = self.call(method, path, **kw)
        self.assertEqual((code, headers.getRawHeaders("content-type")), (status, ["application/json"]), body)
        return json.loads(body)

    def load(self, name: str = "smollm2") -> dict[str, Any]:
        return self.json("POST", f"/load?name={name}", 201, data=self.gguf.read_bytes())

    def assertError(self, status: int, method: str, path: str, fragment: str, **kw: Any) -> None:
        error = self.json(method, path, status, **kw)["error"]
        self.assertIn(fragment, error["message"])
        self.assertLessEqual({"message", "type", "code"}, set(error))

    def test_list_empty(self) -> None:
        self.assertEqual(self.json("GET", "/"), [])

    def test_load_list_inspect(self) -> None:
        model = self.load()
        self.assertEqual(model["tags"], ["ai/smollm2:latest"])
        self.assertEqual(set(model), {"id", "tags", "created", "config"})
        self.assertEqual(model["config"]["format"], "gguf")
        self.assertEqual(self.json("GET", "/"), [model])
        for name in ("smollm2", "ai/smollm2:latest", model["id"]):
            self.assertEqual(self.json("GET", f"/{name}"), model)
        self.assertEqual(model["config"]["gguf"]["general.architecture"], "llama")

    def test_load_errors(self) -> None:
        self.assertError(400, "POST", "/load", "?name=", data=b"x")
        self.assertError(400, "POST", "/load?name=x", "not a valid GGUF", data=b"junk")
        self.assertError(400, "POST", "/load?name=..%2F..%2Fetc", "not a valid", data=b"junk")
        self.assertEqual(self.json("GET", "/"), [])

    def test_load_package_with_license_and_context_size(self) -> None:
        body = package([("model.gguf", self.gguf.read_bytes()), ("licenses/0-LICENSE", b"MIT\n")])
        headers = {"Content-Type": "application/x-tar"}
        model = self.json("POST", "/load?name=pkg&context_size=512", 201, data=body, headers=headers)
        self.assertEqual(model["config"]["context_size"], 512)
        stored = self.store.resolve("pkg")
        self.assertEqual(Path(stored.files["license"]).read_bytes(), b"MIT\n")
        self.assertEqual(Path(stored.gguf).read_bytes(), self.gguf.read_bytes())

    def test_load_package_errors(self) -> None:
        headers = {"Content-Type": "application/x-tar"}
        gguf = ("model.gguf", self.gguf.read_bytes())
        for files, fragment in [
            ([], "0 .gguf file(s)"),
            ([gguf, ("b.gguf", self.gguf.read_bytes())], "give every shard of one split model"),
            ([gguf, ("mmproj/a.gguf", b""), ("mmproj/b.gguf", b"")], "2 projector(s)"),
            ([gguf, ("../etc/passwd", b"x")], "'../etc/passwd'"),
        ]:
            self.assertError(400, "POST", "/load?name=x", fragment, data=package(files), headers=headers)
        self.assertError(400, "POST", "/load?name=x", "not a tar", data=b"junk" * 200, headers=headers)
        for size in [
            "-1",
            "0",
            "%C2%B2",
            "99999999999",
            "1" * 5000,
        ]:  # "²" passes str.isdigit; int() refuses 5000 digits
            self.assertError(400, "POST", f"/load?name=x&context_size={size}", "an integer from 1", data=b"x")
        self.assertEqual(self.json("GET", "/"), [])

    def test_create_from_unusable_registry(self) -> None:
        """Hosts the HTTP client cannot address (IDNA fails on them) are refused before any pull."""
        for ref in ["[::1]:1/a/b", "localhost:99999/a/b", "a" * 64 + ".example/a/b"]:
            self.assertError(400, "POST", "/create", "not a valid host", json={"from": ref})
        self.assertEqual(self.puller.refs, [])

    def test_verify(self) -> None:
        model = self.load()
        (report,) = self.json("POST", "/verify")
        self.assertEqual((report["id"], report["status"]), (model["id"], "ok"))
        flip_last_byte(self.store.resolve("smollm2").gguf)
        (report,) = self.json("POST", "/smollm2/verify")
        self.assertEqual(report["status"], "corrupt")
        self.assertIn("weights", self.json("GET", "/smollm2")["corrupt"])
        self.assertIn("corrupt", self.json("GET", "/")[0])
        self.assertError(404, "POST", "/nothing/verify", "not found")

    def test_inspect_unknown_and_hostile(self) -> None:
        self.assertError(404, "GET", "/nothing", "ai/nothing:latest")
        self.assertError(400, "GET", "/a%00b", "control characters")

    def test_tag(self) -> None:
        model = self.load()
        result = self.json("POST", "/smollm2/tag?repo=myorg/copy&tag=v1", 201)
        self.assertEqual(result["target"], "myorg/copy:v1")
        self.assertEqual(self.json("GET", "/myorg/copy:v1")["id"], model["id"])
        self.assertError(400, "POST", "/smollm2/tag?repo=x", "?repo=")
        self.assertError(404, "POST", "/nothing/tag?repo=x&tag=y", "not found")

    def test_delete(self) -> None:
        model = self.load()
        result = self.json("DELETE", "/smollm2")
        self.assertEqual(result, [{"Untagged": "ai/smollm2:latest"}, {"Deleted": model["id"]}])
        self.assertEqual(self.scheduler.unloaded, [{"backend": None, "models": [model["id"]], "all": False}])
        self.assertError(404, "DELETE", "/smollm2", "not found")

    def test_delete_one_of_several_tags(self) -> None:
        """Only that name goes, and no runner is stopped; by id, every tag goes with force=true."""
        model = self.load()
        self.json("POST", "/smollm2/tag?repo=other&tag=v1", 201)
        self.json("POST", "/smollm2/tag?repo=third&tag=v1", 201)
        self.assertEqual(self.json("DELETE", "/smollm2"), [{"Untagged": "ai/smollm2:latest"}])
        self.assertEqual(self.scheduler.unloaded, [])
        self.assertEqual(self.json("GET", "/other:v1")["tags"], ["ai/other:v1", "ai/third:v1"])
        self.assertError(409, "DELETE", "/" + model["id"], "force=true")
        self.assertError(400, "DELETE", "/other:v1?force=maybe", "true or false")
        self.assertEqual(len(self.json("DELETE", f"/{model['id']}?force=true")), 3)

    def test_delete_of_a_model_a_runner_serves_needs_force(self) -> None:
        model = self.load()
        self.scheduler.runners = [attrs.evolve(snapshot("smollm2"), model_id=model["id"], in_use=1)]
        self.assertError(409, "DELETE", "/smollm2", "in use")
        self.assertEqual(self.scheduler.unloaded, [])
        self.assertEqual(self.json("DELETE", "/smollm2?force=true")[-1], {"Deleted": model["id"]})
        self.assertEqual(self.scheduler.unloaded, [{"backend": None, "models": [model["id"]], "all": False}])

    def lines(self, body: bytes) -> list[dict[str, Any]]:
        return [json.loads(line) for line in body.splitlines()]

    def test_create_streams_progress(self) -> None:
        code, body, headers = self.call("POST", "/create", json={"from": "smollm2"})
        self.assertEqual(code, 200)
        self.assertEqual(headers.getRawHeaders("content-type"), ["application/x-ndjson"])
        lines = self.lines(body)
        self.assertEqual([line["type"] for line in lines], ["progress", "progress", "success"])
        self.assertEqual(lines[1]["layer"], {"id": "sha256:" + "a" * 64, "size": 4194304, "current": 4194304})
        self.assertEqual(lines[0]["total"], 4194304)
        self.assertEqual(self.puller.refs, [Reference("", "ai/smollm2", "latest")])

    def test_create_error_before_progress_is_a_status(self) -> None:
        self.puller.error, self.puller.before = NotFound("model ai/x:latest not found"), 0
        self.assertError(404, "POST", "/create", "not found", json={"from": "x"})

    def test_create_error_after_progress_is_a_line(self) -> None:
        self.puller.error = NotFound("gone")
        code, body, _ = self.call("POST", "/create", json={"from": "x"})
        self.assertEqual(code, 200)
        self.assertEqual(self.lines(body)[-1], {"type": "error", "message": "gone", "mode": "pull"})

    def test_create_bad_requests(self) -> None:
        self.assertError(400, "POST", "/create", "JSON", data=b"{")
        self.assertError(400, "POST", "/create", "'from'", json={})
        self.assertError(400, "POST", "/create", "not a valid", json={"from": "../../x"})
        self.assertEqual(self.puller.refs, [])

    def test_every_pull_and_push_counts_its_bytes(self) -> None:
        """/models and Ollama's /api pull and push alike, streamed or not, succeeded or failed."""
        self.load()
        mib4 = 4 * 1024 * 1024
        self.assertEqual(self.call("POST", "/create", json={"from": "smollm2"})[0], 200)
        self.assertEqual(self.call("POST", "/smollm2/push")[0], 200)
        for path, stream in [
            ("/api/pull", True),
            ("/api/pull", False),
            ("/api/push", True),
            ("/api/push", False),
        ]:
            response = self.successResultOf(
                self.ollama.post(f"http://x{path}", json={"model": "smollm2", "stream": stream})
            )
            self.assertEqual(response.code, 200)
            self.assertIn(b"success", self.successResultOf(response.content()))
        self.puller.error = NotFound("gone")
        self.assertEqual(
            self.successResultOf(self.ollama.post("http://x/api/pull", json={"model": "x"})).code, 200
        )
        pulls, pushes = [("pull", mib4)] * 3, [("push", mib4)] * 3
        self.assertEqual(self.moved, [pulls[0], pushes[0], *pulls[1:], *pushes[1:], ("pull", mib4)])

    def test_push(self) -> None:
        self.load()
        code, body, _ = self.call("POST", "/smollm2/push")
        self.assertEqual(code, 200)
        self.assertEqual(self.lines(body)[-1]["type"], "success")
        self.assertEqual(self.pusher.refs, [Reference("", "ai/smollm2", "latest")])
        self.assertError(404, "POST", "/nothing/push", "not found")
