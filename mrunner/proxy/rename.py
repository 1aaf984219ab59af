"""A runner's answer told in the model name the request asked for, not the runner's own.

llama-server names every answer (C{"model"} of each chat chunk, completion and
Anthropic message) by its one C{--alias}, whatever the request said; the tags of
one model share a runner, so a request for C{ai/smollm2} was answered as
C{localhost:5000/ai/smollm2:latest} when the model had both names (issue 36, N3).
L{Renamed} rewrites that JSON string as the body goes by, only for a request that
named the model otherwise: every other answer is relayed untouched.

What is replaced is the alias as a whole JSON string, quotes included: a model's
text holds a quote inside a string only escaped (C{\\"}), so it matches only a
string value that is exactly the alias, which is the answer's model name.
"""

from __future__ import annotations

import json

import attrs

from mrunner.proxy.connection import BodyReceiver


@attrs.frozen
class Renaming:
    """The runner answers as C{runner}; the client is told C{asked}."""

    runner: str
    asked: str

    def around(self, receiver: BodyReceiver) -> Renamed:
        return Renamed(receiver, json.dumps(self.runner).encode(), json.dumps(self.asked).encode())


def renaming(runner: str, asked: str | None) -> Renaming | None:
    """The renaming an answer needs: None when the request asked by no name (a digest) or by the runner's."""
    return None if asked is None or asked == runner else Renaming(runner, asked)


class Renamed(BodyReceiver):
    """Passes a body on to C{inner} with each C{old} made C{new}, however the pieces cut it.

    The end of a piece that may begin an C{old} is held back until the next piece
    says: a few bytes, and none at the end of a server-sent event (which ends in
    blank lines, never a quote).
    """

    def __init__(self, inner: BodyReceiver, old: bytes, new: bytes):
        self._inner = inner
        self._old = old
        self._new = new
        self._held = b""

    def write(self, data: bytes) -> None:
        data = self._held + data
        last = data.rfind(self._old)
        after = 0 if last < 0 else last + len(self._old)
        split = len(data) - _begun(data[after:], self._old)
        self._held = data[split:]
        if split:
            self._inner.write(data[:split].replace(self._old, self._new))

    def end(self) -> None:
        self._flush()
        self._inner.end()

    def cut(self, why: str, between_chunks: bool) -> None:
        self._flush()
        self._inner.cut(why, between_chunks)

    def _flush(self) -> None:
        held, self._held = self._held, b""
        if held:
            self._inner.write(held)


def _begun(data: bytes, old: bytes) -> int:
    """The length of the longest end of C{data} that is a beginning of C{old} (but not all of it)."""
    for length in range(min(len(data), len(old) - 1), 0, -1):
        if data.endswith(old[:length]):
            return length
    return 0
