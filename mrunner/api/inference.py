"""The OpenAI-compatible inference routes and the model list, under C{/engines} and C{/v1}."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.web.server import Request

from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.gateway import Gateway
from mrunner.api.requests import target, wants_images
from mrunner.api.views import install_text
from mrunner.backends.base import COMPLETION, EMBEDDING, RERANKING
from mrunner.errors import BadRequest
from mrunner.interfaces import IModelStore, IScheduler
from mrunner.metrics import Metrics
from mrunner.proxy import Forwarder
from mrunner.store.model import Model

# Every OpenAI-style route is served with and without a backend, and under /v1.
PREFIXES = ("/engines", "/engines/<backend>", "/v1")


def _v1(path: str) -> list[str]:
    """C{path} under each prefix; C{/v1} is itself an alias of C{/engines/v1}."""
    return [prefix + path.removeprefix("/v1") if prefix == "/v1" else prefix + path for prefix in PREFIXES]


def routes(app: Klein, paths: list[str], **kwargs: Any) -> Callable[[Any], Any]:
    """Route every one of C{paths} to the decorated method."""

    def decorate(f: Any) -> Any:
        for i, path in enumerate(paths):
            app.route(path, endpoint=f"{f.__name__}_{i}", **kwargs)(f)
        return f

    return decorate


class InferenceAPI:
    """Checks a request, leases a runner from the scheduler and forwards to it."""

    app = Klein()
    handle_json_errors(app)

    def __init__(
        self,
        scheduler: IScheduler,
        store: IModelStore,
        forwarder: Forwarder,
        metrics: Metrics,
        clock: IReactorTime,
        max_request_bytes: int,
    ):
        self._scheduler = scheduler
        self._store = store
        self._forwarder = forwarder
        self._gateway = Gateway(scheduler, metrics, clock, max_request_bytes)

    async def _infer(self, request: Request, backend: str | None, mode: str, path: bytes) -> Any:
        self._gateway.measure(request, mode)
        self._scheduler.backend_name(backend)
        body = self._gateway.body(request)
        model, keep_alive = target(body)
        if wants_images(body):
            self._check_vision(model)
        async with self._gateway.lease(backend, model, mode, keep_alive) as lease:
            if (request.getHeader(b"x-preload-only") or b"").lower() == b"true":
                return json_body(request, {"status": "loaded", "model": lease.model})
            await self._forwarder.forward(request, lease.socket, path, body)
        return None

    def _check_vision(self, name: str) -> None:
        """A request with images needs a projector: say so before any runner loads."""
        model = self._store.resolve(name)
        if "mmproj" not in model.files:
            raise BadRequest(
                f"model {model.name} cannot read images: it has no multimodal projector (mmproj) layer;"
                " use a vision model, e.g. one pulled from a Hugging Face repository with an mmproj-*.gguf,"
                " or add a projector with `mrunner package --mmproj FILE`",
                code="model_has_no_vision",
            )

    @routes(app, _v1("/v1/chat/completions"), methods=["POST"])
    def chat(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, COMPLETION, b"/v1/chat/completions")

    @routes(app, _v1("/v1/completions"), methods=["POST"])
    def completions(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, COMPLETION, b"/v1/completions")

    @routes(app, _v1("/v1/embeddings"), methods=["POST"])
    def embeddings(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, EMBEDDING, b"/v1/embeddings")

    @routes(
        app,
        [
            *_v1("/v1/rerank"),
            "/rerank",
            "/score",
            "/engines/rerank",
            "/engines/<backend>/rerank",
            "/engines/score",
            "/engines/<backend>/score",
        ],
        methods=["POST"],
    )
    def rerank(self, request: Request, backend: str | None = None) -> Any:
        return self._infer(request, backend, RERANKING, b"/v1/rerank")

    @routes(app, _v1("/v1/models"), methods=["GET"])
    def models(self, request: Request, backend: str | None = None) -> bytes:
        self._scheduler.backend_name(backend)
        data = [entry for model in self._store.list() for entry in openai_models(model)]
        return json_body(request, {"object": "list", "data": data})

    @routes(app, _v1("/v1/models/<path:name>"), methods=["GET"])
    def model(self, request: Request, name: str, backend: str | None = None) -> bytes:
        self._scheduler.backend_name(backend)
        return json_body(request, openai_models(self._store.resolve(name))[0])

    @app.route("/engines/status", methods=["GET"])
    def status(self, request: Request) -> bytes:
        statuses = self._scheduler.backend_statuses()
        return json_body(request, {name: install_text(status) for name, status in statuses.items()})


def openai_models(model: Model) -> list[dict[str, Any]]:
    """OpenAI's model objects for C{model}: one per tag (or its id when untagged)."""
    return [
        {"id": name, "object": "model", "created": model.created, "owned_by": "mrunner"}
        for name in model.tags or (model.id,)
    ]
