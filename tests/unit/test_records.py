"""Request records without processes: bounds, truncation, secrets, answers reassembled, the route."""

from __future__ import annotations

import json

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from mrunner.api.door.routing import Routes
from mrunner.api.observe.records import Record, Records, read_answer, record_key, unchunk
from mrunner.api.observe.records_api import RecordsAPI

BODY = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = (
    b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
    b'data: {"choices":[{"delta":{}}],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


class RecordTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.records = Records(per_model=2, max_bytes=10_000, max_body=1_000, now=self.clock.seconds)

    def record(self, model: str = "smollm2", body: bytes = BODY, headers: Headers | None = None) -> Record:
        headers = headers or Headers({b"content-type": [b"application/json"]})
        return self.records.start(
            record_key(model), "completion", b"POST", b"/v1/chat/completions", headers, body
        )

    def test_a_streamed_answer_with_its_timings(self) -> None:
        record = self.record()
        self.clock.advance(0.5)
        record.queued = self.clock.seconds()
        record.start(chunked=False)
        self.clock.advance(0.25)
        for line in STREAM.splitlines(keepends=True):
            record.write(line)
        self.clock.advance(1)
        self.records.end(record, 200, completed=True)
        (shown,) = [r.to_json() for r in self.records.recent("ai/smollm2:latest", 10)]
        self.assertEqual(shown["model"], "ai/smollm2:latest")
        self.assertEqual(shown["route"], "/v1/chat/completions")
        self.assertEqual((shown["status"], shown["completed"]), (200, True))
        self.assertEqual(shown["timings"], {"queued": 0.5, "ttfb": 0.75, "total": 1.75})
        self.assertEqual(shown["tokens"], {"prompt": 4, "completion": 2})
        self.assertIsNone(shown["cached_tokens"])
        self.assertEqual(shown["answer"]["text"], "Hello")
        self.assertTrue(shown["answer"]["stream"])
        self.assertEqual(shown["request"]["body"]["messages"][0]["content"], "hi")

    def test_a_json_answer_and_llama_timings(self) -> None:
        answer = {"choices": [{"text": "four"}], "timings": {"prompt_n": 3, "predicted_n": 1, "cache_n": 7}}
        self.assertEqual(
            read_answer(json.dumps(answer).encode()),
            {
                "stream": False,
                "text": "four",
                "body": answer,
                "tokens": {"prompt": 3, "completion": 1},
                "cached_tokens": 7,
            },
        )

    def test_cached_prompt_tokens_in_each_apis_field(self) -> None:
        """The prompt cache's hits, as each API counts them; none where the answer says nothing."""
        answers = [
            ({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}}, 8),
            ({"usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 5}}}, 5),
            ({"usage": {"input_tokens": 1, "cache_read_input_tokens": 6}}, 6),
            ({"type": "message_start", "message": {"usage": {"cache_read_input_tokens": 4}}}, 4),
            ({"usage": {"prompt_tokens": 9}}, None),
            ({"eval_count": 2, "prompt_eval_count": 3}, None),
        ]
        for answer, cached in answers:
            self.assertEqual(read_answer(json.dumps(answer).encode())["cached_tokens"], cached, answer)
        stream = (
            b"data: "
            + json.dumps({"timings": {"prompt_n": 2, "cache_n": 30}}).encode()
            + b"\n\ndata: [DONE]\n\n"
        )
        self.assertEqual(read_answer(stream)["cached_tokens"], 30)

    def test_every_apis_answers_are_read(self) -> None:
        """Anthropic's, Responses' and Ollama's answers, whole and streamed, give their text and tokens."""

        def sse(*events: dict[str, object]) -> bytes:
            return b"".join(b"event: x\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events)

        cases = [
            (
                json.dumps(
                    {
                        "content": [{"type": "text", "text": "four"}],
                        "usage": {"input_tokens": 3, "output_tokens": 1},
                    }
                ).encode(),
                False,
            ),
            (
                sse(
                    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "fo"}},
                    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ur"}},
                    {"type": "message_delta", "delta": {}, "usage": {"input_tokens": 3, "output_tokens": 1}},
                ),
                True,
            ),
            (
                json.dumps(
                    {
                        "output": [{"type": "message", "content": [{"type": "output_text", "text": "four"}]}],
                        "usage": {"input_tokens": 3, "output_tokens": 1},
                    }
                ).encode(),
                False,
            ),
            (
                sse(
                    {"type": "response.output_text.delta", "delta": "four"},
                    {
                        "type": "response.completed",
                        "response": {"usage": {"input_tokens": 3, "output_tokens": 1}},
                    },
                ),
                True,
            ),
            (
                b'{"message": {"role": "assistant", "content": "fo"}, "done": false}\n'
                b'{"message": {"role": "assistant", "content": "ur"}, "done": false}\n'
                b'{"message": {"role": "assistant", "content": ""}, "done": true, '
                b'"prompt_eval_count": 3, "eval_count": 1}\n',
                True,
            ),
            (b'{"response": "four", "done": true, "prompt_eval_count": 3, "eval_count": 1}', False),
        ]
        for raw, stream in cases:
            answer = read_answer(raw)
            self.assertEqual(
                (answer["stream"], answer["text"], answer["tokens"]),
                (stream, "four", {"prompt": 3, "completion": 1}),
                raw,
            )

    def test_chunked_framing_is_taken_off(self) -> None:
        self.assertEqual(unchunk(b"5\r\nHello\r\n1;x=y\r\n!\r\n0\r\n\r\n"), b"Hello!")
        record = self.record()
        record.start(chunked=True)
        record.write(b'e\r\n{"choices": []\r\n1\r\n}\r\n0\r\n\r\n')
        self.records.end(record, 200, completed=True)
        self.assertEqual(record.to_json()["answer"]["body"], {"choices": []})

    def test_secrets_are_never_kept(self) -> None:
        headers = Headers(
            {
                b"Authorization": [b"Bearer sk-secret"],
                b"X-Api-Key": [b"sk-other"],
                b"Cookie": [b"session=1"],
                b"User-Agent": [b"OpenAI/Python"],
            }
        )
        record = self.record(headers=headers)
        self.records.end(record, 200, completed=True)
        self.assertEqual(record.to_json()["request"]["headers"], {"user-agent": "OpenAI/Python"})
        self.assertNotIn("sk-", json.dumps(record.to_json()))

    def test_oversized_bodies_are_cut_and_marked(self) -> None:
        record = self.record(body=b"x" * 5000)
        record.write(b"y" * 600)
        record.write(b"y" * 600)
        record.write(b"y" * 600)
        self.records.end(record, 200, completed=False)
        shown = record.to_json()
        self.assertEqual((shown["request"]["size"], shown["request"]["truncated"]), (5000, True))
        self.assertEqual(len(shown["request"]["body"]), 1000)
        self.assertEqual((shown["answer"]["size"], shown["answer"]["truncated"]), (1800, True))
        self.assertEqual(record.size, 2000)
        self.assertFalse(shown["completed"])

    def test_bounded_per_model_and_in_bytes(self) -> None:
        for _ in range(3):
            self.records.end(self.record("a"), 200, completed=True)
        self.assertEqual([r.id for r in self.records.recent("ai/a:latest", 10)], [3, 2])
        for name in "bcdef":  # 2 KB a record, two per model: past 10 KB the oldest go
            self.records.end(self.record(name, body=b"z" * 1000), 200, completed=True)
            self.records.end(self.record(name, body=b"z" * 1000), 200, completed=True)
        kept = self.records.recent(None, 100)
        self.assertLessEqual(sum(r.size for r in kept), 10_000)
        self.assertEqual(kept[0].model, "ai/f:latest")
        self.assertNotIn("ai/a:latest", {r.model for r in kept}, "the oldest went first")
        self.assertEqual([r.id for r in self.records.recent(None, 2)], [kept[0].id, kept[1].id])


class RouteTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.records = Records(per_model=10, max_bytes=100_000, max_body=1_000, now=self.clock.seconds)
        self.api = RecordsAPI(self.records)
        self.http = StubTreq(Routes([self.api]))

    def add(self, model: str) -> None:
        headers = Headers()
        record = self.records.start(
            record_key(model), "completion", b"POST", b"/v1/completions", headers, BODY
        )
        record.write(b'{"choices": [{"text": "ok"}]}')
        self.records.end(record, 200, completed=True)

    def get(self, url: str) -> tuple[int, object]:
        response = self.successResultOf(self.http.get("http://mrunner" + url))
        return response.code, json.loads(self.successResultOf(self.http.content(response)))

    def test_list_filter_and_limit(self) -> None:
        self.add("a")
        self.add("b")
        self.add("a")
        code, body = self.get("/engines/requests")
        self.assertEqual(code, 200)
        self.assertEqual([r["id"] for r in body], [3, 2, 1])  # type: ignore[index]
        code, body = self.get("/engines/requests?model=a&limit=1")
        self.assertEqual([(r["id"], r["model"]) for r in body], [(3, "ai/a:latest")])  # type: ignore[index]
        self.assertEqual(self.get("/engines/requests?limit=0")[0], 400)
        self.assertEqual(self.get("/engines/requests?limit=x")[0], 400)
        self.assertEqual(self.get("/engines/requests?limit=" + "1" * 5000)[0], 400)  # int() refuses it
        self.assertEqual(self.get("/engines/requests?follow=maybe")[0], 400)

    def test_follow_as_server_sent_events(self) -> None:
        self.add("a")
        d = self.http.get("http://mrunner/engines/requests?follow=true&model=a", unbuffered=True)
        response = self.successResultOf(d)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"text/event-stream"])
        chunks: list[bytes] = []
        response.deliverBody(_Collect(chunks))
        self.http.flush()
        self.add("b")
        self.add("a")
        self.http.flush()
        events = [json.loads(line[6:]) for line in b"".join(chunks).split(b"\n\n") if line]
        self.assertEqual([(e["id"], e["answer"]["text"]) for e in events], [(1, "ok"), (3, "ok")])
        self.api.stopService()  # the daemon stops: the follow ends
        self.http.flush()

    def test_off_means_off(self) -> None:
        http = StubTreq(Routes([RecordsAPI(None)]))
        response = self.successResultOf(http.get("http://mrunner/engines/requests"))
        self.assertEqual(response.code, 404)
        body = json.loads(self.successResultOf(http.content(response)))
        self.assertEqual(body["error"]["code"], "records_off")


class _Collect:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def makeConnection(self, transport: object) -> None:
        pass

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: object) -> None:
        pass
