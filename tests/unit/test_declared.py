"""The front door's tables, derived from the routes' declarations, are the tables it had written out."""

from __future__ import annotations

import re

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mrunner import config as configuration
from mrunner.api.door import declared
from mrunner.api.door.declared import AUDIO_PATHS, MAX_AUDIO_FORM, MAX_CREATE_BODY, Reach
from mrunner.api.door.routing import Routes
from mrunner.api.door.trust import is_admin
from mrunner.api.errors import ErrorShape, anthropic_shape, ollama_shape, openai_shape, shape_for
from mrunner.api.manage.openapi import routed
from mrunner.config import HTTPConfig
from mrunner.tap import make_parts

METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS")
# Paths no route template gives: unknown ones, odd slashes, each API's edges.
EDGES = (
    b"",
    b"/",
    b"/models/",
    b"/models/x/y/z",
    b"/logs/x",
    b"/engines",
    b"/engines//unload",
    b"/engines/b/requests",
    b"/engines/unload/x",
    b"/engines/a/b/unload",
    b"/engines/b/v1/chat/completions",
    b"/api",
    b"/api/",
    b"/api/create",
    b"/api/pull/x",
    b"/api/v1/messages",
    b"/anthropic",
    b"/anthropic/",
    b"/anthropic/v1/x",
    b"/v1/messages/",
    b"/x/v1/messages/count_tokens",
    b"/nothing",
    b"/metrics/",
)


def today_is_admin(method: bytes, path: bytes) -> bool:
    """trust.is_admin as it was written out before the declarations."""
    segments = path.strip(b"/").split(b"/")
    first = segments[0]
    if first in (b"models", b"logs"):
        return first != b"models" or method not in (b"GET", b"HEAD")
    if first == b"engines":
        admin = {b"unload", b"_configure", b"_reload", b"_drain", b"requests", b"cache"}  # cache: issue 38
        return not admin.isdisjoint(segments[1:3])
    return (
        first == b"api"
        and len(segments) > 1
        and segments[1] in {b"pull", b"push", b"delete", b"copy", b"create"}
    )


def today_shape_for(path: bytes) -> ErrorShape:
    """errors.shape_for as it was written out before the declarations."""
    if path.startswith(b"/anthropic/") or path.rstrip(b"/").endswith(
        (b"/v1/messages", b"/v1/messages/count_tokens")
    ):
        return anthropic_shape
    if path.startswith(b"/api/"):
        return ollama_shape
    return openai_shape


class DeclaredTests(SynchronousTestCase):
    def setUp(self) -> None:
        config = configuration.load(None, overrides={"home": self.mktemp()}, environ={})
        root = make_parts(config, MemoryReactorClock()).site.resource
        assert isinstance(root, Routes)
        self.groups = root.groups
        self.door = root.door
        templates = {path for group in self.groups for _, path in routed(group)}
        self.paths = sorted({re.sub(r"\{[^}]+\}", "b", path).encode() for path in templates} | set(EDGES))

    def test_open_paths_and_metrics(self) -> None:
        self.assertEqual(
            self.door.open_paths, {b"/health", b"/ready", b"", b"/ui", b"/ui/app.js", b"/ui/style.css"}
        )
        self.assertEqual(self.door.metrics, b"/metrics")

    def test_admin_sets(self) -> None:
        ADMIN = self.door.admin
        self.assertEqual(dict(ADMIN.areas), {b"models": declared.Who.MANAGE, b"logs": declared.Who.ADMIN})
        self.assertEqual(
            ADMIN.engines, {b"unload", b"_configure", b"_reload", b"_drain", b"requests", b"cache"}
        )
        self.assertEqual(ADMIN.ollama, {b"pull", b"push", b"delete", b"copy", b"create"})

    def test_who_is_admin_on_every_route_as_before(self) -> None:
        for path in self.paths:
            for method in METHODS:
                self.assertEqual(
                    is_admin(method, path, self.door.admin), today_is_admin(method, path), (method, path)
                )

    def test_every_route_answers_errors_in_its_shape_as_before(self) -> None:
        for path in self.paths:
            self.assertIs(shape_for(path, self.door.shaped), today_shape_for(path), path)

    def test_body_limits_sinks_and_the_cap(self) -> None:
        http = HTTPConfig(max_load_bytes=12345)
        audio = {path.encode(): MAX_AUDIO_FORM for path in AUDIO_PATHS}
        self.assertEqual(
            self.door.limits(http), {b"/models/load": 12345, b"/models/create": MAX_CREATE_BODY, **audio}
        )
        self.assertEqual(len(audio), 6)
        self.assertEqual(MAX_CREATE_BODY, 64 * 1024)
        upload = object()
        self.assertEqual(self.door.sinks({"upload": upload}), {b"/models/load": upload})
        self.assertEqual(self.door.past_cap, {b"/health"})

    def test_every_declaration_names_a_routed_path(self) -> None:
        """A declaration for a path no route serves would guard nothing: each one's path is routed."""
        maps = [group.app.url_map.bind("localhost") for group in self.groups]
        for route in self.door.routes:
            path = route.path.replace("<backend>", "b")
            if route.reach is Reach.BELOW:
                path += "/x"
            self.assertTrue(any(_knows(url_map, path) for url_map in maps), route)


def _knows(url_map: object, path: str) -> bool:
    try:
        url_map.match(path, "GET")  # type: ignore[attr-defined]
    except MethodNotAllowed:
        return True
    except NotFound:
        return False
    return True
