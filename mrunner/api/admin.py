"""Runner administration under C{/engines}: ps, df, unload, _configure and _reload."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.requests import json_object, keep_alive, model_name, query, read_body
from mrunner.api.views import runner_json
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend, IModelStore, IScheduler
from mrunner.scheduling.scheduler import ModelSettings
from mrunner.store.names import parse

# Runtime flags a client may add: sampling and performance knobs, never a path,
# a network address or anything that fetches.
# fmt: off
ALLOWED_FLAGS = frozenset((
    "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--seed",
    "--batch-size", "-b", "--ubatch-size", "-ub", "--threads", "-t", "--threads-batch", "-tb",
    "--flash-attn", "-fa", "--cache-type-k", "-ctk", "--cache-type-v", "-ctv", "--no-mmap", "--mlock",
    "--n-gpu-layers", "-ngl", "--rope-scaling", "--rope-freq-base", "--rope-freq-scale",
    "--n-predict", "-n", "--cont-batching", "--no-cont-batching", "--cache-reuse", "--keep",
    "--reasoning-budget", "--reasoning-format",
    # the draft model's own settings, for speculative decoding (the draft itself comes from the store)
    "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min", "--spec-draft-p-split",
    "--spec-draft-ngl", "-ngld", "--spec-draft-threads", "-td", "--spec-draft-type-k", "-ctkd",
    "--spec-draft-type-v", "-ctvd",
))
# fmt: on
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
# A flag's value is a number or a word such as "q8_0", "on" or "deepseek": never
# a path (no slash, no "~"), whitespace that would split into more arguments, or
# anything a shell or llama-server would read specially.
_VALUE = re.compile(r"^[A-Za-z0-9_.:+-]+$")


def runtime_flags(value: object) -> tuple[str, ...]:
    """Flags from a list or a space-separated string, each in L{ALLOWED_FLAGS}, values plain words."""
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("runtime-flags must be a list of strings")
    for i, token in enumerate(value):
        flag, equals, attached = token.partition("=")
        if token.startswith("-") and not _NUMBER.match(token):
            if flag not in ALLOWED_FLAGS:
                raise BadRequest(
                    f"runtime flag {flag!r} is not allowed; allowed: {' '.join(sorted(ALLOWED_FLAGS))}",
                    code="flag_not_allowed",
                )
            if equals:
                _check_value(attached, flag)
        elif i == 0:
            raise BadRequest(f"runtime flags must start with a flag, not the value {token!r}")
        else:
            _check_value(token, value[i - 1])
    return tuple(value)


def _check_value(value: str, flag: str) -> None:
    if not _VALUE.match(value):
        raise BadRequest(
            f"value {value!r} of runtime flag {flag!r} is not allowed: values are numbers or plain"
            " words, never paths or text with spaces",
            code="flag_value_not_allowed",
        )


def model_settings(payload: Mapping[str, Any]) -> ModelSettings:
    """The C{_configure} body, accepting Docker Model Runner's dashed keys and underscores.

    C{runtime-flags} is a list; C{raw-runtime-flags} the same as one string.
    """

    def field(name: str) -> Any:
        return payload.get(name, payload.get(name.replace("_", "-")))

    context_size = field("context_size")
    if context_size is not None and (not isinstance(context_size, int) or context_size <= 0):
        raise BadRequest("context-size must be a positive integer")
    flags = field("runtime_flags") or field("raw_runtime_flags")
    pinned = field("pinned")
    if pinned is not None and not isinstance(pinned, bool):
        raise BadRequest("pinned must be true or false", code="invalid_pinned")
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
    ):
        self._scheduler = scheduler
        self._store = store
        self._backends = backends
        self._max_request_bytes = max_request_bytes
        self._reload = reload

    def _payload(self, request: IRequest) -> dict[str, Any]:
        body = read_body(request, self._max_request_bytes)
        return json_object(body) if body.strip() else {}

    @app.route("/engines/ps", methods=["GET"])
    def ps(self, request: IRequest) -> bytes:
        return json_body(request, [runner_json(runner) for runner in self._scheduler.snapshot()])

    @app.route("/engines/df", methods=["GET"])
    def df(self, request: IRequest) -> bytes:
        backends = {name: backend.disk_usage() for name, backend in self._backends.items()}
        return json_body(
            request,
            {
                "models_disk_usage": self._store.disk_usage(),
                "models_partial_disk_usage": self._store.partials_usage(),
                "default_backend_disk_usage": backends.get(self._scheduler.backend_name(None), 0),
                "backends_disk_usage": backends,
            },
        )

    @app.route("/engines/unload", methods=["POST"])
    async def unload(self, request: IRequest) -> bytes:
        payload = self._payload(request)
        models = payload.get("models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise BadRequest("models must be a list of model names")
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
        changed = await self._scheduler.configure(backend, name, model_settings(payload))
        return json_body(request, {"status": "configured" if changed else "unchanged", "model": name})

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
