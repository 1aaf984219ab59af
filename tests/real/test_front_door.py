"""The front door of a real daemon over real sockets: early 413, the connection cap, slow clients, TLS.

The daemon runs in this process on the real reactor, with tests/support/runner_program.py as its
runner; the blocking clients (sockets, http.client, the openai client) run in threads.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import stat
import time
from typing import Any

import httpx2
from openai import AuthenticationError, OpenAI
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from mrunner import config as configuration
from mrunner.tap import make_service
from tests.support.cli_cases import MRUNNER
from tests.support.daemon import InProcessDaemon, eventually, short_home, write_config
from tests.support.daemon_cases import MODEL, DaemonTestCase
from tests.support.front_door import port_of, self_signed
from tests.support.ggufs import write_tiny_gguf
from tests.support.parsers import with_twisted_heads

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def exchange(port: int, data: bytes) -> bytes:
    """Send C{data} on a new connection and read until the daemon closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # the daemon stopped waiting for a body it had refused
        return b"".join(chunks)


def request(
    connection: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    connection.request(method, path, data, {"Content-Type": "application/json"} if data else {})
    response = connection.getresponse()
    payload = response.read()
    return response.status, json.loads(payload) if payload else None


class EarlyLimitTests(DaemonTestCase):
    config_text = '[http]\nheader_timeout = "1s"\n'

    async def test_413_before_the_body_is_sent(self) -> None:
        await self.start()
        for path, length in [
            ("/health", 50_000_000),
            ("/models/create", 1_000_000),
            ("/engines/unload", 50_000_000),
            ("/v1/chat/completions", 50_000_000),
            ("/models/load?name=ai/big", 100 * 2**30),
        ]:
            head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n"
            answer = await deferToThread(exchange, port_of(self.daemon.url), head.encode())
            status, _, body = answer.partition(b"\r\n")[0], None, answer.partition(b"\r\n\r\n")[2]
            self.assertIn(b" 413 ", status, (path, answer))
            self.assertEqual(json.loads(body)["error"]["code"], "request_too_large")

    async def test_a_trickler_is_cut_off_before_its_headers_end(self) -> None:
        await self.start()
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"x" * 200 + b"\r\n\r\n"

        def trickle() -> tuple[int, bytes]:
            with socket.create_connection(("127.0.0.1", port_of(self.daemon.url)), timeout=30) as s:
                for sent in range(len(head)):
                    try:
                        s.send(head[sent : sent + 1])
                    except OSError:
                        return sent, b""
                    time.sleep(0.05)
                    s.setblocking(False)
                    try:
                        data = s.recv(1024)
                    except BlockingIOError:
                        data = None
                    except OSError:
                        data = b""
                    s.setblocking(True)
                    if data is not None:
                        return sent, data
            return len(head), b"served"

        sent, answer = await deferToThread(trickle)
        self.assertLess(sent, len(head) - 1)
        self.assertEqual(answer, b"")


def answer_to(port: int, data: bytes) -> tuple[int, dict[bytes, bytes], Any]:
    """Send C{data} in one write, then read the answer to the daemon's close: a reset fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status, *fields = head.split(b"\r\n")
    headers = dict(field.lower().split(b": ", 1) for field in fields)
    return int(status.split()[1]), headers, json.loads(body)


class HostilePeerTests(DaemonTestCase):
    """Issue 22's front-door rows over real sockets: each case answered with a status, then closed."""

    config_text = 'max_request_bytes = 65536\n[http]\nheader_timeout = "10s"\n'

    async def test_what_twisted_web_dropped_unanswered(self) -> None:
        await self.start()
        port = port_of(self.daemon.url)
        host = b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        chunked = b"POST /engines/v1/chat/completions" + host + b"Transfer-Encoding: chunked\r\n\r\n"
        body = json.dumps(CHAT).encode()
        for name, data, status in [
            (
                "a body over max_request_bytes in the headers' write",
                (
                    b"POST /engines/v1/chat/completions"
                    + host
                    + b"Content-Length: 8000000\r\n\r\n"
                    + b"x" * 8_000_000
                ),
                413,
            ),
            ("a 1 MB header line", b"GET /health" + host + b"X-Big: " + b"a" * 2**20 + b"\r\n\r\n", 431),
            ("a 1 MB request line", b"GET /" + b"a" * 2**20 + host + b"\r\n", 414),
            (
                "a 5,000-digit Content-Length",
                b"POST /health" + host + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n",
                400,
            ),
            ("a 40-digit chunk size", chunked + b"f" * 40 + b"\r\n" + b"x" * 1000, 400),
            (
                "a lower-case method",
                (
                    b"post /engines/v1/chat/completions"
                    + host
                    + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body
                ),
                405,
            ),
        ]:
            code, headers, error = await deferToThread(answer_to, port, data)
            self.assertEqual(code, status, name)
            self.assertEqual(headers[b"connection"], b"close", name)
            self.assertEqual(set(error["error"]), {"message", "type", "code"}, name)
        self.assertFalse((self.home / "starts").exists(), "a refused request reached a runner")
        # Each closed once its client was done: none waits out header_timeout.
        await eventually(lambda: self.daemon.site.connections == 0, 9)


class BareLineFeedTests(DaemonTestCase):
    """Issue 35, A21: a head whose lines end in LF alone is a 400 at once (it got no answer, and a reset
    10 s later); a body with LFs in it is a body."""

    async def test_a_bare_lf_head_is_a_400_at_once(self) -> None:
        await self.start()
        port = port_of(self.daemon.url)
        for name, data in [
            ("every line", b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n"),
            ("one header", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\nX-A: 1\r\n\r\n"),
            ("the blank line", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\n"),
        ]:
            start = time.monotonic()
            code, headers, error = await deferToThread(answer_to, port, data)
            self.assertLess(time.monotonic() - start, 2, name)
            self.assertEqual(
                (code, error["error"]["code"], headers[b"connection"]), (400, "bare_lf", b"close")
            )
            self.assertIn("CRLF", error["error"]["message"])
        body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "a\nb"}]}, indent=1).encode()
        code, _, answer = await deferToThread(
            answer_to,
            port,
            b"POST /engines/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
        )
        self.assertEqual(code, 200, answer)


