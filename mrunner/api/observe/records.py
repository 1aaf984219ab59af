"""Request records: the last requests per model, with timings, token counts, the body and the answer.

Recording stays off the proxy's hot path: a request's body is kept as the
bytes it already is, and the answer in one buffer the runner's chunks are
appended to (L{Record.write}), not as the chunks themselves: a thousand live
streams then hold a buffer each, not an object per event. Nothing is parsed
until a record is read: then a streamed answer is reassembled into its final
text, and token counts are taken from the runner's C{usage} (or llama-server's
C{timings}).

The store is bounded by C{per_model} records per model and C{max_bytes} in
all; a body or answer past C{max_body} is cut there and marked truncated.
Secrets never reach a record: C{Authorization}, API-key and cookie headers
are dropped when the record is made.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from functools import lru_cache
from typing import Any

import attrs
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest

from mrunner.api.manage.scheduler_json import timestamp
from mrunner.errors import BadRequest
from mrunner.names import parse
from mrunner.proxy.relay import recorder
from mrunner.proxy.wire import ChunkedEnd, Malformed

SECRET_HEADERS = frozenset(
    (b"authorization", b"proxy-authorization", b"x-api-key", b"api-key", b"cookie", b"set-cookie")
)


@attrs.define(eq=False)
class Record:
    """One request as it happened; the proxy appends the answer, the route fills in the rest."""

    id: int
    model: str
    mode: str
    method: str
    route: str
    started: float
    headers: bytes  # from L{kept_headers}
    body: bytes
    body_size: int
    max_body: int
    status: int = 0
    completed: bool = False
    queued: float | None = None
    first_byte: float | None = None
    ended: float | None = None
    chunked: bool = False
    answer: bytearray = attrs.field(factory=bytearray)
    answer_size: int = 0
    now: Callable[[], float] = attrs.field(default=lambda: 0.0, repr=False)
    #: The name of the key that sent it (never the key), where keys are named.
    key: str | None = None
    #: Where its cached prompt tokens came from, as the prompt cache's turn said (L{cache_source}).
    cache: str | None = None

    def start(self, chunked: bool) -> None:
        """The runner's answer head is in; C{chunked} when the body chunks arrive with their framing."""
        self.chunked = chunked

    def write(self, data: bytes) -> None:
        """A piece of the runner's answer, as it was sent to the client: kept up to C{max_body} bytes."""
        if self.first_byte is None:
            self.first_byte = self.now()
        room = self.max_body - len(self.answer)
        if room > 0:
            self.answer += data[:room]
        self.answer_size += len(data)

    @property
    def size(self) -> int:
        """Bytes this record holds."""
        return len(self.body) + len(self.answer)

    def to_json(self) -> dict[str, Any]:
        """The record as C{GET /engines/requests} shows it; the answer is parsed here, not before."""
        raw = bytes(self.answer)
        if self.chunked:
            raw = unchunk(raw)
        answer = read_answer(raw)
        return {
            "id": self.id,
            "model": self.model,
            "key": self.key,
            "mode": self.mode,
            "method": self.method,
            "route": self.route,
            "status": self.status,
            "completed": self.completed,
            "started": timestamp(self.started),
            "timings": {
                "queued": _since(self.started, self.queued),
                "ttfb": _since(self.started, self.first_byte),
                "total": _since(self.started, self.ended),
            },
            "tokens": answer.pop("tokens"),
            "cached_tokens": answer.pop("cached_tokens"),
            "cache": self.cache,
            "request": {
                "headers": _header_fields(self.headers),
                "body": _decoded(self.body, self.body_size > len(self.body)),
                "size": self.body_size,
                "truncated": self.body_size > len(self.body),
            },
            "answer": {**answer, "size": self.answer_size, "truncated": self.answer_size > self.max_body},
        }


def cache_source(request: IRequest, source: str) -> None:
    """The prompt cache's word on where a turn's cached prompt came from, into the request's record."""
    record = recorder(request)
    if isinstance(record, Record):
        record.cache = source


def _since(start: float, when: float | None) -> float | None:
    return None if when is None else round(max(0.0, when - start), 6)


