"""Ollama's API under C{/api}, translated onto llama-server's OpenAI routes and mrunner's store.

Generation goes through the same L{Gateway} as every other API; answers are
Ollama's NDJSON lines (or one object with C{"stream": false}) ending in
C{done: true} with durations from llama-server's timings; errors are
C{{"error": "..."}}. Ollama's model routes are L{OllamaModelsAPI}'s; C{HEAD /}
is answered by the service routes.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.compat.ollama import shapes as shapes
from mrunner.api.compat.openapi import OLLAMAS
from mrunner.api.documented import Documented
from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body, ollama_shape
from mrunner.api.manage.models import NDJSONStream
from mrunner.api.openai.gateway import Asked, Gateway
from mrunner.api.openai.tally import Tally
from mrunner.api.openapi import Piece
from mrunner.api.reading.bodies import typed
from mrunner.errors import BadRequest, MrunnerError
from mrunner.interfaces import IModelStore
from mrunner.proxy.answer import Answer
from mrunner.proxy.forwarder import Forwarder
from mrunner.teams.lengths import NONE, OLLAMA
from mrunner.values import ModelSettings
from mrunner.values.backend import COMPLETION, EMBEDDING
from mrunner.values.model import Model

CHAT, GENERATE = "chat", "generate"


class OllamaAPI:
    """C{/api/chat}, C{/api/generate}, C{/api/embed} and C{/api/embeddings}, through the gateway."""

    app = Klein()
    handle_json_errors(app, ollama_shape)
    routes = Documented(app)
    log = Logger()

    def __init__(self, gateway: Gateway, forwarder: Forwarder, store: IModelStore):
        self._gateway = gateway
        self._forwarder = forwarder
        self._store = store

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route("/api/chat", "POST", OLLAMAS)
    def chat(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._generate(request, CHAT))

    @routes.route("/api/generate", "POST", OLLAMAS)
    def generate(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._generate(request, GENERATE))

    def _begin(self, request: Request, mode: str) -> Asked[dict[str, Any]]:
        """L{Gateway.begin} for an Ollama request, which names its model in C{model} or C{name}.

        The record is kept from the moment the model is named, so a request refused after that
        (a missing model, an unsupported option) is in C{/engines/requests} as OpenAI's are.
        """
        return self._gateway.begin(
            request,
            mode,
            None,
            _whole_payload,
            named=shapes.named_model,
            length=OLLAMA if mode == COMPLETION else NONE,
        )

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
        started = self._gateway.clock.seconds()
        asked = self._begin(request, COMPLETION)
        payload, name = asked.checked, asked.model
        shapes.refuse_unsupported(payload)
        sampling, num_ctx = shapes.options(payload)
        model = asked.resolved.model
        path, body = self._upstream(kind, payload, model)
        body.update(sampling)
        body.update(shapes.response_format(payload.get("format")))
        if kind == CHAT or path == b"/v1/chat/completions":
            body.update(shapes.thinking(payload.get("think")))
        await self._context_size(request, name, num_ctx)
        if not body.get("messages") and not body.get("prompt"):
            return await self._load_only(request, kind, asked)
        stream = payload.get("stream") is not False
        body.update(model=name, stream=stream)
        async with self._gateway.lease(request, asked) as lease:
            loaded = self._gateway.clock.seconds()
            sent = json.dumps(asked.runner_body(body)).encode()
            upstream = (request, lease.socket, path, sent, asked.meter)
            if not stream:
                tally = Tally().whole(await self._forwarder.forward(*upstream, transform=Answer.json))
                line = self._line(
                    kind, name, tally.text, tally.reasoning, shapes.tool_calls(tally.tool_calls)
                )
                return json_body(request, {**line, **self._done(tally, started, loaded)})
            lines = partial(self._lines, request, kind, name, started, loaded)
            return await self._forwarder.forward(*upstream, transform=lines)

    async def _lines(
        self, request: Request, kind: str, name: str, started: float, loaded: float, answer: Answer
    ) -> bytes:
        """The runner's streamed answer as Ollama's NDJSON lines, the last one C{done}."""
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

    async def _load_only(self, request: Request, kind: str, asked: Asked[Any]) -> bytes:
        """An empty chat or prompt loads the model, or with C{keep_alive: 0} unloads it."""
        if asked.keep_alive == 0:
            await self._gateway.scheduler.unload(backend=None, models=[asked.model], all=False)
            reason = "unload"
        else:
            async with self._gateway.lease(request, asked):
                reason = "load"
        line = self._line(kind, asked.model, "", "")
        return json_body(request, {**line, "done": True, "done_reason": reason})

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
            **shapes.counts(*tally.counts),
        }

    # Embeddings

    @routes.route("/api/embed", "POST", OLLAMAS)
    def embed(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._embed(request, legacy=False))

    @routes.route("/api/embeddings", "POST", OLLAMAS)
    def embeddings(self, request: Request) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._embed(request, legacy=True))

    async def _embed(self, request: Request, legacy: bool) -> bytes:
        """C{/api/embed} (C{input}: text or texts) and the older C{/api/embeddings} (C{prompt})."""
        started = self._gateway.clock.seconds()
        asked = self._begin(request, EMBEDDING)
        payload, name = asked.checked, asked.model
        if payload.get("dimensions") is not None:
            raise BadRequest("'dimensions' is not supported: embeddings have the model's own size")
        _, num_ctx = shapes.options(payload)
        texts = payload.get("prompt" if legacy else "input") or []
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise BadRequest(f"'{'prompt' if legacy else 'input'}' must be a string or a list of strings")
        await self._context_size(request, name, num_ctx)
        async with self._gateway.lease(request, asked) as lease:
            loaded = self._gateway.clock.seconds()
            vectors: list[Any] = []
            prompt_tokens = 0
            if texts:
                body = json.dumps({"model": name, "input": texts}).encode()
                result = await self._forwarder.forward(
                    request, lease.socket, b"/v1/embeddings", body, asked.meter, transform=Answer.json
                )
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


def _whole_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """An Ollama route translates the whole payload: it is kept, and checked as it is read."""
    return payload
