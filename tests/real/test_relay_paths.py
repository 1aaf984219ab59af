"""Which relay serves a stream (C{[http] relay}), on each listener, and that each keeps what a stream does.

The daemon runs in this process with the stand-in runner (tests/support/runner_program.py),
whose streams are chunked, so a plain TCP or UNIX client's go to the fast relay's
thread (L{mrunner.proxy.fastrelay}); a TLS client's and those with C{relay = "twisted"}
stay on the Twisted relay.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx2
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from mrunner.proxy.fastrelay import FastRelay
from tests.support.daemon import InProcessDaemon, eventually, http, lines, short_home, sleep, write_config
from tests.support.daemon_cases import HI, MODEL, DaemonTestCase
from tests.support.front_door import self_signed
from tests.support.ggufs import write_tiny_gguf
from tests.support.raw_streams import chat_request, ended_whole, read_stream

USAGE = {"stream_options": {"include_usage": True}}
#: Seconds between a stream's events, so the relay has it before its end is in (the fast thread
#: takes a stream still open; one whose every byte came with its head is over already).
SPACED = 0.05


def moved(daemon: InProcessDaemon) -> int | None:
    """Streams the fast relay's thread took; None where the daemon has no fast relay."""
    fast: FastRelay | None = daemon.forwarder.fast
    return None if fast is None else fast.moved


class FastRelayTests(DaemonTestCase):
    relay = "fast"

    def setUp(self) -> None:
        self.config_text = f'[http]\nrelay = "{self.relay}"\n'

    def expected(self, streams: int) -> int | None:
        return None if self.relay == "twisted" else streams

    async def test_the_relay_is_the_one_named(self) -> None:
        """C{"fast"} builds and runs the loop in C (a compiler is here, as for llama-server)."""
        await self.start()
        self.assertEqual(self.daemon.forwarder.fast is not None, self.relay == "fast")

    async def test_a_stream_is_sent_as_it_comes_and_recorded_and_metered(self) -> None:
        await self.start()
        gate, events = await self.gated_stream()
        self.assertNotIn(b"tok1", events.data, "the first event was not held back")
        Path(f"{gate}1").touch()
        self.assertTrue(await events.done)
        self.assertTrue(events.data.endswith(b"data: [DONE]\n\n"))
        self.assertEqual(moved(self.daemon), self.expected(1))
        for _ in range(100):  # the record, once its answer has ended
            response = await http.get(self.daemon.url + "/engines/requests")
            records = json.loads(await response.text())
            if '"completed": true' in json.dumps(records):
                break
            await sleep(0.05)
        self.assertIn("tok0 tok1", json.dumps(records), "the record holds the answer reassembled")

    async def test_the_usage_chunk_reaches_the_client(self) -> None:
        await self.start()
        _, events = await self.open_stream({"test": {"events": 3, "interval": SPACED}, **USAGE})
        self.assertTrue(await events.done)
        self.assertIn(b'"completion_tokens": 3', events.data)
        self.assertEqual(moved(self.daemon), self.expected(1))

    async def test_a_client_that_leaves_cancels_the_runners_answer(self) -> None:
        await self.start()
        _, events = await self.gated_stream()
        events.transport.stopProducing()
        await eventually(lambda: lines(self.home / "events") == ["cancelled"])
        await eventually(lambda: [r.in_use for r in self.daemon.scheduler.snapshot()] == [0])
        self.assertEqual(moved(self.daemon), self.expected(1))

    async def test_a_runner_that_cuts_the_stream_ends_it_with_an_error_event(self) -> None:
        await self.start()
        _, events = await self.open_stream({"test": {"events": 3, "crash_after": 1, "interval": SPACED}})
        await events.done
        self.assertIn(b"tok0", events.data)
        last = json.loads(events.data.split(b"data: ")[-1])
        self.assertEqual(
            last["error"]["message"], "the runner stopped in the middle of the answer: its connection closed"
        )
        self.assertEqual(moved(self.daemon), self.expected(1))

    async def test_streams_one_after_another_reuse_the_runners_connection(self) -> None:
        await self.start()
        for _ in range(3):
            _, events = await self.open_stream({"test": {"events": 2, "interval": 0.05}})
            self.assertTrue(await events.done)
            self.assertIn(b"data: [DONE]", events.data)
        self.assertEqual(moved(self.daemon), self.expected(3))

    async def test_the_end_comes_whole(self) -> None:
        """The stand-in ends as llama-server does, C{0\\r\\n} then C{\\r\\n}: the client gets them in one
        read, as a client that looks for the end in its last read needs (the bench's load waited a
        minute for the daemon to close the connection)."""
        await self.start()
        host, port = self.daemon.url.removeprefix("http://").split(":")
        request = chat_request(
            {"model": MODEL, "messages": HI, "stream": True, "test": {"events": 3, "interval": SPACED}}
        )
        _, reads = await deferToThread(read_stream, (host, int(port)), request, 30.0)
        self.assertTrue(ended_whole(reads), reads[-3:])
        self.assertEqual(moved(self.daemon), self.expected(1))


class TwistedRelayTests(FastRelayTests):
    relay = "twisted"


class ListenerTests(TestCase):
    """A UNIX listener's streams go to the fast relay; a TLS listener's stay on the Twisted relay.

    Each daemon names the fast relay, whatever C{MRUNNER_TEST_RELAY} says: these are its listeners.
    """

    timeout = 60
    config_text = '[http]\nrelay = "fast"\n'

    async def test_a_unix_listeners_stream_goes_to_the_fast_relay(self) -> None:
        home = short_home(self)
        path = home / "api.sock"
        daemon = InProcessDaemon(write_config(home, self.config_text), listen=f"unix:{path}")
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        body = {"model": MODEL, "messages": HI, "stream": True, "test": {"events": 3, "interval": 0.05}}

        def talk() -> bytes:
            with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(path)), timeout=30) as client:
                client.post("http://localhost/models/load", params={"name": MODEL}, content=gguf.read_bytes())
                return client.post("http://localhost/v1/chat/completions", json=body).content

        data = await deferToThread(talk)
        self.assertIn(b"tok2", data)
        self.assertTrue(data.endswith(b"data: [DONE]\n\n"))
        self.assertEqual(moved(daemon), 1)

    async def test_a_tls_listeners_stream_stays_on_the_twisted_relay(self) -> None:
        home = short_home(self)
        pem = home / "daemon.pem"
        self_signed(pem)
        daemon = InProcessDaemon(write_config(home, self.config_text), tls=pem)
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        trusted = ssl.create_default_context(cafile=str(pem))
        body = {"model": MODEL, "messages": HI, "stream": True, "test": {"events": 3, "interval": 0.05}}

        def talk() -> bytes:
            with httpx2.Client(verify=trusted, timeout=30) as client:
                client.post(f"{daemon.url}/models/load", params={"name": MODEL}, content=gguf.read_bytes())
                return client.post(f"{daemon.url}/v1/chat/completions", json=body).content

        data = await deferToThread(talk)
        self.assertIn(b"tok2", data)
        self.assertTrue(data.endswith(b"data: [DONE]\n\n"))
        self.assertEqual(moved(daemon), 0)
