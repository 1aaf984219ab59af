"""Runner administration under C{/engines}: ps, df, unload, _configure, _reload and _drain."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.callers import caller
from mrunner.api.door.declared import Route, Who
from mrunner.api.door.route_group import Piece
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.manage.flags import runtime_flags
from mrunner.api.manage.scheduler_json import failed_preload_json, failed_preloads, runner_json, with_queue
from mrunner.api.openapi import answer, errors, json_content, operation
from mrunner.api.reading import validate
from mrunner.api.reading.bodies import MAX_CONTEXT_SIZE, json_object, keep_alive, model_name, query, read_body
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend, IModelStore, IScheduler
from mrunner.names import parse
from mrunner.teams.access import visible_disk_usage, visible_name, visible_runners
from mrunner.values import ModelSettings

SIZE = validate.integer(1, MAX_CONTEXT_SIZE)
FLAGS = validate.array(validate.string)
# Docker Model Runner's dashed keys, and the same with underscores.
CONFIGURE = validate.Shape(
    {
        "model": validate.text,
        **dict.fromkeys(("context_size", "context-size"), SIZE),
        **dict.fromkeys(("runtime_flags", "runtime-flags"), FLAGS),
        **dict.fromkeys(("raw_runtime_flags", "raw-runtime-flags"), validate.string),
        "keep_alive": validate.DURATION,
        "pinned": validate.boolean,
        "speculative": validate.obj({"draft_model": validate.string}),
        **dict.fromkeys(("draft_model", "draft-model"), validate.string),
    },
    required=("model",),
)
DRAINED = {
    "type": "object",
    "required": ["draining", "in_flight"],
    "properties": {"draining": {"type": "boolean"}, "in_flight": {"type": "integer"}},
}
UNLOAD = validate.Shape({"all": validate.boolean, "backend": validate.text, "models": FLAGS})
RUNNER = {
    "type": "object",
    "properties": {
        "backend_name": {"type": "string"},
        "model_name": {"type": "string"},
        "mode": {"type": "string"},
        "state": {"type": "string"},
        "in_use": {"type": "integer"},
        "last_used": {"type": ["string", "null"]},
        "keep_alive": {"type": ["number", "null"]},
        "expires_at": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
        "waiting": {"type": "integer", "description": "requests queued for this model"},
        "oldest_wait": {"type": ["number", "null"], "description": "seconds the oldest of them has waited"},
    },
}
SIZES = {"type": "object", "additionalProperties": {"type": ["integer", "object"]}}
UNLOADED = {"type": "object", "properties": {"unloaded_runners": {"type": "integer"}}}
SETTINGS = json_content({"type": "object"})
#: A model's settings, for the default backend or one named.
CONFIGURED = ("/engines/_configure", "/engines/<backend>/_configure")


def model_settings(payload: Mapping[str, Any]) -> ModelSettings:
    """The C{_configure} body, accepting Docker Model Runner's dashed keys and underscores.

    C{runtime-flags} is a list; C{raw-runtime-flags} the same as one string; an
    empty list clears the flags set before.
    """

    def field(name: str) -> Any:
        return payload.get(name, payload.get(name.replace("_", "-")))

    context_size = field("context_size")
    if context_size is not None and (
        not isinstance(context_size, int)
        or isinstance(context_size, bool)
        or not 0 < context_size <= MAX_CONTEXT_SIZE
    ):
        raise BadRequest(
            f"context-size must be an integer from 1 to {MAX_CONTEXT_SIZE}, not {context_size!r:.40}",
            param="context_size",
        )
    flags = field("runtime_flags")
    if flags is None:
        flags = field("raw_runtime_flags")
    pinned = field("pinned")
    if pinned is not None and not isinstance(pinned, bool):
        raise BadRequest("pinned must be true or false", code="invalid_pinned", param="pinned")
    return ModelSettings(
        context_size=context_size,
        flags=None if flags is None else runtime_flags(flags),
        keep_alive=keep_alive(field("keep_alive")),
        pinned=pinned,
        draft_model=draft_model(payload),
    )


def draft_model(payload: Mapping[str, Any]) -> str | None:
    """C{speculative.draft_model} (Docker Model Runner's shape) or a top-level C{draft_model}; "" for none."""
    speculative = payload.get("speculative")
    if speculative is not None and not isinstance(speculative, dict):
        raise BadRequest('speculative must be an object, e.g. {"draft_model": "ai/smollm2"}')
    name = (speculative or {}).get("draft_model", payload.get("draft_model", payload.get("draft-model")))
    if name is None or name == "":
        return name
    if not isinstance(name, str):
        raise BadRequest("speculative.draft_model must be the name of a model in the store")
    parse(name, "draft model")
    return name


class AdminAPI:
    """What runs, what it costs, and how to stop or reconfigure it."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(
        self,
        scheduler: IScheduler,
        store: IModelStore,
        backends: Mapping[str, IBackend],
        max_request_bytes: int,
        reload: Callable[[], dict[str, Any]] | None = None,
        cache_usage: Callable[[], tuple[int, int]] | None = None,
    ):
        self._scheduler = scheduler
        #: The prompt cache's saved states: (files, bytes); None with [cache] off.
        self._cache_usage = cache_usage
        self._store = store
        self._backends = backends
        self._max_request_bytes = max_request_bytes
        self._reload = reload

    def _payload(self, request: IRequest) -> dict[str, Any]:
        body = read_body(request, self._max_request_bytes)
        return json_object(body) if body.strip() else {}

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/engines/ps",
        "GET",
        operation(
            "Runners and their queues, models waiting for one (state waiting), failed preloads",
            {"200": answer("runners", json_content({"type": "array", "items": RUNNER}))},
        ),
    )
    def ps(self, request: IRequest) -> bytes:
        """The runners, and the preloads that failed, of the models the key may use."""
        member = caller(request).member
        runners = visible_runners(member, self._store, self._scheduler.snapshot())
        backend = self._scheduler.backend_name(None)
        failed = [
            failed_preload_json(preload, backend)
            for preload in failed_preloads(self._scheduler.preloads())
            if visible_name(member, preload.model)
        ]
        queue = [w for w in self._scheduler.waiting() if visible_name(member, w.model_name)]
        return json_body(request, with_queue([runner_json(runner) for runner in runners], queue) + failed)

    @routes.route(
        "/engines/df",
        "GET",
        operation(
            "Disk used by models, backends and the prompt cache's saved states",
            {"200": answer("bytes", json_content(SIZES))},
        ),
    )
    def df(self, request: IRequest) -> bytes:
        """Disk use; a key with a model list is told only of the models it may use."""
        backends = {name: backend.disk_usage() for name, backend in self._backends.items()}
        files, size = self._cache_usage() if self._cache_usage else (0, 0)
        return json_body(
            request,
            {
                "models_disk_usage": visible_disk_usage(caller(request).member, self._store),
                "models_partial_disk_usage": self._store.partials_usage(),
                "default_backend_disk_usage": backends.get(self._scheduler.backend_name(None), 0),
                "backends_disk_usage": backends,
                "prompt_cache_disk_usage": size,
                "prompt_cache_files": files,
            },
        )

    @routes.route(
        "/engines/unload",
        "POST",
        operation(
            "Stop runners: idle ones now, busy ones once drained",
            {"200": answer("how many", json_content(UNLOADED))},
            body=json_content(UNLOAD.schema),
            body_required=False,
        ),
        door=Route(Who.ADMIN),
    )
    async def unload(self, request: IRequest) -> bytes:
        payload = self._payload(request)
        UNLOAD(payload)
        models = payload.get("models") or []
        backend = payload.get("backend") or None
        if backend is not None:
            self._scheduler.backend_name(backend)
        count = await self._scheduler.unload(backend, models, bool(payload.get("all")))
        return json_body(request, {"unloaded_runners": count})

    @routes.route(
        CONFIGURED,
        "POST",
        operation(
            "Set a model's context size, runtime flags and keep-alive (restarts idle runners)",
            {
                "200": answer("configured or unchanged", SETTINGS),
                **errors(**{"409": "the model's runner is serving requests"}),
            },
            body=json_content(CONFIGURE.schema),
        ),
        door=Route(Who.ADMIN),
    )
    async def configure(self, request: IRequest, backend: str | None = None) -> bytes:
        payload = self._payload(request)
        name = model_name(payload)
        CONFIGURE(payload)
        changed = await self._scheduler.configure(backend, name, model_settings(payload))
        configuration = self._scheduler.configuration(backend, name)
        answer = {
            "status": "configured" if changed else "unchanged",
            "model": name,
            "context_size": configuration["context_size_in_force"],
        }
        if configuration["warning"]:
            answer["warning"] = configuration["warning"]
        return json_body(request, answer)

    @routes.route(
        CONFIGURED,
        "GET",
        operation(
            "What a model's next runner starts with",
            {"200": answer("its settings", SETTINGS)},
            parameters=[parameter("model", "query", {"type": "string"}, "the model", required=True)],
        ),
    )
    def configuration(self, request: IRequest, backend: str | None = None) -> bytes:
        name = query(request, "model")
        if not name:
            raise BadRequest("name a model: GET /engines/_configure?model=NAME", code="model_required")
        return json_body(request, self._scheduler.configuration(backend, name))

    @routes.route(
        "/engines/_reload",
        "POST",
        operation(
            "Read tap.conf again and apply it, as SIGHUP does",
            {"200": answer("what changed, and what needs a restart", json_content({"type": "object"}))},
        ),
        door=Route(Who.ADMIN),
    )
    def reload(self, request: IRequest) -> bytes:
        """Read C{tap.conf} again and apply it without a restart (as SIGHUP does)."""
        if self._reload is None:
            raise BadRequest("this daemon was started without a configuration to reload", code="no_reload")
        return json_body(request, self._reload())

    @routes.route(
        "/engines/_drain",
        "POST",
        operation(
            "Take no new requests (503, Retry-After), finish those in flight, report not ready",
            {"200": answer("draining", json_content(DRAINED))},
            parameters=[parameter("wait", "query", {"type": "boolean"}, "answer once those in flight end")],
        ),
        door=Route(Who.ADMIN),
    )
    async def drain(self, request: IRequest) -> bytes:
        """Drain the node before it goes (a rolling update): C{?wait=true} answers once nothing is in flight.

        There is no way back but a restart: a drained node is on its way out.
        """
        drained = self._scheduler.drain()
        if query(request, "wait") == "true":
            await drained
        return json_body(request, {"draining": True, "in_flight": self._scheduler.in_flight()})
