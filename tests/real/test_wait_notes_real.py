"""A streamed request that waits for a slow load hears why in SSE comments, and its stream then goes
on as the runner's, on either relay (issue 39, point 4).

The daemon runs the stand-in runner (tests/support/runner_program.py), which says it is loading
for L{LOAD} seconds, longer than the wait before the first note.
"""

from __future__ import annotations

import json
from pathlib import Path

from openai import APIError, OpenAI
from twisted.internet.threads import deferToThread

from mrunner.api.openai.wait_notes import FIRST
from tests.support.daemon import eventually, http
from tests.support.daemon_cases import HI, MODEL, DaemonTestCase

LOAD = FIRST + 2
NOTE = b": waiting for ai/tiny:latest to load, 0 ahead\n\n"


def events(body: bytes) -> list[bytes]:
    """A stream's events and comments, each whole: nothing else may be in it."""
    assert body.endswith(b"\n\n"), body
    return body[:-2].split(b"\n\n")


class WaitNotesTests(DaemonTestCase):
    runner_args = ("--health-delay", str(LOAD))
    fast = True  # a stream noted goes on to the fast relay's thread all the same

    async def test_the_openai_client_streams_through_the_notes(self) -> None:
        await self.start()
        client = OpenAI(
            base_url=self.daemon.url + "/v1",
            api_key="none",
            max_retries=0,
            default_headers={"Connection": "close"},
        )
        chunks = await deferToThread(
            lambda: list(client.chat.completions.create(model=MODEL, messages=HI, stream=True))
        )
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), "tok0 tok1 tok2 ")

    async def test_the_notes_come_before_the_runners_events(self) -> None:
        await self.start()
        gate = str(self.home / "gate")
        Path(f"{gate}0").touch()
        response, stream = await self.open_stream({"test": {"events": 2, "gate": gate}})
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"text/event-stream"])
        await stream.arrived(b"tok0")  # the runner holds the second back: the relay has the stream
        Path(f"{gate}1").touch()
        self.assertTrue(await stream.done, "the stream ended as it should")
        got = events(stream.data)
        self.assertEqual(got[0] + b"\n\n", NOTE)
        data = [json.loads(e.removeprefix(b"data: ")) for e in got if e.startswith(b"data: {")]
        self.assertEqual([d["choices"][0]["delta"].get("content") for d in data][:2], ["tok0 ", "tok1 "])
        self.assertEqual(got[-1], b"data: [DONE]")
        fast = self.daemon.forwarder.fast
        self.assertEqual(fast is not None and fast.moved == 1, self.fast)
        (record,) = await (await http.get(self.daemon.url + "/engines/requests")).json()
        self.assertNotIn("waiting for", json.dumps(record), "the record keeps the answer, not the notes")

    async def test_a_client_that_leaves_while_noted_leaves_the_queue(self) -> None:
        await self.start()
        _, stream = await self.open_stream({})
        await stream.arrived(NOTE)
        stream.transport.stopProducing()
        await eventually(lambda: self.daemon.scheduler.queued() == 0)
        code, answer, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual((code, answer["choices"][0]["message"]["content"]), (200, "echo: hi"))

    async def test_a_refusal_after_the_notes_is_the_streams_last_event(self) -> None:
        await self.start()
        response, stream = await self.open_stream({"test": {"refuse": 400}})
        self.assertEqual(response.code, 200)
        self.assertTrue(await stream.done)
        got = events(stream.data)
        self.assertEqual(got[0] + b"\n\n", NOTE)
        error = json.loads(got[-1].removeprefix(b"data: "))["error"]
        self.assertIn("the runner refused the request", error["message"])

    async def test_the_openai_client_raises_the_error_event(self) -> None:
        await self.start()
        client = OpenAI(base_url=self.daemon.url + "/v1", api_key="none", max_retries=0)

        def stream() -> None:
            for _ in client.chat.completions.create(
                model=MODEL, messages=HI, stream=True, extra_body={"test": {"refuse": 400}}
            ):
                pass

        with self.assertRaises(APIError) as caught:
            await deferToThread(stream)
        self.assertIn("the runner refused the request", str(caught.exception))

    async def test_an_anthropic_stream_is_noted(self) -> None:
        await self.start()
        body = {"model": MODEL, "max_tokens": 5, "messages": HI, "stream": True}
        response = await http.post(self.daemon.url + "/anthropic/v1/messages", json=body)
        self.assertEqual(response.code, 200)
        self.assertTrue((await response.content()).startswith(NOTE))

    async def test_an_ollama_stream_waits_in_silence(self) -> None:
        await self.start()
        response = await http.post(self.daemon.url + "/api/chat", json={"model": MODEL, "messages": HI})
        self.assertEqual(response.code, 200)
        lines = (await response.content()).splitlines()
        self.assertTrue(lines)
        for line in lines:
            json.loads(line)  # NDJSON, every line: no comment among them


class TwistedRelayWaitNotesTests(WaitNotesTests):
    config_text = '[http]\nrelay = "twisted"\n'
    fast = False
