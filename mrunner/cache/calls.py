"""llama-server's slot and template calls, each with a time limit: what the cache asks a runner."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers

from mrunner.cache.anthropic import MESSAGES, chat_body
from mrunner.cache.statefile import token_bytes
from mrunner.proxy.pool import RunnerPool


class Refused(Exception):
    """The runner answered a call with an error."""


class RunnerCalls:
    """C{/slots}, C{/apply-template} and C{/tokenize} on a runner's socket."""

    def __init__(self, pool: RunnerPool, clock: IReactorTime, timeout: float):
        self._pool = pool
        self._clock = clock
        self.timeout = timeout

    def slots(self, socket: str) -> Deferred[Any]:
        """Each slot's id and C{n_prompt_tokens} (how many tokens its KV cache holds)."""
        return self.call(b"GET", socket, b"/slots")

    def save(self, socket: str, slot: int, filename: str) -> Deferred[Any]:
        return self.call(b"POST", socket, b"/slots/%d?action=save" % slot, {"filename": filename})

    def restore(self, socket: str, slot: int, filename: str) -> Deferred[Any]:
        return self.call(b"POST", socket, b"/slots/%d?action=restore" % slot, {"filename": filename})

    def erase(self, socket: str, slot: int) -> Deferred[Any]:
        return self.call(b"POST", socket, b"/slots/%d?action=erase" % slot)

    async def tokens(self, socket: str, path: bytes, payload: dict[str, Any]) -> bytes:
        """C{payload}'s prompt as the runner reads it: its chat template applied (to an Anthropic
        request once converted as llama-server converts it), then tokenized with the special tokens
        it adds (as llama-server tokenizes a completion's prompt)."""
        if path.endswith((b"/chat/completions", MESSAGES)):
            chat = chat_body(payload) if path.endswith(MESSAGES) else payload
            prompt = (await self.call(b"POST", socket, b"/apply-template", chat))["prompt"]
        else:
            prompt = payload["prompt"]
        tokenized = await self.call(b"POST", socket, b"/tokenize", {"content": prompt, "add_special": True})
        return token_bytes(tokenized["tokens"])

    def call(self, method: bytes, socket: str, path: bytes, body: object = None) -> Deferred[Any]:
        """The runner's JSON answer to C{method path}; fails with L{Refused} or a timeout."""
        d = ensureDeferred(self._call(method, socket, path, body))
        return d.addTimeout(self.timeout, self._clock)

    async def _call(self, method: bytes, socket: str, path: bytes, body: object) -> Any:
        headers = Headers({b"content-type": [b"application/json"]})
        data = b"" if body is None else json.dumps(body).encode()
        answer = await self._pool.request(method, socket, path, headers, data)
        text = await answer.read()
        if answer.code != 200:
            raise Refused(f"{method.decode()} {path.decode()}: {answer.code} {text[:200]!r}")
        return json.loads(text)
