"""The tokens an answer used, read from what its runner sent: its first and last few KB.

Every route's meter sees llama-server's own answer (OpenAI's and Anthropic's
formats), before any translation, and reads the usage fields by name, so a cut
event or JSON does not stop it. OpenAI's C{usage} comes last (in the body or a
stream's last event), and so do llama-server's C{timings}, or in every event
when it was asked for them (C{timings_per_token}, which a token-limited key's
streams ask for); Anthropic's stream gives its prompt first (C{message_start})
and its output last. So a meter keeps the first L{HEAD} and the last L{TAIL}
bytes, whatever the answer's length (a large embedding included), and counts
the events that carry a token, for a stream cut before it said how many it made.

One rule (L{counts}) for every route and mode, which the translated APIs also
tell their clients: the prompt is every prompt token, those read from the
runner's cache included (llama-server's C{timings.prompt_n} counts only those
it computed, and Anthropic's C{input_tokens} leaves out C{cache_read_input_tokens}).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

HEAD = 2048
TAIL = 4096

#: Each API's names for its counts: OpenAI's usage, Anthropic's, llama-server's timings.
_FIELD = re.compile(
    rb'"(prompt_tokens|completion_tokens|cached_tokens|input_tokens|cache_read_input_tokens|output_tokens'
    rb'|prompt_n|cache_n|predicted_n)"\s*:\s*(\d+)'
)
#: What each streamed event that carries a token holds: OpenAI's chunks before the last
#: (chat's and text completions'), Anthropic's content deltas.
_TOKEN_EVENTS = (b'"finish_reason":null', b'"type":"content_block_delta"')
_OVERLAP = max(map(len, _TOKEN_EVENTS)) - 1


def counts(found: Mapping[str, int], events: int = 0) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens from an answer's count fields (by name) and the token
    events seen, by the one rule: OpenAI's usage, else Anthropic's, else llama-server's timings;
    a completion no field counts (a stream cut before its end) is its token events."""
    if "prompt_tokens" in found:
        prompt = found["prompt_tokens"]
    elif "input_tokens" in found:
        prompt = found["input_tokens"] + found.get("cache_read_input_tokens", 0)
    else:
        prompt = found.get("prompt_n", 0) + found.get("cache_n", 0)
    completion = next(
        (found[name] for name in ("completion_tokens", "output_tokens", "predicted_n") if name in found), 0
    )
    cached = next(
        (found[name] for name in ("cached_tokens", "cache_read_input_tokens", "cache_n") if name in found), 0
    )
    return prompt, completion or events, cached


class Meter:
    """Sees a runner's answer as it comes (an L{mrunner.proxy.relay.Observer}) and tells its tokens."""

    def __init__(self) -> None:
        self._head = b""
        self._tail = b""
        self._events = 0
        self._last = b""

    def start(self, chunked: bool) -> None:
        """The answer's head is in (its framing, if any, does not hide the fields)."""

    def write(self, data: bytes) -> None:
        self._count(data)
        if len(self._head) < HEAD:
            room = HEAD - len(self._head)
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail = (self._tail + data)[-TAIL:] if len(data) < TAIL else data[-TAIL:]

    def _count(self, data: bytes) -> None:
        """Count the token events in C{data}, and one split between the last write and this one (it
        starts in the bytes kept from before, shorter than a marker, and ends in C{data})."""
        for marker in _TOKEN_EVENTS:
            short = len(marker) - 1
            self._events += data.count(marker) + (self._last[-short:] + data[:short]).count(marker)
        self._last = data[-_OVERLAP:] if len(data) >= _OVERLAP else (self._last + data)[-_OVERLAP:]

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens the answer used (L{counts}); 0 for what it does not tell."""
        found = {name.decode(): int(value) for name, value in _FIELD.findall(self._head + b"\n" + self._tail)}
        prompt, completion, _ = counts(found, self._events)
        return prompt, completion
