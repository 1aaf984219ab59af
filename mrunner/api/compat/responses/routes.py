"""OpenAI's Responses API, translated onto llama-server's chat completions.

Why not llama-server's own C{/v1/responses}: the pinned one refuses
C{previous_response_id} and input items without C{"type": "message"} (the
official client sends C{{"role", "content"}} items and function call
outputs), and mrunner must read the answer anyway to keep it for
C{previous_response_id}, retrieval and C{input_items}, and to end a stream
with C{response.failed} when the runner dies. So mrunner rebuilds the
conversation from its L{ResponseStore}, asks for a chat completion and writes
the Response object and its event sequence itself.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, NamedTuple

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.compat.openapi import compat_operation
from mrunner.api.compat.responses import shapes as shapes
from mrunner.api.compat.responses.response_store import ResponseStore, StoredResponse
from mrunner.api.documented import Documented
from mrunner.api.door.callers import caller
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openai.tally import Tally
from mrunner.api.openapi import Piece
from mrunner.api.reading.bodies import check_vision, count, model_name, query, typed
from mrunner.errors import BadRequest, MrunnerError
from mrunner.interfaces import IModelStore
from mrunner.proxy.answer import Answer
from mrunner.proxy.forwarder import Forwarder
from mrunner.proxy.relay import start_event_stream
from mrunner.teams.lengths import RESPONSES
from mrunner.values.backend import COMPLETION

PREFIXES = ("", "/v1", "/engines", "/engines/v1", "/engines/<backend>/v1")


def _paths(path: str) -> list[str]:
    return [prefix + path for prefix in PREFIXES]


class Asking(NamedTuple):
    """A checked request to create a response: its payload, input items, the conversation so far
    (the one it continues, then its input) and the chat completion it becomes."""

    payload: dict[str, Any]
    items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    chat: dict[str, Any]


class EventStream:
    """Server-sent events as the Responses API numbers them."""

    def __init__(self, request: Request):
        self._request = request
        self._sequence = 0
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        start_event_stream(request)

    def emit(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        self._request.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())


class ResponsesAPI:
    """C{/responses[/{id}[/input_items]]} under C{/}, C{/v1}, C{/engines}, C{/engines[/{backend}]/v1}."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)
    log = Logger()

    def __init__(self, gateway: Gateway, forwarder: Forwarder, responses: ResponseStore, store: IModelStore):
        self._gateway = gateway
        self._forwarder = forwarder
        self._responses = responses
        self._store = store

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        _paths("/responses"),
        "POST",
        compat_operation("Create a response (OpenAI Responses), streamed as its events with stream: true"),
    )
    def create(self, request: Request, backend: str | None = None) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self._create(request, backend))

    @routes.route(_paths("/responses/<response_id>"), "GET", compat_operation("A stored response"))
    def retrieve(self, request: IRequest, response_id: str, backend: str | None = None) -> bytes:
        if query(request, "stream") in ("true", "1"):
            raise BadRequest("streaming a stored response again is not supported; GET it without stream")
        return json_body(request, self._responses.get(response_id, caller(request)).response)

    @routes.route(
        _paths("/responses/<response_id>/input_items"),
        "GET",
        compat_operation("The input items of a stored response"),
    )
    def items(self, request: IRequest, response_id: str, backend: str | None = None) -> bytes:
        items = self._responses.get(response_id, caller(request)).input_items
        order = query(request, "order") or "desc"
        if order not in ("asc", "desc"):
            raise BadRequest(f"?order= must be asc or desc, not {order!r}")
        if order == "desc":
            items.reverse()
        after = query(request, "after")
        if after is not None:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[: count(request, "limit", 20, 100)]
        return json_body(
            request,
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > len(page),
            },
        )

    @routes.route(_paths("/responses/<response_id>"), "DELETE", compat_operation("Delete a stored response"))
    def delete(self, request: IRequest, response_id: str, backend: str | None = None) -> bytes:
        self._responses.delete(response_id, caller(request))
        return json_body(request, {"id": response_id, "object": "response", "deleted": True})

    def _read(self, request: Request, payload: dict[str, Any]) -> Asking:
        """Every check before the request is recorded: its shape, the conversation it continues, and
        the chat completion it becomes."""
        shapes.CREATE(payload)
        shapes.refuse_unsupported(payload)
        items = shapes.input_items(payload.get("input"))
        previous = typed(payload, "previous_response_id", str, "a response id")
        history = self._responses.get(previous, caller(request)).conversation if previous else []
        conversation = history + shapes.chat_messages(items)
        model = model_name(payload)
        if shapes.has_images(conversation):
            check_vision(self._store.resolve(model))
        instructions = typed(payload, "instructions", str, "a string")
        system = [{"role": "system", "content": instructions}] if instructions else []
        chat = {
            "model": model,
            "messages": system + conversation,
            "stream": payload.get("stream") is True,
            **shapes.chat_tools(payload),
            **shapes.sampling(payload),
        }
        return Asking(payload, items, conversation, chat)

    async def _create(self, request: Request, backend: str | None) -> bytes:
        asked = self._gateway.begin(
            request, COMPLETION, backend, partial(self._read, request), length=RESPONSES, events=True
        )
        payload, items, conversation, body = asked.checked
        stream = body["stream"]
        response_id = shapes.new_id("resp")
        created = int(self._gateway.clock.seconds())
        async with self._gateway.lease(request, asked) as lease:
            chat = json.dumps(asked.runner_body(body)).encode()
            upstream = (request, lease.socket, b"/v1/chat/completions", chat, asked.meter)
            if stream:
                transform = partial(self._stream, request, response_id, created, payload)
                response = await self._forwarder.forward(*upstream, transform=transform)
            else:
                tally = Tally().whole(await self._forwarder.forward(*upstream, transform=Answer.json))
                output = shapes.output_items(tally)
                response = shapes.response_object(
                    response_id, created, payload, shapes.final_status(tally), output, tally
                )
        if response["status"] != "failed" and payload.get("store") is not False:
            reply = shapes.reply_messages(response["output"])
            self._responses.put(StoredResponse(response, items, conversation + reply), caller(request).owner)
        return b"" if stream else json_body(request, response)

    async def _stream(
        self, request: Request, response_id: str, created: int, payload: dict[str, Any], answer: Answer
    ) -> dict[str, Any]:
        """Relay the answer as Responses events; the final Response object is returned to be stored."""
        events = EventStream(request)
        started = shapes.response_object(response_id, created, payload, "in_progress", [])
        events.emit("response.created", response=started)
        events.emit("response.in_progress", response=started)
        tally = Tally()
        message = shapes.message_item("", "in_progress")
        where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
        try:
            async for chunk in answer.events():
                text, _ = tally.add(chunk)
                if not text:
                    continue
                if len(tally.text) == len(text):  # the first text: the message starts
                    events.emit("response.output_item.added", output_index=0, item=message)
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    events.emit("response.content_part.added", **where, part=part)
                events.emit("response.output_text.delta", **where, delta=text, logprobs=[])
        except MrunnerError as e:
            self.log.warn("runner stopped mid-answer: {message}", message=e.message)
            error = {"code": "server_error", "message": e.message}
            failed = shapes.response_object(response_id, created, payload, "failed", [], tally, error)
            events.emit("response.failed", response=failed)
            return failed
        output = shapes.output_items(tally, message["id"])
        for index, item in enumerate(output):
            self._finish_item(events, index, item, announced=item["id"] == message["id"] and bool(tally.text))
        response = shapes.response_object(
            response_id, created, payload, shapes.final_status(tally), output, tally
        )
        events.emit(
            "response.completed" if response["status"] == "completed" else "response.incomplete",
            response=response,
        )
        return response

    def _finish_item(self, events: EventStream, index: int, item: dict[str, Any], announced: bool) -> None:
        """The events that close an output item (and open it first, unless its text was streamed)."""
        if not announced:
            events.emit(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress"}
            )
        if item["type"] == "message" and item["content"]:
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.emit("response.output_text.done", **where, text=part["text"], logprobs=[])
            events.emit("response.content_part.done", **where, part=part)
        elif item["type"] == "function_call":
            where = {"item_id": item["id"], "output_index": index}
            events.emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            events.emit("response.function_call_arguments.done", **where, arguments=item["arguments"])
        events.emit("response.output_item.done", output_index=index, item=item)
