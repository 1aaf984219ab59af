"""Ollama's API under C{/api}, translated onto llama-server's OpenAI routes and mrunner's store.

Generation goes through the same L{Gateway} as every other API; answers are
Ollama's NDJSON lines (or one object with C{"stream": false}) ending in
C{done: true} with durations from llama-server's timings; errors are
C{{"error": "..."}}. C{HEAD /} is answered by the service routes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.compat.ollama import shapes as shapes
from mrunner.api.compat.openapi import OLLAMA_ERROR, describe
from mrunner.api.door.callers import caller
from mrunner.api.errors import MethodNotAllowed, handle_json_errors, json_body, ollama_shape
from mrunner.api.observe.records import Record
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openai.tally import Tally
from mrunner.api.reading.bodies import json_object, keep_alive, model_name, read_body, typed
from mrunner.api.service.models import MAX_CREATE_BODY, NDJSONStream, remove
from mrunner.api.service.openapi import Piece
from mrunner.backends.base import COMPLETION, EMBEDDING
from mrunner.errors import BadRequest, MrunnerError, NotFound
from mrunner.runners.answer import RunnerClient
from mrunner.store.model import Model
from mrunner.store.names import parse
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.store import ModelStore
from mrunner.values import ModelSettings

#: The Ollama API version these routes follow; clients check it to enable features.
OLLAMA_VERSION = "0.12.0"
CHAT, GENERATE = "chat", "generate"
#: Ollama's C{expires_at} for a model kept loaded for ever.
NEVER = "2318-01-01T00:00:00Z"
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


def _name(payload: dict[str, Any]) -> str:
    """Ollama's model field is C{model}, and C{name} in older clients."""
    return model_name({"model": payload.get("model") or payload.get("name")})


