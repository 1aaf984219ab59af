"""Ollama's model routes under C{/api}: the store as Ollama shows it, and pull, push, copy and delete.

Pull, push and delete are L{ModelOperations}', as C{/models} does them; what is
Ollama's here is the shape: status lines (or one object with C{"stream": false})
and C{{"error": "..."}}. Every other C{/api} path gets a 404 naming the served ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.aliases import Aliases
from mrunner.api.compat.ollama import shapes as shapes
from mrunner.api.compat.openapi import ANY_METHOD, OLLAMA_ERROR, OLLAMAS, compat_operation
from mrunner.api.documented import Documented
from mrunner.api.door.callers import caller
from mrunner.api.door.declared import MAX_CREATE_BODY, Reach, Route, Who
from mrunner.api.errors import MethodNotAllowed, handle_json_errors, json_body, ollama_shape
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.manage.models import NDJSONStream
from mrunner.api.openapi import Piece
from mrunner.api.reading.bodies import json_object, read_body
from mrunner.errors import BadRequest, MrunnerError, NotFound
from mrunner.interfaces import IModelStoreAdmin, IProgress, IScheduler
from mrunner.names import parse
from mrunner.teams.access import check_usable, may_use, visible
from mrunner.values.model import Model

#: The Ollama API version these routes follow; clients check it to enable features.
OLLAMA_VERSION = "0.12.0"
#: Ollama's C{expires_at} for a model kept loaded for ever.
EXPIRES_NEVER = "2318-01-01T00:00:00Z"
SERVED = (
    "version",
    "tags",
    "ps",
    "show",
    "chat",
    "generate",
    "embed",
    "embeddings",
    "pull",
    "push",
    "copy",
    "delete",
)

Transfer = Callable[[IProgress], Coroutine[Any, Any, None]]


class OllamaModelsAPI:
    """C{/api/{version,tags,ps,show,pull,push,copy,delete}}, and a 404 for the routes mrunner lacks.

    After L{OllamaAPI} in the route groups: its catch-all would otherwise answer the generation routes.
    """

    app = Klein()
    handle_json_errors(app, ollama_shape)
    routes = Documented(app)
    #: Ollama's API, its model management (served or not) for admins.
    door = (
        Route(reach=Reach.BELOW, shape="ollama", path="/api"),
        *(
            Route(Who.ADMIN, shape="ollama", path=f"/api/{name}")
            for name in ("pull", "push", "delete", "copy", "create")
        ),
    )
    log = Logger()

    def __init__(
        self,
        store: IModelStoreAdmin,
        operations: ModelOperations,
        scheduler: IScheduler,
        aliases: Aliases | None = None,
    ):
        self._store = store
        self._aliases = aliases or Aliases({}, store)
        self._operations = operations
        self._scheduler = scheduler

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/api/<path:rest>",
        ANY_METHOD,
        compat_operation("Other Ollama routes: a 404 naming them", OLLAMA_ERROR),
    )
    def unserved(self, request: IRequest, rest: str) -> bytes:
        if rest in SERVED:
            raise MethodNotAllowed(f"{request.method.decode()} /api/{rest}: method not allowed")
        raise NotFound(
            f"Ollama's /api/{rest} is not served by mrunner; served: {', '.join(f'/api/{r}' for r in SERVED)}"
        )

    @routes.route("/api/version", "GET", OLLAMAS)
    def version(self, request: IRequest) -> bytes:
        return json_body(request, {"version": OLLAMA_VERSION})

    @routes.route("/api/tags", "GET", OLLAMAS)
    def tags(self, request: IRequest) -> bytes:
        """The models the key may use (L{visible}), and the aliases of those."""
        member = caller(request).member
        models = [entry for model in visible(member, self._store.list()) for entry in _entries(model)]
        for alias, model in self._aliases.listed():
            if may_use(member, model):
                models.append(_entries(model)[0] | {"name": alias, "model": alias, "alias_of": model.name})
        return json_body(request, {"models": models})

    @routes.route("/api/ps", "GET", OLLAMAS)
    def ps(self, request: IRequest) -> bytes:
        models = []
        member = caller(request).member
        for runner in self._scheduler.snapshot():
            try:
                model = self._store.resolve(runner.model_id)
            except NotFound:  # deleted while its runner stops
                continue
            if not may_use(member, model):
                continue
            expires = None if runner.expires_at is None else shapes.timestamp(runner.expires_at)
            models.append(
                {
                    **_entries(model)[0],
                    "name": model.name,  # the one name that stands for a runner's model (Model.name)
                    "model": model.name,
                    "expires_at": expires or EXPIRES_NEVER,
                    "size": runner.memory or _size(model),
                    "size_vram": 0,
                    "context_length": runner.context.in_force,
                }
            )
        return json_body(request, {"models": models})

    @routes.route("/api/show", "POST", OLLAMAS)
    def show(self, request: IRequest) -> bytes:
        name = shapes.named_model(_payload(request))
        check_usable(caller(request).member, self._store, name)
        model = self._store.resolve(name)
        capabilities = ["completion", *(["vision"] if "mmproj" in model.files else [])]
        return json_body(
            request,
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": shapes.model_details(model.config),
                "model_info": {"general.architecture": model.config.get("architecture", "")},
                "capabilities": capabilities,
                "modified_at": shapes.timestamp(model.created),
            },
        )

    @routes.route("/api/copy", "POST", OLLAMAS)
    def copy(self, request: IRequest) -> bytes:
        payload = _payload(request)
        source, destination = payload.get("source"), payload.get("destination")
        if not isinstance(source, str) or not isinstance(destination, str):
            raise BadRequest("give 'source' and 'destination' model names")
        self._store.tag(source, destination)
        return json_body(request, {"status": "success"})

    @routes.route("/api/delete", "DELETE", OLLAMAS)
    async def delete(self, request: IRequest) -> bytes:
        """Remove a name; the model itself only when no other name still uses it."""
        await self._operations.delete(shapes.named_model(_payload(request)), force=True)
        return json_body(request, {"status": "success"})

    @routes.route("/api/pull", "POST", OLLAMAS)
    def pull(self, request: Request) -> Deferred[bytes]:
        payload = _payload(request)
        ref = parse(shapes.named_model(payload))
        return Deferred.fromCoroutine(
            self._transfer(request, payload, "pull", partial(self._operations.pull, ref))
        )

    @routes.route("/api/push", "POST", OLLAMAS)
    def push(self, request: Request) -> Deferred[bytes]:
        payload = _payload(request)
        ref = self._operations.pushable(shapes.named_model(payload))
        return Deferred.fromCoroutine(
            self._transfer(request, payload, "push", partial(self._operations.push, ref))
        )

    async def _transfer(self, request: Request, payload: dict[str, Any], mode: str, work: Transfer) -> bytes:
        """The pull or push C{/models} does, reported as Ollama's status lines (or one at the end)."""
        verb = f"{mode}ing"
        if payload.get("stream") is False:
            await work(self._operations.progress(lambda line: None, mode))
            return json_body(request, {"status": "success"})
        lines = NDJSONStream(request)
        lines.emit({"status": f"{verb} manifest"})

        def emit(line: dict[str, Any]) -> None:
            if line["type"] == "progress":
                layer = line["layer"]
                status = f"{verb} {layer['id'].removeprefix('sha256:')[:12]}"
                lines.emit(
                    {
                        "status": status,
                        "digest": layer["id"],
                        "total": layer["size"],
                        "completed": layer["current"],
                    }
                )

        try:
            await work(self._operations.progress(emit, mode))
        except MrunnerError as e:
            self.log.warn("ollama {verb} failed: {message}", verb=verb, message=e.message)
            lines.emit({"error": e.message})
        else:
            lines.emit({"status": "success"})
        return b""


def _payload(request: IRequest) -> dict[str, Any]:
    return json_object(read_body(request, MAX_CREATE_BODY))


def _entries(model: Model) -> list[dict[str, Any]]:
    """Ollama's list entries for C{model}: one per tag (or its id when untagged)."""
    return [
        {
            "name": name,
            "model": name,
            "modified_at": shapes.timestamp(model.created),
            "size": _size(model),
            "digest": model.id.removeprefix("sha256:"),
            "details": shapes.model_details(model.config),
        }
        for name in model.tags or (model.id,)
    ]


def _size(model: Model) -> int:
    try:
        return os.path.getsize(model.gguf)
    except OSError:
        return 0
