"""Each route declared once, beside its handler: its Klein rule, its methods and its OpenAPI operation.

A route group wraps its Klein C{app} in one L{Documented} and decorates each
handler with L{Documented.route}, which gives Klein the paths and methods and
keeps the operation under the same paths. The group's OpenAPI piece
(L{Documented.openapi}) and the table of its hot routes (L{Documented.direct})
are read back from those declarations, so neither writes a path again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from types import MethodType
from typing import Any, TypeVar

import attrs
from klein import Klein
from twisted.web.resource import IResource

from mrunner.api.door.declared import Route
from mrunner.api.door.direct import Direct
from mrunner.api.door.released import released
from mrunner.api.door.route_group import Piece
from mrunner.api.errors import ErrorShape

F = TypeVar("F", bound=Callable[..., Any])
#: A route's OpenAPI operation, or what makes it from the route's OpenAPI path and methods.
Operation = Piece | Callable[[str, Sequence[str]], Piece]
#: Methods an OpenAPI document does not list: werkzeug answers them for every route.
IMPLICIT = frozenset(("HEAD", "OPTIONS"))
_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def template(rule: str) -> str:
    """A werkzeug rule as an OpenAPI path: C{/models/<path:name>} is C{/models/{name}}."""
    return _CONVERTER.sub(r"{\1}", rule)


def parameter(
    name: str, where: str, schema: Mapping[str, Any], description: str, required: bool = False
) -> Piece:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }


BACKEND = parameter("backend", "path", {"type": "string"}, "a backend name, e.g. llama.cpp")


def with_backend(path: str, op: Piece) -> Piece:
    """C{op}, with the C{backend} path parameter when C{path} has one."""
    if "{backend}" not in path:
        return op
    return {**op, "parameters": [BACKEND, *op.get("parameters", ())]}


class Documented:
    """The routes of one Klein app, each with its operation, and which of them are hot."""

    def __init__(self, app: Klein) -> None:
        self.app = app
        self._paths: dict[str, dict[str, Piece]] = {}
        self._hot: list[tuple[bytes, bytes, Callable[..., Any]]] = []
        #: The front door's facts of the routes declared with them (L{Route}), one per path.
        self.door: list[Route] = []

    def route(
        self,
        paths: str | Sequence[str],
        methods: str | Sequence[str],
        operation: Operation,
        *,
        hot: bool = False,
        door: Route | None = None,
        **rule: Any,
    ) -> Callable[[F], F]:
        """Route each of C{paths} (werkzeug rules) for C{methods} to the decorated handler, described by
        C{operation}, which gains the C{backend} parameter where the path names one.

        Several paths are the endpoints C{NAME_0}, C{NAME_1}, ...; C{rule} goes to werkzeug's C{Rule}.
        C{hot}: those of the paths that are fixed strings are rendered without Klein (L{direct}).
        C{door}: what the front door knows of each of the paths (who may call it, its body, its error
        shape), its path left out: L{mrunner.api.door.routing.Routes} gathers them into its L{Door}.
        """
        paths = [paths] if isinstance(paths, str) else list(paths)
        methods = [methods] if isinstance(methods, str) else list(methods)

        def decorate(handler: F) -> F:
            handler = released(handler)
            for i, path in enumerate(paths):
                endpoint = f"{handler.__name__}_{i}" if len(paths) > 1 else handler.__name__
                self.app.route(path, methods=methods, endpoint=endpoint, **rule)(handler)
                self._document(template(path).rstrip("/") or "/", methods, operation)
                if door is not None:
                    self.door.append(attrs.evolve(door, path=path))
                if hot and "<" not in path:
                    self._hot += [(method.encode(), path.lstrip("/").encode(), handler) for method in methods]
            return handler

        return decorate

    def _document(self, path: str, methods: Sequence[str], operation: Operation) -> None:
        made = with_backend(path, operation(path, methods) if callable(operation) else operation)
        for method in sorted(methods):  # in one order, however they were declared
            if method not in IMPLICIT:
                self._paths.setdefault(path, {})[method.lower()] = made

    def openapi(self) -> Piece:
        """The group's piece of the OpenAPI document: every route declared, under its path."""
        return {"paths": {path: dict(operations) for path, operations in self._paths.items()}}

    def direct(self, group: object, shape: ErrorShape) -> dict[tuple[bytes, bytes], IResource]:
        """By C{(method, path without its leading slash)}, a L{Direct} of C{group}'s handler of each hot
        route, answering errors in C{shape}."""
        hot = self._hot
        return {(method, path): Direct(MethodType(handler, group), shape) for method, path, handler in hot}
