"""The scheduler's errors on the Anthropic and Ollama routes, in their shapes, and the steps every
inference API takes through the gateway, without processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.compat.ollama.routes import OllamaAPI
from mrunner.api.door.routing import Routes
from mrunner.api.errors import openai_stream_error
from mrunner.api.observe.records import Records
from mrunner.api.openai.gateway import Gateway
from mrunner.config import Config, SchedulerConfig
from mrunner.daemon.metrics import Metrics
from mrunner.errors import RunnerFailed
from mrunner.proxy.forwarder import Forwarder
from mrunner.scheduling.facade import Scheduler
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.route_groups import daemon_groups

ANTHROPIC = "http://mrunner/anthropic/v1/messages"
OLLAMA = "http://mrunner/api/chat"


class SchedulerErrorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        self.spawn = FakeSpawner()
        store = FakeStore({"ai/smollm2:latest": model()})
        scheduler_config = SchedulerConfig(install_wait=5, max_queue=2, max_runners=1, parallel=1)
        config = attrs.evolve(Config(), scheduler=scheduler_config)
        self.scheduler = Scheduler(
            self.clock, config, {"llama.cpp": self.backend}, store, self.spawn.start_runner
        )
        groups = daemon_groups(
            self.scheduler, store, self.clock, {"llama.cpp": self.backend}, Path(self.mktemp())
        )
        self.http = StubTreq(Routes(groups))

    def request(self, url: str, body: dict[str, Any]) -> Any:
        d = self.http.request("POST", url, data=json.dumps(body).encode())
        self.http.flush()
        return d

    def answer(self, d: Any) -> tuple[int, Any, Any]:
        self.http.flush()
        response = self.successResultOf(d)
        return response.code, json.loads(self.successResultOf(self.http.content(response))), response.headers

    def anthropic(self) -> Any:
        return self.request(ANTHROPIC, {"model": "smollm2", "max_tokens": 5, "messages": []})

    def ollama(self) -> Any:
        return self.request(OLLAMA, {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})

    def test_installing_is_overloaded_with_retry_after(self) -> None:
        self.scheduler.start()
        anthropic, ollama = self.anthropic(), self.ollama()
        self.clock.advance(5)
        code, body, headers = self.answer(anthropic)
        self.assertEqual((code, body["error"]["type"]), (529, "overloaded_error"))
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"5"])
        code, body, _ = self.answer(ollama)
        self.assertEqual(code, 503)
        self.assertIn("llama.cpp", body["error"])

    def test_queue_full(self) -> None:
        self.scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        waiting = [self.anthropic(), self.ollama()]
        code, body, _ = self.answer(self.anthropic())
        self.assertEqual((code, body["type"], body["error"]["type"]), (529, "error", "overloaded_error"))
        code, body, _ = self.answer(self.ollama())
        self.assertEqual((code, list(body)), (503, ["error"]))
        for d in waiting:
            self.assertNoResult(d)

    def test_draining_is_overloaded_with_retry_after(self) -> None:
        self.scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        self.successResultOf(self.scheduler.drain())
        code, body, headers = self.answer(self.anthropic())
        self.assertEqual((code, body["error"]["type"]), (529, "overloaded_error"))
        self.assertIn("draining", body["error"]["message"])
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"1"])
        code, body, headers = self.answer(self.ollama())
        self.assertEqual(code, 503)
        self.assertIn("draining", body["error"])
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"1"])

    def test_runner_failed_to_start(self) -> None:
        self.scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        d = self.anthropic()
        self.spawn.processes[0].ready.errback(RunnerFailed("runner exited; its last output:\nbad magic"))
        self.spawn.processes[0].exit()
        code, body, _ = self.answer(d)
        self.assertEqual((code, body["error"]["type"]), (500, "api_error"))
        self.assertIn("bad magic", body["error"]["message"])

    def test_too_large_for_the_budget(self) -> None:
        self.backend.need = 2**40
        self.scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        code, body, _ = self.answer(self.anthropic())
        self.assertEqual((code, body["error"]["type"]), (400, "invalid_request_error"))
        self.assertIn("memory budget", body["error"]["message"])


class GatewayTests(SynchronousTestCase):
    """Every inference API begins a request the same way (L{Gateway.begin})."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        store = FakeStore({"ai/smollm2:latest": model()})
        self.records = Records(per_model=10, max_bytes=10**6, max_body=1000, now=self.clock.seconds)
        self.make(Config(), store)

    def make(self, config: Config, store: FakeStore) -> None:
        config = attrs.evolve(config, scheduler=SchedulerConfig(install_wait=5))
        backends = {"llama.cpp": self.backend}
        self.scheduler = Scheduler(self.clock, config, backends, store, FakeSpawner().start_runner)
        groups = daemon_groups(
            self.scheduler, store, self.clock, backends, Path(self.mktemp()), records=self.records
        )
        self.http = StubTreq(Routes(groups))

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        d = self.http.request("POST", "http://mrunner" + path, data=body)
        self.http.flush()
        self.clock.advance(5)
        self.http.flush()
        response = self.successResultOf(d)
        return response.code, json.loads(self.successResultOf(self.http.content(response)))

    def test_an_unknown_backend_is_refused_first_in_each_apis_shape(self) -> None:
        """Before the body is read: a malformed one is not what the client hears about."""
        self.make(attrs.evolve(Config(), default_backend="vllm"), FakeStore())
        for path, message in [
            ("/v1/chat/completions", lambda body: body["error"]["message"]),
            ("/anthropic/v1/messages", lambda body: body["error"]["message"]),
            ("/v1/responses", lambda body: body["error"]["message"]),
            ("/api/chat", lambda body: body["error"]),
            ("/api/generate", lambda body: body["error"]),
            ("/api/embed", lambda body: body["error"]),
        ]:
            code, body = self.post(path, b"{")
            self.assertEqual(code, 404, (path, body))
            self.assertIn("unknown backend 'vllm'", message(body), path)

    def test_the_record_keeps_the_bytes_received(self) -> None:
        """Not the payload encoded again: what the client sent, spacing and key order included."""
        self.scheduler.start()  # the backend installs and never finishes: each request waits, then is busy
        sent = {
            "/v1/chat/completions": b'{"messages":[{"role":"user","content":"hi"}],  "model":"smollm2"}',
            "/anthropic/v1/messages": b'{"max_tokens":5,"messages":[],"model":"smollm2"}',
            "/v1/responses": b'{"input":"hi","model":"smollm2"}',
            "/api/chat": b'{"messages":[{"role":"user","content":"hi"}],"model":"smollm2"}',
            "/api/embed": b'{"input":"hi","model":"smollm2"}',
        }
        for path, body in sent.items():
            self.assertIn(self.post(path, body)[0], (503, 529), path)  # 529: Anthropic's overloaded
        kept = {record.route: record.body for record in self.records.recent(None, 10)}
        self.assertEqual(kept, sent)

    def test_the_record_keeps_the_answer_its_client_got_in_every_api(self) -> None:
        """One way for every API (L{record_writes}): OpenAI's refusal is kept as the others' are."""
        self.scheduler.start()  # the backend installs and never finishes: each request is busy
        got = {}
        for path, body in [
            ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"hi"}],"model":"smollm2"}'),
            ("/anthropic/v1/messages", b'{"max_tokens":5,"messages":[],"model":"smollm2"}'),
            ("/api/embed", b'{"input":"hi","model":"smollm2"}'),
        ]:
            got[path] = self.post(path, body)[1]
        kept = {record.route: json.loads(record.answer) for record in self.records.recent(None, 10)}
        self.assertEqual(kept, got)


class FallbackTests(SynchronousTestCase):
    def test_a_path_no_group_knows_gets_openais_404_whatever_the_last_group(self) -> None:
        """Not the last group's shape (Ollama's here): the fallback group's, named in L{Routes}."""
        clock, store = Clock(), FakeStore()
        scheduler = Scheduler(
            clock, Config(), {"llama.cpp": FakeBackend()}, store, FakeSpawner().start_runner
        )
        ollama = OllamaAPI(
            Gateway(scheduler, store, Metrics(), clock, 1000), Forwarder(None, openai_stream_error), store
        )  # type: ignore[arg-type]
        http = StubTreq(Routes([ollama]))
        response = self.successResultOf(http.get("http://mrunner/nope"))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual(response.code, 404)
        self.assertIsInstance(body["error"], dict, "an Ollama-shaped error")
        self.assertEqual(body["error"]["message"], "GET /nope: Not Found")