class FollowerTests(DaemonTestCase):
    config_text = (
        '[http]\nmax_connections = 8\nmax_followers = 2\n[records]\nmax_body = "2MiB"\nmax_bytes = "64MiB"\n'
    )

    async def test_followers_have_their_own_cap_and_health_always_answers(self) -> None:
        await self.start()
        port = port_of(self.daemon.url)

        def crowd() -> tuple[list[int], int, int]:
            held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(8)]
            try:
                statuses = []
                for s, path in zip(held, ["/logs", "/engines/requests", "/logs"], strict=False):
                    s.sendall(b"GET %s?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode())
                    statuses.append(int(s.recv(65536).split()[1]))
                extra = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                health = request(extra, "GET", "/health")[0]
                extra.close()
                chat = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                chat_status = request(chat, "POST", "/engines/v1/chat/completions", CHAT)[0]
                chat.close()
                return statuses, health, chat_status
            finally:
                for s in held:
                    s.close()

        statuses, health, chat = await deferToThread(crowd)
        self.assertEqual(statuses, [200, 200, 429])
        self.assertEqual((health, chat), (200, 503))  # past max_connections /health still answers

    async def test_a_follower_that_reads_nothing_is_dropped(self) -> None:
        await self.start()
        port = port_of(self.daemon.url)
        follower = socket.socket()
        follower.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        follower.settimeout(20)  # dropped, the follower sees a reset long before
        follower.connect(("127.0.0.1", port))
        self.addCleanup(follower.close)
        follower.sendall(b"GET /engines/requests?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        content = "y" * 2**20
        for _ in range(12):  # each record 2 MiB: past what the sockets and MAX_HELD hold together
            code, _, _ = await self.post(
                "/engines/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": content}]}
            )
            self.assertEqual(code, 200)

        def drain() -> str:
            try:
                while follower.recv(2**20):
                    pass
            except ConnectionResetError:
                return "reset"
            except TimeoutError:
                return "still open"
            return "closed"

        self.assertIn(await deferToThread(drain), ("reset", "closed"))


class ConnectionCapTests(DaemonTestCase):
    config_text = "[http]\nmax_connections = 4\n"

    async def test_503_past_the_cap_and_room_again_after(self) -> None:
        await self.start()
        await eventually(lambda: self.daemon.site.connections == 0, 5)
        port = port_of(self.daemon.url)
        held = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(4)]
        self.addCleanup(lambda: [c.close() for c in held])
        for connection in held:
            self.assertEqual((await deferToThread(request, connection, "GET", "/health"))[0], 200)
        extra = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, body = await deferToThread(request, extra, "GET", "/version")  # /health would answer
        extra.close()
        self.assertEqual(status, 503)
        self.assertIn("max_connections", body["error"]["message"])
        held.pop().close()
        await eventually(lambda: self.daemon.site.connections <= 3, 5)
        again = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.addCleanup(again.close)
        self.assertEqual((await deferToThread(request, again, "GET", "/health"))[0], 200)