def _decoded(data: bytes, truncated: bool) -> Any:
    """JSON when C{data} is whole JSON, else its text."""
    text = data.decode("utf-8", errors="replace")
    if truncated:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def unchunk(data: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (as far as C{data} goes, and is well formed)."""
    payload: list[bytes] = []
    with suppress(Malformed):
        ChunkedEnd().feed(data, payload)
    return b"".join(payload)


def read_answer(raw: bytes) -> dict[str, Any]:
    """C{{"stream", "text", "body", "tokens", "cached_tokens"}} from an answer: SSE events, NDJSON lines
    or one JSON body.

    The shapes read are OpenAI's (chat, completions, Responses), Anthropic's and Ollama's.
    """
    stripped = raw.lstrip()
    if stripped.startswith((b"data:", b"event:", b":")):
        return _read_events(line[5:].strip() for line in _lines(raw) if line.startswith("data:"))
    body = _decoded(raw, False)
    if isinstance(body, str) and stripped.startswith(b"{"):  # NDJSON: Ollama's stream
        return _read_events(_lines(raw))
    return {
        "stream": False,
        "text": _text(body),
        "body": body,
        "tokens": _tokens(body),
        "cached_tokens": _cached(body),
    }


def _lines(raw: bytes) -> list[str]:
    return raw.decode("utf-8", errors="replace").splitlines()


def _read_events(datas: Iterable[str]) -> dict[str, Any]:
    pieces: list[str] = []
    tokens = cached = None
    for data in datas:
        if data == "[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        pieces.append(_text(event, delta=True) or "")
        tokens = _tokens(event) or tokens
        found = _cached(event)
        cached = cached if found is None else found
    return {"stream": True, "text": "".join(pieces), "body": None, "tokens": tokens, "cached_tokens": cached}


def _text(body: Any, delta: bool = False) -> str | None:
    """The answer's text, or an event's piece of it, in whichever API's shape it came."""
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):  # OpenAI chat, completions
        choice = choices[0]
        message = choice.get("delta" if delta else "message")
        content = message.get("content") if isinstance(message, dict) else choice.get("text")
    elif isinstance(body.get("message"), dict):  # Ollama chat
        content = body["message"].get("content")
    elif "response" in body and "done" in body:  # Ollama generate
        content = body["response"]
    elif isinstance(body.get("delta"), dict):  # Anthropic content_block_delta
        content = body["delta"].get("text")
    elif body.get("type") == "response.output_text.delta":  # Responses event
        content = body.get("delta")
    else:  # a whole Anthropic message or Responses answer
        content = (
            "".join(_parts_text(body.get("content")))
            or "".join(
                text
                for item in body.get("output") or ()
                if isinstance(item, dict)
                for text in _parts_text(item.get("content"))
            )
            or None
        )
    return content if isinstance(content, str) else None


def _parts_text(parts: Any) -> list[str]:
    """The text of Anthropic's content blocks or Responses' output parts."""
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