class OllamaAPI:
    """C{/api/...}: generation through the gateway; models, pull and push through the store as C{/models}."""

    app = Klein()
    handle_json_errors(app, ollama_shape)
    log = Logger()

    def __init__(
        self, gateway: Gateway, runners: RunnerClient, store: ModelStore, puller: Puller, pusher: Pusher
    ):
        self._gateway = gateway
        self._runners = runners
        self._store = store
        self._puller = puller
        self._pusher = pusher

    def openapi(self) -> Piece:
        summaries = {name: f"Ollama's /api/{name}" for name in SERVED}
        return describe(
            self.app, {**summaries, "unserved": "Other Ollama routes: a 404 naming them"}, OLLAMA_ERROR
        )

    @app.route("/api/<path:rest>", methods=["GET", "HEAD", "POST", "PUT", "DELETE"])
    def unserved(self, request: IRequest, rest: str) -> bytes:
        if rest in SERVED:
            raise MethodNotAllowed(f"{request.method.decode()} /api/{rest}: method not allowed")
        raise NotFound(
            f"Ollama's /api/{rest} is not served by mrunner; served: {', '.join(f'/api/{r}' for r in SERVED)}"
        )

    # Models

    @app.route("/api/version", methods=["GET"])
    def version(self, request: IRequest) -> bytes:
        return json_body(request, {"version": OLLAMA_VERSION})

    @app.route("/api/tags", methods=["GET"])
    def tags(self, request: IRequest) -> bytes:
        return json_body(
            request, {"models": [entry for model in self._store.list() for entry in self._entries(model)]}
        )

    def _entries(self, model: Model) -> list[dict[str, Any]]:
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

    @app.route("/api/ps", methods=["GET"])
    def ps(self, request: IRequest) -> bytes:
        models = []
        for runner in self._gateway.scheduler.snapshot():
            try:
                model = self._store.resolve(runner.model_id)
            except NotFound:  # deleted while its runner stops
                continue
            expires = None if runner.expires_at is None else shapes.timestamp(runner.expires_at)
            models.append(
                {
                    **self._entries(model)[0],
                    "expires_at": expires or NEVER,
                    "size": runner.memory or _size(model),
                    "size_vram": 0,
                }
            )
        return json_body(request, {"models": models})

    @app.route("/api/show", methods=["POST"])
    def show(self, request: IRequest) -> bytes:
        model = self._store.resolve(_name(self._payload(request)))
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

    @app.route("/api/copy", methods=["POST"])
    def copy(self, request: IRequest) -> bytes:
        payload = self._payload(request)
        source, destination = payload.get("source"), payload.get("destination")
        if not isinstance(source, str) or not isinstance(destination, str):
            raise BadRequest("give 'source' and 'destination' model names")
        self._store.tag(source, destination)
        return json_body(request, {"status": "success"})

    @app.route("/api/delete", methods=["DELETE"])
    async def delete(self, request: IRequest) -> bytes:
        """Remove a name; the model itself only when no other name still uses it."""
        await remove(self._store, self._gateway.scheduler, _name(self._payload(request)), force=True)
        return json_body(request, {"status": "success"})

    @app.route("/api/pull", methods=["POST"])
    def pull(self, request: Request) -> Deferred[bytes]:
        payload = self._payload(request)
        ref = parse(_name(payload))
        return Deferred.fromCoroutine(
            self._transfer(request, payload, "pulling", partial(self._puller.pull, ref))
        )

    @app.route("/api/push", methods=["POST"])
    def push(self, request: Request) -> Deferred[bytes]:
        payload = self._payload(request)
        name = _name(payload)
        self._store.resolve(name)
        return Deferred.fromCoroutine(
            self._transfer(request, payload, "pushing", partial(self._pusher.push, parse(name)))
        )

    async def _transfer(
        self, request: Request, payload: dict[str, Any], verb: str, work: Callable[[Progress], Deferred[Any]]
    ) -> bytes:
        """The pull or push C{/models} does, reported as Ollama's status lines (or one at the end)."""
        if payload.get("stream") is False:
            await work(Progress(lambda line: None, self._gateway.clock, verb))
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
            await work(Progress(emit, self._gateway.clock, verb))
        except MrunnerError as e:
            self.log.warn("ollama {verb} failed: {message}", verb=verb, message=e.message)
            lines.emit({"error": e.message})
        else:
            lines.emit({"status": "success"})
        return b""

    def _payload(self, request: IRequest) -> dict[str, Any]:
        return json_object(read_body(request, MAX_CREATE_BODY))

    # Generation

    @app.route("/api/chat", methods=["POST"])
    def chat(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._generate(request, CHAT))

    @app.route("/api/generate", methods=["POST"])
    def generate(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._generate(request, GENERATE))

    def _asked(
        self, request: Request, mode: str
    ) -> tuple[float, dict[str, Any], str, float | None, Record | None]:
        """Start measuring C{request}: its start time, body, model name, C{keep_alive} and record.

        The record is kept from the moment the model is named, so a request refused after that
        (a missing model, an unsupported option) is in C{/engines/requests} as OpenAI's are.
        """
        self._gateway.measure(request, mode)
        started = self._gateway.clock.seconds()
        payload = json_object(self._gateway.body(request))
        name = _name(payload)
        record = self._gateway.record_answer(request, name, mode, json.dumps(payload).encode())
        return started, payload, name, keep_alive(payload.get("keep_alive")), record

    async def _context_size(self, request: IRequest, name: str, num_ctx: int | None) -> None:
        """C{options.num_ctx}: from an admin, the context size the model's runner starts with, as
        C{_configure} sets it.

        The model's runner serves every key: a normal key's C{num_ctx} changes nothing, and its
        request is served at the context an admin configured, as Ollama serves a C{num_ctx} past
        the model's own at the model's.
        """
        if num_ctx is not None and caller(request).admin:
            await self._gateway.scheduler.configure(None, name, ModelSettings(context_size=num_ctx))

    async def _generate(self, request: Request, kind: str) -> bytes:
        started, payload, name, keep, record = self._asked(request, COMPLETION)
        shapes.refuse_unsupported(payload)
        sampling, num_ctx = shapes.options(payload)
        model = self._store.resolve(name)
        path, body = self._upstream(kind, payload, model)
        body.update(sampling)
        body.update(shapes.response_format(payload.get("format")))
        if kind == CHAT or path == b"/v1/chat/completions":
            body.update(shapes.thinking(payload.get("think")))
        await self._context_size(request, name, num_ctx)
        if not body.get("messages") and not body.get("prompt"):
            return await self._load_only(request, kind, name, keep, started)
        stream = payload.get("stream") is not False
        body.update(model=name, stream=stream)
        async with self._gateway.lease(request, None, name, COMPLETION, keep, record) as lease:
            loaded = self._gateway.clock.seconds()
            answer = await self._runners.post(lease.socket, path, json.dumps(body).encode())
            if not stream:
                tally = Tally().whole(await answer.json())
                line = self._line(
                    kind, name, tally.text, tally.reasoning, shapes.tool_calls(tally.tool_calls)
                )
                return json_body(request, {**line, **self._done(tally, started, loaded)})
            lines = NDJSONStream(request)
            tally = Tally()
            try:
                async for chunk in answer.events():
                    text, reasoning = tally.add(chunk)
                    if text or reasoning:
                        lines.emit(self._line(kind, name, text, reasoning))
            except MrunnerError as e:
                self.log.warn("runner stopped mid-answer: {message}", message=e.message)
                lines.emit({"error": e.message})
                return b""
            if tally.tool_calls:
                lines.emit(self._line(kind, name, "", "", shapes.tool_calls(tally.tool_calls)))
            lines.emit({**self._line(kind, name, "", ""), **self._done(tally, started, loaded)})
        return b""

    def _upstream(self, kind: str, payload: dict[str, Any], model: Model) -> tuple[bytes, dict[str, Any]]:
        """The llama-server route and body for an Ollama chat or generate request."""
        projector = "mmproj" in model.files
        if kind == CHAT:
            body: dict[str, Any] = {
                "messages": shapes.chat_messages(payload.get("messages") or [], projector, model.name)
            }
            if typed(payload, "tools", list, "a list of tools"):
                body["tools"] = payload["tools"]
            return b"/v1/chat/completions", body
        prompt = typed(payload, "prompt", str, "a string") or ""
        if payload.get("raw"):
            if payload.get("images"):
                raise BadRequest("'images' cannot be sent with 'raw': true")
            return b"/v1/completions", {"prompt": prompt}
        if not prompt:
            return b"/v1/chat/completions", {}
        system = typed(payload, "system", str, "a string")
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt, "images": payload.get("images")})
        return b"/v1/chat/completions", {"messages": shapes.chat_messages(messages, projector, model.name)}

    async def _load_only(
        self, request: Request, kind: str, name: str, keep: float | None, started: float
    ) -> bytes:
        """An empty chat or prompt loads the model, or with C{keep_alive: 0} unloads it."""
        if keep == 0:
            await self._gateway.scheduler.unload(backend=None, models=[name], all=False)
            reason = "unload"
        else:
            async with self._gateway.lease(request, None, name, COMPLETION, keep):
                reason = "load"
        return json_body(request, {**self._line(kind, name, "", ""), "done": True, "done_reason": reason})

    def _line(
        self, kind: str, name: str, text: str, reasoning: str, calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """One answer line: C{message} for chat, C{response} for generate, not done."""
        line: dict[str, Any] = {"model": name, "created_at": shapes.timestamp(self._gateway.clock.seconds())}
        if kind == CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["thinking"] = reasoning
            if calls:
                message["tool_calls"] = calls
            line["message"] = message
        else:
            line["response"] = text
            if reasoning:
                line["thinking"] = reasoning
        line["done"] = False
        return line

    def _done(self, tally: Tally, started: float, loaded: float) -> dict[str, Any]:
        return {
            "done": True,
            "done_reason": shapes.done_reason(tally.finish_reason),
            **shapes.durations(tally.timings, started, loaded, self._gateway.clock.seconds()),
        }

    # Embeddings

    @app.route("/api/embed", methods=["POST"])
    def embed(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._embed(request, legacy=False))

    @app.route("/api/embeddings", methods=["POST"])
    def embeddings(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._embed(request, legacy=True))

    async def _embed(self, request: Request, legacy: bool) -> bytes:
        """C{/api/embed} (C{input}: text or texts) and the older C{/api/embeddings} (C{prompt})."""
        started, payload, name, keep, record = self._asked(request, EMBEDDING)
        if payload.get("dimensions") is not None:
            raise BadRequest("'dimensions' is not supported: embeddings have the model's own size")
        _, num_ctx = shapes.options(payload)
        texts = payload.get("prompt" if legacy else "input") or []
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise BadRequest(f"'{'prompt' if legacy else 'input'}' must be a string or a list of strings")
        await self._context_size(request, name, num_ctx)
        async with self._gateway.lease(request, None, name, EMBEDDING, keep, record) as lease:
            loaded = self._gateway.clock.seconds()
            vectors: list[Any] = []
            prompt_tokens = 0
            if texts:
                body = json.dumps({"model": name, "input": texts}).encode()
                result = await (await self._runners.post(lease.socket, b"/v1/embeddings", body)).json()
                vectors = [
                    item["embedding"] for item in sorted(result["data"], key=lambda item: item["index"])
                ]
                prompt_tokens = (result.get("usage") or {}).get("prompt_tokens", 0)
        if legacy:
            return json_body(request, {"embedding": vectors[0] if vectors else []})
        durations = shapes.durations({}, started, loaded, self._gateway.clock.seconds())
        return json_body(
            request,
            {
                "model": name,
                "embeddings": vectors,
                "total_duration": durations["total_duration"],
                "load_duration": durations["load_duration"],
                "prompt_eval_count": prompt_tokens,
            },
        )


def _size(model: Model) -> int:
    try:
        return os.path.getsize(model.gguf)
    except OSError:
        return 0
