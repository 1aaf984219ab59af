"""A streamed request that waits in the queue is told so in comments, and a wait that fails ends its
stream with an error event in its API's shape (issue 39, point 4), on a Clock, without processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.door.routing import Routes
from mrunner.api.observe.records import Records
from mrunner.api.openai.wait_notes import EVERY, FIRST
from mrunner.config import Config, SchedulerConfig
from mrunner.errors import RunnerFailed
from mrunner.scheduling.facade import Scheduler
from mrunner.values.backend import COMPLETION
from mrunner.values.request import Resolved
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.route_groups import daemon_groups

NAME = "ai/smollm2:latest"
HI = [{"role": "user", "content": "hi"}]
CHAT = ("/v1/chat/completions", {"model": "smollm2", "messages": HI, "stream": True})
MESSAGES = ("/anthropic/v1/messages", {"model": "smollm2", "max_tokens": 5, "messages": HI, "stream": True})
RESPONSES = ("/v1/responses", {"model": "smollm2", "input": "hi", "stream": True})
OLLAMA = ("/api/chat", {"model": "smollm2", "messages": HI})
LOADING = b": waiting for ai/smollm2:latest to load, 0 ahead\n\n"


@attrs.define
class Answer:
    """A response whose body is collected as it comes."""

    code: int
    headers: Any
    body: list[bytes]
    done: Any

    @property
    def text(self) -> bytes:
        return b"".join(self.body)


class WaitNotesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        self.spawn = FakeSpawner()
        self.store = FakeStore({NAME: model()})
        config = attrs.evolve(Config(), scheduler=SchedulerConfig(install_wait=5, max_runners=1, parallel=1))
        self.scheduler = Scheduler(
            self.clock, config, {"llama.cpp": self.backend}, self.store, self.spawn.start_runner
        )
        self.records = Records(per_model=10, max_bytes=10**6, max_body=1000, now=self.clock.seconds)
        groups = daemon_groups(
            self.scheduler,
            self.store,
            self.clock,
            {"llama.cpp": self.backend},
            Path(self.mktemp()),
            records=self.records,
        )
        self.http = StubTreq(Routes(groups))
        self.scheduler.start()

    def installed(self) -> None:
        self.backend.installs[-1].callback("llama.cpp test")

    def send(self, path: str, body: dict[str, Any]) -> Any:
        d = self.http.request("POST", "http://mrunner" + path, data=json.dumps(body).encode())
        self.http.flush()
        return d

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.http.flush()

    def begun(self, d: Any) -> Answer:
        """The answer whose head has come; its body is collected from then on."""
        response = self.successResultOf(d)
        body: list[bytes] = []
        done = self.http.collect(response, body.append)
        self.http.flush()
        return Answer(response.code, response.headers, body, done)

    def fail_the_load(self) -> None:
        self.spawn.processes[0].ready.errback(RunnerFailed("runner exited; its last output:\nbad magic"))
        self.spawn.processes[0].exit()
        self.http.flush()

    def test_a_stream_waiting_for_a_load_hears_why_then_its_error_event(self) -> None:
        self.installed()
        d = self.send(*CHAT)
        self.advance(FIRST - 0.1)
        self.assertNoResult(d)
        self.advance(0.1)
        answer = self.begun(d)
        self.assertEqual(answer.code, 200)
        self.assertEqual(answer.headers.getRawHeaders(b"content-type"), [b"text/event-stream"])
        self.assertEqual(answer.text, LOADING)
        self.advance(EVERY)
        self.assertEqual(answer.text, LOADING * 2)
        self.fail_the_load()
        self.successResultOf(answer.done)
        last = answer.text[len(LOADING * 2) :]
        self.assertTrue(last.startswith(b"data: ") and last.endswith(b"\n\n"), last)
        error = json.loads(last[len(b"data: ") :])["error"]
        self.assertIn("bad magic", error["message"])
        self.advance(EVERY)
        self.assertEqual(answer.text.count(b": waiting"), 2, "no note once the wait has ended")

    def test_the_record_keeps_the_answer_not_the_notes(self) -> None:
        self.installed()
        d = self.send(*CHAT)
        self.advance(FIRST)
        answer = self.begun(d)
        self.fail_the_load()
        self.successResultOf(answer.done)
        (record,) = self.records.recent(None, 10)
        self.assertNotIn(b"waiting", bytes(record.answer))
        self.assertEqual(record.status, 500, "the wait's outcome, though the client's head said 200")

    def test_the_second_in_the_queue_hears_one_ahead(self) -> None:
        self.installed()
        first = self.send(*CHAT)
        self.advance(1)
        second = self.send(*CHAT)
        self.advance(FIRST)
        self.assertEqual(self.begun(first).text, LOADING)
        self.assertEqual(self.begun(second).text, b": waiting for ai/smollm2:latest to load, 1 ahead\n\n")

    def test_a_stream_waiting_for_a_busy_runner_hears_it_waits_for_a_slot(self) -> None:
        self.installed()
        held = self.scheduler.acquire(Resolved("llama.cpp", self.store.models[NAME], COMPLETION))
        self.spawn.processes[0].ready.callback(None)
        self.successResultOf(held)
        d = self.send(*CHAT)
        self.advance(FIRST)
        self.assertEqual(self.begun(d).text, b": waiting for a free slot of ai/smollm2:latest, 0 ahead\n\n")

    def test_an_anthropic_stream_ends_with_its_error_event(self) -> None:
        self.installed()
        d = self.send(*MESSAGES)
        self.advance(FIRST)
        answer = self.begun(d)
        self.fail_the_load()
        self.successResultOf(answer.done)
        name, data = answer.text[len(LOADING) :].split(b"\n", 1)
        self.assertEqual(name, b"event: error")
        error = json.loads(data.removeprefix(b"data: "))
        self.assertEqual((error["type"], error["error"]["type"]), ("error", "api_error"))

    def test_a_responses_stream_is_noted(self) -> None:
        self.installed()
        d = self.send(*RESPONSES)
        self.advance(FIRST)
        self.assertEqual(self.begun(d).text, LOADING)

    def test_no_notes_for_an_ollama_stream_nor_an_answer_that_is_not_a_stream(self) -> None:
        self.installed()
        ollama = self.send(*OLLAMA)
        whole = self.send(CHAT[0], {**CHAT[1], "stream": False})
        self.advance(FIRST + 3 * EVERY)
        self.assertNoResult(ollama)
        self.assertNoResult(whole)
        self.fail_the_load()
        self.assertEqual(self.successResultOf(ollama).code, 500)
        self.assertEqual(self.successResultOf(whole).code, 500)

    def test_no_notes_while_the_backend_installs_so_its_503_can_be_retried(self) -> None:
        d = self.send(*CHAT)
        self.advance(5)
        response = self.successResultOf(d)
        self.assertEqual(response.code, 503)
        self.assertEqual(response.headers.getRawHeaders(b"retry-after"), [b"5"])
        body = json.loads(self.successResultOf(self.http.content(response)))
        self.assertIn("llama.cpp", body["error"]["message"])