# (prompt, completion) token fields of each API's usage object
_USAGE_FIELDS = (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens"))


def _tokens(body: Any) -> dict[str, int] | None:
    """Prompt and completion tokens, from any API's usage or counts, or llama-server's C{timings}."""
    if not isinstance(body, dict):
        return None
    inner = body.get("response") if isinstance(body.get("response"), dict) else body.get("message")
    for usage in (body.get("usage"), inner.get("usage") if isinstance(inner, dict) else None):
        if isinstance(usage, dict):
            for prompt, completion in _USAGE_FIELDS:
                if prompt in usage or completion in usage:
                    return {"prompt": usage.get(prompt, 0), "completion": usage.get(completion, 0)}
    if "eval_count" in body:  # Ollama's last line
        return {"prompt": body.get("prompt_eval_count", 0), "completion": body["eval_count"]}
    timings = body.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings:
        return {"prompt": timings.get("prompt_n", 0), "completion": timings.get("predicted_n", 0)}
    return None


def _cached(body: Any) -> int | None:
    """Prompt tokens the runner found in its cache: each API's own field, or llama-server's C{timings}."""
    if not isinstance(body, dict):
        return None
    inner = body.get("response") if isinstance(body.get("response"), dict) else body.get("message")
    for usage in (body.get("usage"), inner.get("usage") if isinstance(inner, dict) else None):
        if not isinstance(usage, dict):
            continue
        for details in (usage.get("prompt_tokens_details"), usage.get("input_tokens_details")):
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                return details["cached_tokens"]
        if isinstance(usage.get("cache_read_input_tokens"), int):  # Anthropic's
            return usage["cache_read_input_tokens"]
    timings = body.get("timings")
    cache_n = timings.get("cache_n") if isinstance(timings, dict) else None
    return cache_n if isinstance(cache_n, int) else None


@lru_cache(maxsize=256)  # parsing a name costs more than the rest of a record: requests repeat names
def record_key(model: str) -> str:
    """Records are kept by the normalised model name (C{smollm2} is C{ai/smollm2:latest})."""
    try:
        return str(parse(model))
    except BadRequest:
        return model


def kept_headers(headers: Headers) -> bytes:
    """A request's headers without secrets, as C{name: value} lines: one object, not two a field."""
    return b"\n".join(
        name.lower() + b": " + b", ".join(values)
        for name, values in headers.getAllRawHeaders()
        if name.lower() not in SECRET_HEADERS
    )


def _header_fields(kept: bytes) -> dict[str, str]:
    """The fields of L{kept_headers}' lines (a value holds no line break: Twisted's Headers replace them)."""
    lines = kept.decode("latin-1").split("\n") if kept else []
    return dict(line.split(": ", 1) for line in lines)


class Records:
    """The most recent records per model, within a byte budget; followers hear of each as it ends."""

    def __init__(self, per_model: int, max_bytes: int, max_body: int, now: Callable[[], float]):
        self._per_model = per_model
        self._max_bytes = max_bytes
        self._max_body = max_body
        self._now = now
        self._by_model: dict[str, deque[Record]] = {}
        self._bytes = 0
        self._ids = itertools.count(1)
        self._followers: list[Callable[[Record], None]] = []

    def start(
        self, model: str, mode: str, method: bytes, route: bytes, headers: Headers, body: bytes
    ) -> Record:
        """A new record for a request to C{model}; L{end} keeps it."""
        return Record(
            id=next(self._ids),
            model=model,
            mode=mode,
            method=method.decode("ascii", errors="replace"),
            route=route.decode("utf-8", errors="replace"),
            started=self._now(),
            headers=kept_headers(headers),
            body=body[: self._max_body],
            body_size=len(body),
            max_body=self._max_body,
            now=self._now,
        )

    def end(self, record: Record, status: int, completed: bool) -> None:
        """The answer is over (C{completed}, or cut by the client leaving): keep C{record}, dropping
        the oldest past the bounds, and tell followers."""
        record.status = status
        record.completed = completed
        record.ended = self._now()
        kept = self._by_model.setdefault(record.model, deque())
        kept.append(record)
        self._bytes += record.size
        if len(kept) > self._per_model:
            self._bytes -= kept.popleft().size
        while self._bytes > self._max_bytes and self._bytes > record.size:
            self._drop_oldest()
        for follower in list(self._followers):
            follower(record)

    def _drop_oldest(self) -> None:
        oldest = min((kept for kept in self._by_model.values() if kept), key=lambda kept: kept[0].id)
        self._bytes -= oldest.popleft().size

    def recent(self, model: str | None, limit: int, before: int | None = None) -> list[Record]:
        """Up to C{limit} records, newest first, of C{model} or of every model; older than C{before}."""
        kept: Iterable[Record] = (
            self._by_model.get(model, ()) if model else itertools.chain(*self._by_model.values())
        )
        if before is not None:
            kept = (record for record in kept if record.id < before)
        return sorted(kept, key=lambda record: record.id, reverse=True)[:limit]

    def follow(self, follower: Callable[[Record], None]) -> Callable[[], None]:
        """Call C{follower} with each record as it ends; returns what stops that."""
        self._followers.append(follower)
        return lambda: self._followers.remove(follower)
