"""The front door without sockets: each trust rule, early limit and connection rule through the channel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from mrunner import config as configuration
from mrunner.api.door.channel import SINK_READ_SIZE, Sink
from mrunner.api.door.site import GatedSite, private_listen
from mrunner.api.door.trust import Trust, beyond_loopback, is_admin, listen_host
from mrunner.config import ClusterConfig, Config, HTTPConfig
from mrunner.errors import PayloadTooLarge
from mrunner.proxy.forwarder import answer_fields, forwarded_headers
from mrunner.proxy.wire import Head
from mrunner.tap import make_service
from tests.support.door import daemon_door
from tests.support.parsers import with_twisted_heads

KEY = "sk-local-0123456789"
ADMIN_KEY = "sk-admin-9876543210"


class Recorder(Resource):
    """The routes behind the door: records what reached them."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bytes, bytes, bytes]] = []

    def render(self, request: Any) -> bytes:
        self.seen.append((request.method, request.uri, request.content.read()))
        if request.uri == b"/stream":
            request.write(b"an answer that never ends")
            return NOT_DONE_YET
        return b"reached"


def raw_request(
    method: str = "GET", path: str = "/v1/models", headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    fields = {"Host": "127.0.0.1:12434", **(headers or {})}
    if body and "Transfer-Encoding" not in fields:
        fields.setdefault("Content-Length", str(len(body)))
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value is not None)
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body


