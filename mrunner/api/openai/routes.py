"""The OpenAI-compatible inference routes and the model list, under C{/engines} and C{/v1}."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from twisted.web.resource import IResource
from twisted.web.server import Request

from mrunner.api.aliases import stored_name
from mrunner.api.documented import Documented
from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body, openai_shape
from mrunner.api.manage.scheduler_json import failed_preload_statuses, install_text
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openapi import NAME, Piece, answer, errors, json_content, operation
from mrunner.api.reading import validate
from mrunner.interfaces import IModelStore
from mrunner.proxy.forwarder import Forwarder
from mrunner.teams.access import check_usable, may_use, visible, visible_name
from mrunner.teams.lengths import NONE, OPENAI, Length
from mrunner.values.backend import COMPLETION, EMBEDDING, RERANKING
from mrunner.values.model import Model

Check = Callable[[Mapping[str, Any]], None]

# Every OpenAI-style route is served with and without a backend, and under /v1.
PREFIXES = ("/engines", "/engines/<backend>", "/v1")


def _v1(path: str) -> list[str]:
    """C{path} under each prefix; C{/v1} is itself an alias of C{/engines/v1}."""
    return [prefix + path.removeprefix("/v1") if prefix == "/v1" else prefix + path for prefix in PREFIXES]


CHAT = _v1("/v1/chat/completions")
COMPLETIONS = _v1("/v1/completions")
EMBEDDINGS = _v1("/v1/embeddings")
RERANK = [
    *_v1("/v1/rerank"),
    *("/rerank", "/score", "/engines/rerank", "/engines/<backend>/rerank"),
    *("/engines/score", "/engines/<backend>/score"),
]
MODELS = _v1("/v1/models")
MODEL_PATHS = _v1("/v1/models/<path:name>")

MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "alias_of": {"type": "string", "description": "an alias ([aliases]): the model it stands for"},
    },
}
LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"data": {"type": "array", "items": MODEL}},
}
# One server-sent event: its data is a JSON chunk, or [DONE] at the end.
EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
INFERENCE_ANSWERS = {
    "200": answer(
        "the runner's answer, as JSON or (stream: true) as server-sent events",
        {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": EVENT},
        },
    ),
    **errors(
        **{
            "422": "the model needs more memory than the whole budget",
            "500": "the runner failed to start; the message has the tail of its log",
            "502": "the runner died or could not be reached before it answered",
        }
    ),
}
STATUSES = {"type": "object", "additionalProperties": {"type": "string"}}


def _inference(summary: str, shape: validate.Shape) -> Piece:
    """An inference route's operation: its body is checked by C{shape}, and forwarded."""
    return operation(summary, INFERENCE_ANSWERS, body=json_content(shape.schema))


def _unchecked(payload: Mapping[str, Any]) -> None:
    """A preload is not forwarded: only its model and keep-alive are read."""


class InferenceAPI:
    """Checks a request, leases a runner from the scheduler and forwards to it."""

    app = Klein()
    handle_json_errors(app, openai_shape)
    routes = Documented(app)

    def __init__(self, gateway: Gateway, store: IModelStore, forwarder: Forwarder):
        self._gateway = gateway
        self._scheduler = gateway.scheduler
        self._store = store
        self._forwarder = forwarder

    async def _infer(
        self,
        request: Request,
        backend: str | None,
        mode: str,
        path: bytes,
        check: Check,
        length: Length = NONE,
    ) -> Any:
        """Check the body (its shape only when it will be forwarded), lease a runner, forward.

        C{length}: how the body says the most tokens it may generate (nothing, but for completions).
        """
        preload = (request.getHeader(b"x-preload-only") or b"").lower() == b"true"
        # The body is checked JSON, whatever the client called it: a runner reading the
        # Content-Type (multipart/form-data, say) must not take it for something else.
        request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
        asked = self._gateway.begin(
            request,
            mode,
            backend,
            _unchecked if preload else check,
            length=NONE if preload else length,
            events=not preload,
        )
        body = asked.forwarded()
        async with self._gateway.lease(request, asked) as lease:
            if preload:
                return json_body(request, {"status": "loaded", "model": asked.named or lease.model})
            await self._forwarder.forward(
                request,
                lease.socket,
                path,
                body,
                asked.meter,
                asked.renaming(lease),
                conversation=asked.resolved.conversation,
            )
        return None

    def openapi(self) -> Piece:
        return self.routes.openapi()

    def direct(self) -> dict[tuple[bytes, bytes], IResource]:
        """The inference routes whose paths name no backend, to be called without Klein (L{Direct})."""
        return self.routes.direct(self, openai_shape)

    @routes.route(
        CHAT,
        "POST",
        _inference("Chat completion (OpenAI), streamed with stream: true", validate.chat),
        hot=True,
    )
    def chat(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, COMPLETION, b"/v1/chat/completions", validate.chat, OPENAI)

    @routes.route(COMPLETIONS, "POST", _inference("Text completion (OpenAI)", validate.completions), hot=True)
    def completions(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, COMPLETION, b"/v1/completions", validate.completions, OPENAI)

    @routes.route(EMBEDDINGS, "POST", _inference("Embeddings (OpenAI)", validate.embeddings), hot=True)
    def embeddings(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, EMBEDDING, b"/v1/embeddings", validate.embeddings)

    @routes.route(
        RERANK,
        "POST",
        _inference("Rerank documents against a query (Jina/Cohere style)", validate.rerank),
        hot=True,
    )
    def rerank(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, RERANKING, b"/v1/rerank", validate.rerank)

    @routes.route(
        MODELS,
        "GET",
        operation("Local models as OpenAI model objects", {"200": answer("a list", json_content(LIST))}),
    )
    def models(self, request: Request, backend: str | None = None) -> bytes:
        """The models the key may use (L{visible}), and the aliases of those."""
        self._scheduler.backend_name(backend)
        member = caller(request).member
        data = [entry for model in visible(member, self._store.list()) for entry in openai_models(model)]
        for alias, model in self._gateway.aliases.listed():
            if may_use(member, model):
                data.append(openai_models(model)[0] | {"id": alias, "alias_of": model.name})
        return json_body(request, {"object": "list", "data": data})

    @routes.route(
        MODEL_PATHS,
        "GET",
        operation(
            "One local model as an OpenAI model object",
            {"200": answer("a model", json_content(MODEL))},
            parameters=[NAME],
        ),
    )
    def model(self, request: Request, name: str, backend: str | None = None) -> bytes:
        self._scheduler.backend_name(backend)
        stored = stored_name(name, self._gateway.aliases.table, self._store)
        check_usable(caller(request).member, self._store, stored)
        entry = openai_models(self._store.resolve(stored))[0]
        return json_body(request, entry if stored == name else entry | {"id": name, "alias_of": stored})

    @routes.route(
        "/engines/status",
        "GET",
        operation("Each backend's state", {"200": answer("backend: state", json_content(STATUSES))}),
    )
    def status(self, request: Request) -> bytes:
        statuses = {name: install_text(status) for name, status in self._scheduler.backend_statuses().items()}
        member = caller(request).member
        preloads = [p for p in self._scheduler.preloads() if visible_name(member, p.model)]
        return json_body(request, statuses | failed_preload_statuses(preloads))


def openai_models(model: Model) -> list[dict[str, Any]]:
    """OpenAI's model objects for C{model}: one per tag (or its id when untagged)."""
    return [
        {"id": name, "object": "model", "created": model.created, "owned_by": "mrunner"}
        for name in model.tags or (model.id,)
    ]
