"""The tokens an answer used, read from what went to the client: its first and last few KB.

Every API states its usage where a reader of the bytes can find it without
parsing the answer: OpenAI's C{usage} and llama-server's C{timings} come last
(in the body, or in a stream's last events), Anthropic's stream gives its
prompt tokens first (C{message_start}) and its output tokens last, Ollama's
counts are on its last line. So a meter keeps the first L{HEAD} and the last
L{TAIL} bytes, whatever the answer's length (a large embedding included), and
reads the fields by name: a cut event or JSON does not stop it.
"""

from __future__ import annotations

import re
from typing import Any

HEAD = 2048
TAIL = 4096

# Each API's names for (prompt, completion) tokens, the usage objects' before llama-server's timings.
_PROMPT = re.compile(rb'"(prompt_tokens|input_tokens|prompt_eval_count|prompt_n)"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"(completion_tokens|output_tokens|eval_count|predicted_n)"\s*:\s*(\d+)')
_TIMINGS = (b"prompt_n", b"predicted_n")


class Meter:
    """Sees an answer as it is sent (an L{mrunner.runners.relay.Observer}) and tells its tokens."""

    def __init__(self) -> None:
        self._head = b""
        self._tail = b""

    def start(self, chunked: bool) -> None:
        """The answer's head is in (its framing, if any, does not hide the fields)."""

    def write(self, data: bytes) -> None:
        if len(self._head) < HEAD:
            room = HEAD - len(self._head)
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail = (self._tail + data)[-TAIL:] if len(data) < TAIL else data[-TAIL:]

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens the answer reports; 0 for what it does not."""
        text = self._head + b"\n" + self._tail
        return _last(_PROMPT, text), _last(_COMPLETION, text)


def _last(pattern: re.Pattern[bytes], text: bytes) -> int:
    """The last value of a usage field in C{text}; llama-server's timings only when no usage field is."""
    usage = timings = None
    for match in pattern.finditer(text):
        if match.group(1) in _TIMINGS:
            timings = match.group(2)
        else:
            usage = match.group(2)
    found = usage if usage is not None else timings
    return int(found) if found is not None else 0


class Tee:
    """Two observers as one: a request's record and its meter."""

    def __init__(self, *observers: Any):
        self._observers = [observer for observer in observers if observer is not None]

    def start(self, chunked: bool) -> None:
        for observer in self._observers:
            observer.start(chunked)

    def write(self, data: bytes) -> None:
        for observer in self._observers:
            observer.write(data)
