"""The scheduler's errors on the Anthropic and Ollama routes, in their shapes, without processes."""

from __future__ import annotations

import json
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.compat.anthropic.routes import AnthropicAPI
from mrunner.api.compat.ollama.routes import OllamaAPI
from mrunner.api.door.routing import Routes
from mrunner.api.openai.gateway import Gateway
from mrunner.config import Config, SchedulerConfig
from mrunner.errors import RunnerFailed
from mrunner.metrics import Metrics
from mrunner.runners.answer import RunnerClient
from mrunner.scheduling.scheduler import Scheduler
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model

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
        gateway = Gateway(self.scheduler, Metrics(), self.clock, 1000)
        runners = RunnerClient(None)  # type: ignore[arg-type]  # no request reaches a runner here
        groups = [AnthropicAPI(gateway, runners, store), OllamaAPI(gateway, runners, store, None, None)]  # type: ignore[arg-type]
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
