"""L{Documented}: a route declared once is Klein's route, the document's operation and, hot, a direct one."""

from __future__ import annotations

import json
from pathlib import Path

from klein import Klein
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.iweb import IRequest

from mrunner import config as configuration
from mrunner.api.documented import BACKEND, Documented
from mrunner.api.door.direct import Direct
from mrunner.api.door.routing import Routes
from mrunner.api.errors import handle_json_errors, json_body, ollama_shape
from mrunner.api.manage.openapi import described, document, routed
from mrunner.api.openai.routes import InferenceAPI
from mrunner.api.openapi import answer, operation
from mrunner.tap import make_parts

ECHO = operation("Echo", {"200": answer("what was asked")})


def by_path(path: str, methods: object) -> dict:
    """An operation made for its route: summarised by its OpenAPI path."""
    return operation(path, {"200": answer("done")})


class Echo:
    """A route group of two declared routes, one of them hot."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, name: str) -> None:
        self.name = name

    def openapi(self) -> dict:
        return self.routes.openapi()

    def direct(self) -> dict:
        return self.routes.direct(self, ollama_shape)

    @routes.route(["/echo", "/engines/<backend>/echo"], ["GET", "POST"], ECHO, hot=True)
    def echo(self, request: IRequest, backend: str | None = None) -> bytes:
        return json_body(request, {"name": self.name, "backend": backend})

    @routes.route(
        "/things/<path:thing>", "DELETE", lambda path, methods: operation(path, {"200": answer("")})
    )
    def delete(self, request: IRequest, thing: str) -> bytes:
        return json_body(request, {"deleted": thing})


class DocumentedTests(SynchronousTestCase):
    def test_each_route_is_in_the_document_with_its_methods(self) -> None:
        group = Echo("one")
        doc = document([group])
        self.assertEqual(
            described(doc),
            {
                ("GET", "/echo"),
                ("POST", "/echo"),
                ("GET", "/engines/{backend}/echo"),
                ("POST", "/engines/{backend}/echo"),
                ("DELETE", "/things/{thing}"),
            },
        )
        self.assertEqual(described(doc), routed(group), "the document is what Klein routes")
        self.assertEqual(doc["paths"]["/echo"]["get"]["summary"], "Echo")
        self.assertNotIn("parameters", doc["paths"]["/echo"]["get"])
        self.assertEqual(doc["paths"]["/engines/{backend}/echo"]["post"]["parameters"], [BACKEND])
        self.assertEqual(doc["paths"]["/things/{thing}"]["delete"]["summary"], "/things/{thing}")

    def test_the_routes_are_klein_routes(self) -> None:
        http = StubTreq(Routes([Echo("one")]))
        response = self.successResultOf(http.delete("http://mrunner/things/a/b"))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual((response.code, body), (200, {"deleted": "a/b"}))
        response = self.successResultOf(http.post("http://mrunner/engines/llama.cpp/echo"))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual(body, {"name": "one", "backend": "llama.cpp"})

    def test_a_hot_route_is_direct_where_its_path_is_fixed(self) -> None:
        group = Echo("two")
        direct = group.direct()
        self.assertEqual(set(direct), {(b"GET", b"echo"), (b"POST", b"echo")})
        self.assertTrue(all(isinstance(resource, Direct) for resource in direct.values()))
        http = StubTreq(direct[b"POST", b"echo"])
        response = self.successResultOf(http.post("http://mrunner/echo"))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual(body, {"name": "two", "backend": None}, "the handler is the group's")

    def test_the_daemons_direct_table_is_its_hot_routes(self) -> None:
        """The inference routes without a backend in their path, each one a route Klein has too."""
        home = Path(self.mktemp())
        config = configuration.load(None, overrides={"home": str(home)}, environ={})
        groups = make_parts(config, MemoryReactorClock()).site.resource.groups
        (inference,) = (group for group in groups if isinstance(group, InferenceAPI))
        direct = set(inference.direct())
        self.assertIn((b"POST", b"v1/chat/completions"), direct)
        self.assertIn((b"POST", b"engines/v1/embeddings"), direct)
        self.assertIn((b"POST", b"rerank"), direct)
        self.assertEqual(len(direct), 12)
        served = {(method.encode(), path.lstrip("/").encode()) for method, path in routed(inference)}
        self.assertLessEqual(direct, served)
