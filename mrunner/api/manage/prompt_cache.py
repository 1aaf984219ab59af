"""C{GET /engines/cache} and C{DELETE /engines/cache}: the prompt cache's saved states, listed, removed."""

from __future__ import annotations

from typing import Any, Protocol

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.door.declared import Route, Who
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openapi import Piece, answer, json_content, operation, parameter
from mrunner.api.reading.bodies import query
from mrunner.names import parse


class SavedStates(Protocol):
    """The prompt cache's store (L{mrunner.cache.store.CacheStore}), as these routes see it."""

    def usage(self) -> tuple[int, int]: ...

    def listing(self) -> list[dict[str, Any]]: ...

    def clear(self, model: str | None) -> int: ...


STATE = {
    "type": "object",
    "required": ["model", "tokens", "bytes", "last_used", "key"],
    "properties": {
        "model": {"type": "string"},
        "tokens": {"type": "integer"},
        "bytes": {"type": "integer"},
        "last_used": {"type": "string", "description": "ISO 8601, UTC"},
        "key": {"type": ["string", "null"], "description": "the start of its key's SHA-256; null: no keys"},
    },
}
REMOVED = {"type": "object", "properties": {"removed": {"type": "integer"}}}
MODEL = parameter("model", "query", {"type": "string"}, "only this model's states (default: every one)")


class PromptCacheAPI:
    """The saved states, most recently used first, and their removal (all, or one model's)."""

    app = Klein()
    #: The prompt cache's states: whose prompts, when.
    door = (Route(Who.ADMIN, path="/engines/cache"),)
    handle_json_errors(app)

    def __init__(self, states: SavedStates) -> None:
        self._states = states

    def openapi(self) -> Piece:
        listed = {"200": answer("states", json_content({"type": "array", "items": STATE}))}
        return {
            "paths": {
                "/engines/cache": {
                    "get": operation(
                        "The prompt cache's saved slot states",
                        {"200": answer("states", json_content(listed))},
                    ),
                    "delete": operation(
                        "Remove the prompt cache's saved states",
                        {"200": answer("how many", json_content(REMOVED))},
                        parameters=[MODEL],
                    ),
                }
            }
        }

    @app.route("/engines/cache", methods=["GET"])
    def ls(self, request: IRequest) -> bytes:
        return json_body(request, self._states.listing())

    @app.route("/engines/cache", methods=["DELETE"])
    def rm(self, request: IRequest) -> bytes:
        model = query(request, "model")
        named = None if model is None else str(parse(model, "model"))
        return json_body(request, {"removed": self._states.clear(named)})
