"""Runner administration under C{/engines}: ps, df, unload, _configure, _reload and _drain."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.manage.flags import runtime_flags
from mrunner.api.manage.openapi import BACKEND, Piece, answer, errors, json_content, operation, parameter
from mrunner.api.manage.scheduler_json import failed_preload_json, failed_preloads, runner_json
from mrunner.api.reading import validate
from mrunner.api.reading.bodies import MAX_CONTEXT_SIZE, json_object, keep_alive, model_name, query, read_body
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend, IModelStore, IScheduler
from mrunner.store.names import parse
from mrunner.teams.access import visible_name, visible_runners
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
    },
}


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
        def configure(path: str) -> dict[str, Any]:
            backend = [BACKEND] if "{backend}" in path else []
            model = parameter("model", "query", {"type": "string"}, "the model", required=True)
            settings = {"type": "object"}
            return {
                "post": operation(
                    "Set a model's context size, runtime flags and keep-alive (restarts idle runners)",
                    {
                        "200": answer("configured or unchanged", json_content(settings)),
                        **errors(**{"409": "the model's runner is serving requests"}),
                    },
                    body=json_content(CONFIGURE.schema),
                    parameters=backend,
                ),
                "get": operation(
                    "What a model's next runner starts with",
                    {"200": answer("its settings", json_content(settings))},
                    parameters=[*backend, model],
                ),
            }

        sizes = {"type": "object", "additionalProperties": {"type": ["integer", "object"]}}
        unloaded = {"type": "object", "properties": {"unloaded_runners": {"type": "integer"}}}
        return {
            "paths": {
                "/engines/ps": {
                    "get": operation(
                        "Running runners, and preloads that failed (state failed, with their error)",
                        {"200": answer("runners", json_content({"type": "array", "items": RUNNER}))},
                    )
                },
                "/engines/df": {
                    "get": operation(
                        "Disk used by models, backends and the prompt cache's saved states",
                        {"200": answer("bytes", json_content(sizes))},
                    )
                },
                "/engines/unload": {
                    "post": operation(
                        "Stop runners: idle ones now, busy ones once drained",
                        {"200": answer("how many", json_content(unloaded))},
                        body=json_content(UNLOAD.schema),
                        body_required=False,
                    )
                },
                "/engines/_reload": {
                    "post": operation(
                        "Read tap.conf again and apply it, as SIGHUP does",
                        {
                            "200": answer(
                                "what changed, and what needs a restart", json_content({"type": "object"})
                            )
                        },
                    )
                },
                "/engines/_drain": {
                    "post": operation(
                        "Take no new requests (503, Retry-After), finish those in flight, report not ready",
                        {"200": answer("draining", json_content(DRAINED))},
                        parameters=[
                            parameter("wait", "query", {"type": "boolean"}, "answer once those in flight end")
                        ],
                    )
                },
                "/engines/_configure": configure("/engines/_configure"),
                "/engines/{backend}/_configure": configure("/engines/{backend}/_configure"),
            }
        }

    @app.route("/engines/ps", methods=["GET"])
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
        return json_body(request, [runner_json(runner) for runner in runners] + failed)

    @app.route("/engines/df", methods=["GET"])
    def df(self, request: IRequest) -> bytes:
        backends = {name: backend.disk_usage() for name, backend in self._backends.items()}
        files, size = self._cache_usage() if self._cache_usage else (0, 0)
        return json_body(
            request,
            {
                "models_disk_usage": self._store.disk_usage(),
                "models_partial_disk_usage": self._store.partials_usage(),
                "default_backend_disk_usage": backends.get(self._scheduler.backend_name(None), 0),
                "backends_disk_usage": backends,
                "prompt_cache_disk_usage": size,
                "prompt_cache_files": files,
            },
        )

    @app.route("/engines/unload", methods=["POST"])
    async def unload(self, request: IRequest) -> bytes:
        payload = self._payload(request)
        UNLOAD(payload)
        models = payload.get("models") or []
        backend = payload.get("backend") or None
        if backend is not None:
            self._scheduler.backend_name(backend)
        count = await self._scheduler.unload(backend, models, bool(payload.get("all")))
        return json_body(request, {"unloaded_runners": count})

    @app.route("/engines/_configure", methods=["POST"], endpoint="configure_default")
    @app.route("/engines/<backend>/_configure", methods=["POST"])
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

    @app.route("/engines/_configure", methods=["GET"], endpoint="configuration_default")
    @app.route("/engines/<backend>/_configure", methods=["GET"])
    def configuration(self, request: IRequest, backend: str | None = None) -> bytes:
        name = query(request, "model")
        if not name:
            raise BadRequest("name a model: GET /engines/_configure?model=NAME", code="model_required")
        return json_body(request, self._scheduler.configuration(backend, name))

    @app.route("/engines/_reload", methods=["POST"])
    def reload(self, request: IRequest) -> bytes:
        """Read C{tap.conf} again and apply it without a restart (as SIGHUP does)."""
        if self._reload is None:
            raise BadRequest("this daemon was started without a configuration to reload", code="no_reload")
        return json_body(request, self._reload())

    @app.route("/engines/_drain", methods=["POST"])
    async def drain(self, request: IRequest) -> bytes:
        """Drain the node before it goes (a rolling update): C{?wait=true} answers once nothing is in flight.

        There is no way back but a restart: a drained node is on its way out.
        """
        drained = self._scheduler.drain()
        if query(request, "wait") == "true":
            await drained
        return json_body(request, {"draining": True, "in_flight": self._scheduler.in_flight()})