class BusyDoorTests(DaemonTestCase):
    async def test_health_and_chat_answer_beside_idle_and_trickling_clients(self) -> None:
        """500 idle sockets and 5 clients trickling their headers (bench/door.py times it)."""
        await self.start()
        port = port_of(self.daemon.url)

        def crowd() -> tuple[int, int, Any]:
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]
            tricklers = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
            try:
                for s in tricklers:
                    s.sendall(b"GET /health HTTP/1.1\r\nHo")
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                health = request(connection, "GET", "/health")[0]
                chat_status, reply = request(connection, "POST", "/engines/v1/chat/completions", CHAT)
                connection.close()
                return health, chat_status, reply
            finally:
                for s in idle + tricklers:
                    s.close()

        health, chat_status, reply = await deferToThread(crowd)
        self.assertEqual((health, chat_status), (200, 200))
        self.assertEqual(reply["choices"][0]["message"]["content"], "echo: hi")


class UnixSocketTests(TestCase):
    async def test_a_unix_socket_is_for_this_user_only(self) -> None:
        home = short_home(self)
        path = home / "api.sock"
        config = configuration.load(write_config(home, f'listen = "unix:{path}"'), environ={})
        service, _ = make_service(config, reactor)
        service.startService()
        self.addCleanup(lambda: ensureDeferred(_stop(service)))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)


async def _stop(service: Any) -> None:
    await service.stopService()


class TLSTests(TestCase):
    timeout = 60
    KEY = "sk-tls-test-key"

    async def test_the_openai_client_over_tls_with_a_key(self) -> None:
        home = short_home(self)
        pem = home / "daemon.pem"
        self_signed(pem)
        daemon = InProcessDaemon(write_config(home, f'[http]\napi_keys = ["{self.KEY}"]'), tls=pem)
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        trusted = ssl.create_default_context(cafile=str(pem))
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)

        def talk() -> tuple[str, list[str]]:
            with httpx2.Client(verify=trusted, headers={"Authorization": f"Bearer {self.KEY}"}) as client:
                client.post(f"{daemon.url}/models/load", params={"name": MODEL}, content=gguf.read_bytes())
            openai = OpenAI(
                base_url=daemon.url + "/v1",
                api_key=self.KEY,
                max_retries=0,
                http_client=httpx2.Client(verify=trusted, headers={"Connection": "close"}),
            )
            reply = openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "tls"}])
            models = [m.id for m in openai.models.list().data]
            wrong = openai.with_options(api_key="sk-wrong")
            try:
                wrong.models.list()
            except AuthenticationError as e:
                refused = e.status_code
            else:
                refused = 200
            openai.close()
            return f"{reply.choices[0].message.content} {refused}", models

        answer, models = await deferToThread(talk)
        self.assertEqual(answer, "echo: tls 401")
        self.assertIn(MODEL, models)


class CommandLineKeyTests(DaemonTestCase):
    KEY = "sk-cli-test-key"
    config_text = f'[http]\napi_keys = ["{KEY}"]\n'

    async def mrunner(self, *args: str, **env: str) -> tuple[int, str, str]:
        environ = {k: v for k, v in os.environ.items() if k != "MRUNNER_API_KEY"}
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, args, env={**environ, "MRUNNER_HOST": self.daemon.url, **env}, reactor=reactor
        )
        return code, out.decode(), err.decode()

    async def test_the_key_from_the_option_or_the_environment(self) -> None:
        await self.start()
        code, _, err = await self.mrunner("ls")
        self.assertEqual(code, 1)
        self.assertIn("--api-key", err)
        self.assertNotIn(self.KEY, err)
        code, out, _ = await self.mrunner("--api-key", self.KEY, "ls")
        self.assertEqual((code, MODEL.split(":")[0] in out), (0, True))
        code, out, _ = await self.mrunner("ls", MRUNNER_API_KEY=self.KEY)
        self.assertEqual((code, MODEL.split(":")[0] in out), (0, True))


EarlyLimitTestsTwistedHeads = with_twisted_heads(EarlyLimitTests)
HostilePeerTestsTwistedHeads = with_twisted_heads(HostilePeerTests)
FollowerTestsTwistedHeads = with_twisted_heads(FollowerTests)
BareLineFeedTestsTwistedHeads = with_twisted_heads(BareLineFeedTests)
ConnectionCapTestsTwistedHeads = with_twisted_heads(ConnectionCapTests)
BusyDoorTestsTwistedHeads = with_twisted_heads(BusyDoorTests)
CommandLineKeyTestsTwistedHeads = with_twisted_heads(CommandLineKeyTests)