def parse(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *fields = head.split(b"\r\n")
    headers = {}
    for field in fields:
        name, _, value = field.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(status.split()[1]), headers, body


class GateTestCase(SynchronousTestCase):
    #: Which parser reads request heads ([http] head_parser); the door's tests run with each.
    head_parser = "httptools"

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.routes = Recorder()
        self.make()

    def make(
        self,
        max_request_bytes: int = 1000,
        listen: str = configuration.DEFAULT_LISTEN,
        sinks: dict[bytes, Sink] | None = None,
        open_metrics: bool = False,
        **http: Any,
    ) -> None:
        self.config = attrs.evolve(
            Config(),
            listen=listen,
            max_request_bytes=max_request_bytes,
            http=HTTPConfig(**{"head_parser": self.head_parser, **http}),
            cluster=ClusterConfig(open_metrics=open_metrics),
        )
        self.site = GatedSite(self.routes, self.config, self.clock, sinks, daemon_door())
        self.site.doStart()
        self.addCleanup(self.site.doStop)

    def connect(self, unix: bool = False) -> tuple[Any, StringTransport]:
        host = UNIXAddress(b"/run/api.sock") if unix else IPv4Address("TCP", "127.0.0.1", 12434)
        transport = StringTransport(hostAddress=host, peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel = self.site.buildProtocol(None)
        channel.makeConnection(transport)
        return channel, transport

    def send(self, data: bytes, unix: bool = False) -> tuple[int, dict[bytes, bytes], bytes]:
        channel, transport = self.connect(unix)
        self.routes.seen.clear()
        channel.dataReceived(data)
        return parse(transport.value())

    def get(self, path: str = "/v1/models", **headers: str) -> tuple[int, dict[bytes, bytes], bytes]:
        return self.send(raw_request("GET", path, {k.replace("_", "-"): v for k, v in headers.items()}))

    def assertRefused(
        self, answer: tuple[int, dict[bytes, bytes], bytes], status: int, *words: str
    ) -> dict[bytes, bytes]:
        code, headers, body = answer
        self.assertEqual(code, status, body)
        error = json.loads(body)["error"]
        self.assertEqual(set(error), {"message", "type", "code"})
        for word in words:
            self.assertIn(word, error["message"])
        self.assertEqual(headers[b"connection"], b"close")
        self.assertEqual(self.routes.seen, [], "a refused request reached the routes")
        return headers


class HostTests(GateTestCase):
    def test_loopback_names_with_any_port(self) -> None:
        for host in (
            "localhost",
            "localhost:80",
            "127.0.0.1",
            "127.0.0.1:12434",
            "[::1]",
            "[::1]:9",
            "127.1.2.3",
        ):
            self.assertEqual(self.get(Host=host)[0], 200, host)

    def test_other_hosts_are_refused(self) -> None:
        for host in ("evil.example", "evil.example:12434", "localhost.evil.example", "10.0.0.1"):
            self.assertRefused(self.get(Host=host), 403, repr(host), "allowed_hosts")

    def test_allowed_hosts_and_the_listen_address(self) -> None:
        self.make(allowed_hosts=("Desk.Example",), listen="tcp:12434:interface=192.168.1.5")
        for host in ("desk.example", "desk.example:12434", "192.168.1.5:12434"):
            self.assertEqual(self.get(Host=host)[0], 200, host)
        self.assertRefused(self.get(Host="192.168.1.6"), 403)

    def test_one_host_header_is_required(self) -> None:
        self.assertRefused(self.send(b"GET / HTTP/1.1\r\n\r\n"), 400, "Host")
        self.assertRefused(self.send(b"GET / HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n"), 400, "Host")

    def test_a_unix_socket_has_no_host_to_rebind(self) -> None:
        self.assertEqual(self.send(raw_request(headers={"Host": "anything"}), unix=True)[0], 200)

    def test_listen_host(self) -> None:
        self.assertEqual(listen_host("tcp:1:interface=127.0.0.2"), b"127.0.0.2")
        self.assertEqual(listen_host(r"tcp6:1:interface=\:\:1"), b"[::1]")
        self.assertEqual(listen_host("ssl:1:privateKey=k.pem:interface=10.1.1.1"), b"10.1.1.1")
        self.assertIsNone(listen_host("tcp:1:interface=0.0.0.0"))
        self.assertIsNone(listen_host("unix:/run/api.sock"))


class OriginTests(GateTestCase):
    def test_local_pages_are_allowed_with_cors_headers(self) -> None:
        for origin in (
            "http://localhost",
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "http://[::1]:5",
        ):
            code, headers, _ = self.get(Origin=origin)
            self.assertEqual(code, 200, origin)
            self.assertEqual(headers[b"access-control-allow-origin"], origin.encode())
            self.assertEqual(headers[b"vary"], b"Origin")

    def test_other_origins_are_refused_before_anything_happens(self) -> None:
        chat = raw_request(
            "POST",
            "/v1/chat/completions",
            {"Origin": "http://evil.example", "Content-Type": "text/plain"},
            b'{"model": "ai/smollm2"}',
        )
        headers = self.assertRefused(self.send(chat), 403, "http://evil.example", "cors_origins")
        self.assertNotIn(b"access-control-allow-origin", headers)
        for origin in ("https://localhost", "http://localhost.evil.example:80", "http://localhost:x", "null"):
            self.assertRefused(self.get(Origin=origin), 403)

    def test_configured_origins_and_the_star(self) -> None:
        self.make(cors_origins=("https://app.example",))
        self.assertEqual(self.get(Origin="https://app.example")[0], 200)
        self.assertRefused(self.get(Origin="http://localhost:3000"), 403)
        self.make(cors_origins=("*",))
        self.assertEqual(
            self.get(Origin="https://anyone.example")[1][b"access-control-allow-origin"],
            b"https://anyone.example",
        )

    def test_environment_adds_origins(self) -> None:
        loaded = configuration.load(None, environ={"MRUNNER_ORIGINS": "https://a.example, https://b.example"})
        self.assertEqual(loaded.http.cors_origins[-2:], ("https://a.example", "https://b.example"))

    def test_preflight_from_an_allowed_origin(self) -> None:
        code, headers, _ = self.send(
            raw_request(
                "OPTIONS",
                "/v1/chat/completions",
                {
                    "Origin": "http://localhost:3000",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            )
        )
        self.assertEqual(code, 204)
        self.assertEqual(headers[b"access-control-allow-origin"], b"http://localhost:3000")
        self.assertIn(b"POST", headers[b"access-control-allow-methods"])
        self.assertEqual(headers[b"access-control-allow-headers"], b"authorization, content-type")
        self.assertEqual(headers[b"access-control-max-age"], b"600")
        self.assertEqual(self.routes.seen, [])

    def test_preflight_from_another_origin(self) -> None:
        preflight = raw_request("OPTIONS", "/v1/models", {"Origin": "http://evil.example"})
        self.assertRefused(self.send(preflight), 403)

    def test_a_key_is_never_relayed_to_a_runner(self) -> None:
        client = Headers(
            {b"Authorization": [f"Bearer {KEY}".encode()], b"x-api-key": [KEY.encode()], b"a": [b"b"]}
        )
        self.assertEqual(dict(forwarded_headers(client).getAllRawHeaders()), {b"A": [b"b"]})

    def test_a_runners_cors_headers_never_reach_the_client(self) -> None:
        head = Head(
            b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: http://evil.example\r\n"
            b"Access-Control-Allow-Credentials: true\r\nContent-Type: application/json\r\nContent-Length: 2",
            b"POST",
        )
        self.assertEqual(list(answer_fields(head)), [(b"Content-Type", b"application/json")])

    def test_a_runners_cors_headers_are_never_relayed(self) -> None:
        runner = Headers(
            {
                b"access-control-allow-origin": [b"http://evil.example"],
                b"Access-Control-Allow-Credentials": [b"true"],
                b"content-type": [b"application/json"],
            }
        )
        self.assertEqual(
            dict(forwarded_headers(runner).getAllRawHeaders()), {b"Content-Type": [b"application/json"]}
        )


class KeyTests(GateTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.make(api_keys=(KEY,))

    def test_no_key_or_a_wrong_one(self) -> None:
        headers = self.assertRefused(self.get(), 401, "Authorization: Bearer")
        self.assertEqual(headers[b"www-authenticate"], b'Bearer realm="mrunner"')
        self.assertRefused(self.get(Authorization="Bearer nope"), 401, "not valid")
        self.assertRefused(self.get(x_api_key=KEY[:-1]), 401)
        self.assertRefused(self.get(Authorization=f"Basic {KEY}"), 401)

    def test_the_key_as_openai_and_anthropic_clients_send_it(self) -> None:
        self.assertEqual(self.get(Authorization=f"Bearer {KEY}")[0], 200)
        self.assertEqual(self.get(Authorization=f"bearer {KEY}")[0], 200)
        self.assertEqual(self.get(x_api_key=KEY)[0], 200)

    def test_health_and_ready_stay_open(self) -> None:
        """Probes (a kubelet's, a router's) carry no key."""
        self.assertEqual(self.get("/health")[0], 200)
        self.assertEqual(self.get("/health/")[0], 200)
        self.assertEqual(self.get("/ready")[0], 200)
        self.assertRefused(self.get("/healthz"), 401)

    def test_metrics_are_open_only_when_the_cluster_says_so(self) -> None:
        """The inference extension's endpoint picker scrapes /metrics and cannot send a key."""
        self.assertRefused(self.get("/metrics"), 401)
        self.make(api_keys=(KEY,), open_metrics=True)
        self.assertEqual(self.get("/metrics")[0], 200)
        self.assertRefused(self.get("/v1/models"), 401)

    def test_a_refusal_to_an_allowed_page_can_be_read_by_it(self) -> None:
        headers = self.assertRefused(self.get(Origin="http://localhost:3000"), 401)
        self.assertEqual(headers[b"access-control-allow-origin"], b"http://localhost:3000")

    def test_a_preflight_needs_no_key(self) -> None:
        preflight = raw_request("OPTIONS", "/v1/models", {"Origin": "http://localhost:3000"})
        self.assertEqual(self.send(preflight)[0], 204)

    def test_api_keys_alone_reach_every_route(self) -> None:
        for path in ("/models", "/engines/unload", "/logs"):
            self.assertEqual(self.get(path, x_api_key=KEY)[0], 200, path)

    def test_admin_keys_alone_reach_the_admin_routes(self) -> None:
        self.make(api_keys=(KEY,), admin_api_keys=(ADMIN_KEY,))
        for path in (
            "/engines/unload",
            "/engines/_configure",
            "/engines/llama.cpp/_configure",
            "/engines/_reload",
            "/engines/_drain",
            "/logs?follow=true",
        ):
            self.assertRefused(self.get(path, x_api_key=KEY), 403, "admin_api_keys")
            self.assertEqual(self.get(path, x_api_key=ADMIN_KEY)[0], 200, path)
        for method, path in (("POST", "/%6Dodels/create"), ("DELETE", "/models/ai/smollm2")):
            request = raw_request(method, path, {"x-api-key": KEY, "content-length": "0"})
            self.assertRefused(self.send(request), 403, "admin_api_keys")
        self.routes.seen.clear()
        # Reading is not managing: any key lists the models (the routes show it those it may use).
        for path in (
            "/v1/models",
            "/engines/ps",
            "/engines/llama.cpp/v1/models",
            "/models",
            "/models/ai/smollm2",
            "/engines/usage",
        ):
            self.assertEqual(self.get(path, x_api_key=KEY)[0], 200, path)
            self.assertEqual(self.get(path, x_api_key=ADMIN_KEY)[0], 200, path)

    def test_admin_keys_without_api_keys_guard_only_the_admin_routes(self) -> None:
        self.make(admin_api_keys=(ADMIN_KEY,))
        self.assertEqual(self.get("/v1/models")[0], 200)
        self.routes.seen.clear()
        self.assertRefused(self.get("/logs"), 401)

    def test_admin_routes(self) -> None:
        self.assertFalse(is_admin(b"GET", b"/models/ai/x", daemon_door().admin))
        self.assertFalse(is_admin(b"HEAD", b"/models", daemon_door().admin))
        self.assertTrue(is_admin(b"DELETE", b"/models/ai/x", daemon_door().admin))
        for path in (
            b"/models",
            b"/models/x/push",
            b"/logs",
            b"/engines/unload",
            b"/engines//unload",
            b"/engines/b/_configure",
            b"/engines/_reload",
            b"/api/pull",
            b"/api/delete",
        ):
            self.assertTrue(is_admin(b"POST", path, daemon_door().admin), path)
        for path in (
            b"/health",
            b"/v1/models",
            b"/engines/ps",
            b"/engines/b/v1/chat/completions",
            b"/api/chat",
        ):
            self.assertFalse(is_admin(b"GET", path, daemon_door().admin), path)

    def test_environment_adds_a_key(self) -> None:
        loaded = configuration.load(None, environ={"MRUNNER_API_KEY": KEY})
        self.assertEqual(loaded.http.api_keys[-1], KEY)

    def test_a_key_is_never_logged(self) -> None:
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        self.get(Authorization="Bearer sk-wrong-key-abcdef")
        self.get(Authorization=f"Bearer {KEY}")
        text = repr(self.config) + str(self.config) + repr(events)
        self.assertNotIn(KEY, text)
        self.assertNotIn("sk-wrong-key-abcdef", text)

    def test_keys_must_be_a_list(self) -> None:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(f'[http]\napi_keys = "{KEY}"\n')
        with self.assertRaises(configuration.ConfigError) as caught:
            configuration.load(path, environ={})
        self.assertIn("http.api_keys", str(caught.exception))

    def test_configure_swaps_the_rules_for_new_requests(self) -> None:
        self.site.configure(attrs.evolve(self.config, http=HTTPConfig()))
        self.assertEqual(self.get()[0], 200)
        self.site.configure(self.config)
        self.routes.seen.clear()
        self.assertRefused(self.get(), 401)

    def test_a_reload_swaps_the_rules_but_not_the_listen_address_nor_the_body_limit(self) -> None:
        self.make(listen="tcp:12434:interface=192.168.1.5")
        reread = attrs.evolve(
            self.config,
            listen="tcp:12434:interface=192.168.1.6",
            max_request_bytes=1,
            http=HTTPConfig(api_keys=(KEY,)),
        )
        parts = make_service(attrs.evolve(self.config, home=Path(self.mktemp())), self.clock, lambda: reread)[
            1
        ]
        parts.reloader.reload()
        self.site = parts.site
        self.assertRefused(self.get(), 401)
        self.assertEqual(self.get(Host="192.168.1.5", x_api_key=KEY)[0], 200)
        self.assertEqual(self.site.trust.body_limit(b"/v1/embeddings", 1000), 1000)


class BodyLimitTests(GateTestCase):
    def test_413_as_soon_as_the_length_is_known(self) -> None:
        channel, transport = self.connect()
        head = raw_request(
            "POST", "/v1/chat/completions", {"Content-Length": "50000000", "Expect": "100-continue"}
        )
        channel.dataReceived(head)
        code, headers, body = parse(transport.value())
        self.assertNotIn(b"100 Continue", transport.value())
        self.assertRefused((code, headers, body), 413, "50000000", "1000")
        channel.dataReceived(b"x" * 100_000)  # what the client still sends is dropped
        self.assertEqual(self.routes.seen, [])

    def test_every_route_has_a_limit(self) -> None:
        self.assertRefused(self.send(raw_request("GET", "/health", body=b"x" * 1001)), 413)

    def test_routes_limits(self) -> None:
        self.make(max_request_bytes=10_000, max_load_bytes=100_000)
        trust = Trust(self.config, daemon_door())
        self.assertEqual(trust.body_limit(b"/models/load?name=x", 100_000), 100_000)
        self.assertEqual(trust.body_limit(b"/models/load/", None), 100_000)
        self.assertEqual(trust.body_limit(b"/v1/chat/completions", None), 10_000)
        self.assertEqual(trust.body_limit(b"/models/create", None), 64 * 1024)
        audio = b"/engines/whisper.cpp/v1/audio/transcriptions"  # declared as /engines/<backend>/...
        self.assertEqual(trust.body_limit(audio, None), 25 * 1024 * 1024 + 64 * 1024)
        for target, length in [
            (b"/models/load", 100_001),
            (b"/v1/embeddings", 10_001),
            (b"/models/create", 70_000),
        ]:
            self.assertRaises(PayloadTooLarge, trust.body_limit, target, length)

    def test_a_chunked_body_stops_at_the_limit(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/v1/chat/completions", {"Transfer-Encoding": "chunked"}))
        channel.dataReceived(b"258\r\n" + b"x" * 600 + b"\r\n")
        self.assertEqual(transport.value(), b"")
        channel.dataReceived(b"258\r\n" + b"x" * 600 + b"\r\n" + b"258\r\n" + b"x" * 600 + b"\r\n0\r\n\r\n")
        self.assertRefused(parse(transport.value()), 413, "limit")

    def test_a_body_under_the_limit_reaches_the_route(self) -> None:
        code, _, body = self.send(raw_request("POST", "/v1/chat/completions", body=b"{}"))
        self.assertEqual((code, body), (200, b"reached"))
        self.assertEqual(self.routes.seen, [(b"POST", b"/v1/chat/completions", b"{}")])


class UnreadableRequestTests(GateTestCase):
    """What twisted.web's parser would drop unanswered gets a status and a JSON error, then the close."""

    def assertAnswered(self, data: bytes, status: int, *words: str) -> StringTransport:
        channel, transport = self.connect()
        self.routes.seen.clear()
        channel.dataReceived(data)
        self.assertRefused(parse(transport.value()), status, *words)
        channel.dataReceived(raw_request())  # what follows is no next request
        self.assertEqual(parse(transport.value())[0], status)
        self.clock.advance(self.config.http.header_timeout)
        self.assertTrue(transport.disconnected)
        return transport

    def test_a_request_line_past_the_limit_is_414(self) -> None:
        self.assertAnswered(b"GET /" + b"a" * 2**20 + b" HTTP/1.1\r\n", 414, "request line")

    def test_a_header_line_past_the_limit_is_431(self) -> None:
        self.assertAnswered(raw_request(headers={"X-Big": "a" * 2**20}), 431, "headers")

    def test_headers_past_the_limit_together_are_431(self) -> None:
        many = {f"X-{n}": "a" * 1000 for n in range(20)}
        self.assertAnswered(raw_request(headers=many), 431, "headers")
        self.assertAnswered(raw_request(headers={f"X-{n}": "" for n in range(600)}), 431, "500 headers")

    def test_a_content_length_of_5000_digits_is_400(self) -> None:
        self.assertAnswered(
            raw_request("POST", headers={"Content-Length": "9" * 5000}), 400, "Content-Length"
        )

    def test_a_chunk_size_of_40_digits_is_400(self) -> None:
        head = raw_request("POST", "/v1/chat/completions", {"Transfer-Encoding": "chunked"})
        self.assertAnswered(head + b"f" * 40 + b"\r\nxx", 400, "chunk size", "hex digits")

    def test_a_malformed_chunk_or_header_is_400(self) -> None:
        head = raw_request("POST", "/v1/chat/completions", {"Transfer-Encoding": "chunked"})
        self.assertAnswered(head + b"zz\r\n", 400, "chunked body")
        self.assertAnswered(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400, "HTTP/1.1")
        self.assertAnswered(b"GET\r\n\r\n", 400, "HTTP/1.1")

    def test_a_method_is_case_sensitive(self) -> None:
        for method in ("post", "Get", "PATCH", "BREW"):
            headers = self.assertRefused(
                self.send(raw_request(method, "/v1/chat/completions", body=b"{}")), 405, repr(method)
            )
            self.assertEqual(headers[b"allow"], b"DELETE, GET, HEAD, OPTIONS, POST, PUT")

    def test_a_body_sent_with_its_refused_headers_is_dropped_and_reading_goes_on(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/v1/chat/completions", body=b"x" * 300_000))
        self.assertRefused(parse(transport.value()), 413, "300000")
        self.assertEqual(transport.producerState, "producing")  # twisted.web would have paused reading
        channel.dataReceived(b"x" * 100_000)
        self.assertEqual(transport.producerState, "producing")
        self.assertFalse(transport.disconnected)
        self.clock.advance(self.config.http.header_timeout)
        self.assertTrue(transport.disconnected)


class Body:
    """A sink's body: records what is written to it, and whether it was closed."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def tell(self) -> int:
        return len(self.data)

    def seek(self, offset: int, whence: int = 0) -> None:
        pass

    def read(self) -> bytes:
        return self.data

    def close(self) -> None:
        self.closed = True


class SinkTests(GateTestCase):
    """A route with a sink gets its body as the bytes arrive, not from twisted.web's temporary file."""

    def setUp(self) -> None:
        super().setUp()
        self.bodies: list[Body] = []
        self.make(max_request_bytes=100, max_load_bytes=10_000, sinks={b"/models/load": self.sink})

    def sink(self, request: Any) -> Body:
        self.bodies.append(Body())
        return self.bodies[-1]

    def test_the_body_reaches_the_sink_as_it_arrives(self) -> None:
        channel, transport = self.connect()
        transport.bufferSize = 65536  # as a socket's transport says how much it reads
        channel.dataReceived(raw_request("POST", "/models/%6coad?name=x", {"Content-Length": "2000"}))
        self.assertEqual(transport.bufferSize, SINK_READ_SIZE)
        channel.dataReceived(b"a" * 1500)
        [body] = self.bodies
        self.assertEqual((body.data, self.routes.seen), (b"a" * 1500, []))
        channel.dataReceived(b"b" * 500)
        self.assertEqual(self.routes.seen, [(b"POST", b"/models/%6coad?name=x", b"a" * 1500 + b"b" * 500)])
        self.assertEqual(parse(transport.value())[0], 200)
        self.assertEqual(transport.bufferSize, 65536)
        self.assertTrue(body.closed)

    def test_a_chunked_body_reaches_the_sink_and_stops_at_the_limit(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/models/load", {"Transfer-Encoding": "chunked"}))
        channel.dataReceived(b"1770\r\n" + b"x" * 6000 + b"\r\n")
        self.assertEqual(len(self.bodies[0].data), 6000)
        channel.dataReceived(b"1770\r\n" + b"x" * 6000 + b"\r\n0\r\n\r\n")
        self.assertRefused(parse(transport.value()), 413, "limit")
        self.assertTrue(self.bodies[0].closed)

    def test_a_lost_connection_closes_the_sink(self) -> None:
        channel, _ = self.connect()
        channel.dataReceived(raw_request("POST", "/models/load", {"Content-Length": "2000"}) + b"a" * 10)
        channel.connectionLost(Failure(ConnectionDone()))
        self.assertTrue(self.bodies[0].closed)
        self.assertEqual(self.routes.seen, [])

    def test_a_refused_request_makes_no_sink(self) -> None:
        for headers, status in [({"Content-Length": "20000"}, 413), ({"Host": "evil.example"}, 403)]:
            self.assertRefused(self.send(raw_request("POST", "/models/load", headers, b"x")), status)
        self.assertEqual(self.bodies, [])

    def test_other_routes_and_methods_keep_twisted_webs_file(self) -> None:
        for method, path in [("POST", "/v1/chat/completions"), ("PUT", "/models/load"), ("POST", "/models")]:
            code, _, _ = self.send(raw_request(method, path, body=b"{}"))
            self.assertEqual((code, self.routes.seen), (200, [(method.encode(), path.encode(), b"{}")]))
        self.assertEqual(self.bodies, [])


class ConnectionTests(GateTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.make(header_timeout=4.0, min_body_rate=100, idle_timeout=60.0, max_connections=2)

    def test_headers_must_come_within_the_deadline(self) -> None:
        channel, transport = self.connect()
        for byte in iter(raw_request()[:30]):
            channel.dataReceived(bytes([byte]))
            self.clock.advance(0.5)
            if transport.disconnected:
                break
        self.assertTrue(transport.disconnected)
        self.assertLessEqual(self.clock.seconds(), 4.0 + 1.5)
        self.assertEqual(self.routes.seen, [])

    def test_a_body_must_keep_its_rate(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/v1/chat/completions", {"Content-Length": "900"}))
        for _ in range(20):
            channel.dataReceived(b"x" * 10)
            self.clock.advance(1)
        self.assertTrue(transport.disconnected)
        self.assertEqual(self.routes.seen, [])

    def test_a_body_at_its_rate_is_served(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/v1/chat/completions", {"Content-Length": "900"}))
        for _ in range(6):  # 150 bytes/s, over the minimum of 100
            self.clock.advance(1)
            channel.dataReceived(b"x" * 150)
        self.assertFalse(transport.disconnected)
        self.assertEqual(parse(transport.value())[0], 200)

    def test_idle_connections_close(self) -> None:
        _, idle_transport = self.connect()
        self.clock.advance(59)
        self.assertFalse(idle_transport.disconnecting)
        self.clock.advance(2)
        self.assertTrue(idle_transport.disconnecting)

    def test_a_connection_past_the_cap_gets_503(self) -> None:
        self.connect()
        self.connect()
        headers = self.assertRefused(self.get(), 503, "max_connections")
        self.assertEqual(headers[b"retry-after"], b"1")

    def test_health_answers_past_the_cap_then_closes(self) -> None:
        self.connect()
        self.connect()
        code, headers, _ = self.get("/health")
        self.assertEqual((code, headers[b"connection"]), (200, b"close"))
        self.assertEqual(self.routes.seen, [(b"GET", b"/health", b"")])

    def test_a_client_that_reads_nothing_of_its_answer_is_cut_off(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request(path="/stream"))
        channel.pauseProducing()  # as the transport does when the client's socket takes no more
        self.clock.advance(59)
        channel.resumeProducing()
        self.clock.advance(59)
        self.assertFalse(transport.disconnected)
        channel.pauseProducing()
        self.clock.advance(62)
        self.assertTrue(transport.disconnected)

    def test_closed_connections_free_their_place(self) -> None:
        first, _ = self.connect()
        self.connect()
        first.connectionLost(None)
        self.assertEqual(self.get()[0], 200)

    def test_a_refused_connection_lingers_then_closes(self) -> None:
        channel, transport = self.connect()
        channel.dataReceived(raw_request("POST", "/v1/chat/completions", {"Content-Length": "50000"}))
        self.assertEqual(parse(transport.value())[0], 413)
        self.assertFalse(transport.disconnected)
        self.clock.advance(5)
        self.assertTrue(transport.disconnected)


class ListenTests(SynchronousTestCase):
    def test_beyond_loopback(self) -> None:
        for listen in (
            "tcp:12434",
            "tcp:1:interface=0.0.0.0",
            "ssl:1:interface=192.168.1.5",
            r"tcp6:1:interface=\:\:",
        ):
            self.assertTrue(beyond_loopback(listen), listen)
        for listen in (
            "tcp:1:interface=127.0.0.1",
            r"tcp6:1:interface=\:\:1",
            "unix:/run/a.sock",
            "tcp:1:interface=localhost",
        ):
            self.assertFalse(beyond_loopback(listen), listen)

    def test_listening_beyond_loopback_without_keys_is_warned_of(self) -> None:
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        for keys in ((), ("k",)):
            GatedSite(
                Recorder(), attrs.evolve(Config(), listen="tcp:12434", http=HTTPConfig(api_keys=keys)), None
            )
        self.assertEqual(
            [e["listen"] for e in events if "api_keys" in e.get("log_format", "")], ["tcp:12434"]
        )

    def test_a_unix_socket_is_private_unless_a_mode_is_given(self) -> None:
        self.assertEqual(private_listen("unix:/run/api.sock"), "unix:/run/api.sock:mode=600")
        self.assertEqual(private_listen("unix:/run/api.sock:mode=660"), "unix:/run/api.sock:mode=660")
        self.assertEqual(private_listen("tcp:12434"), "tcp:12434")


HostTestsTwistedHeads = with_twisted_heads(HostTests)
OriginTestsTwistedHeads = with_twisted_heads(OriginTests)
KeyTestsTwistedHeads = with_twisted_heads(KeyTests)
BodyLimitTestsTwistedHeads = with_twisted_heads(BodyLimitTests)
UnreadableRequestTestsTwistedHeads = with_twisted_heads(UnreadableRequestTests)
SinkTestsTwistedHeads = with_twisted_heads(SinkTests)
ConnectionTestsTwistedHeads = with_twisted_heads(ConnectionTests)
