"""How many tokens a request may make its runner generate, read as the runner reads it, per API.

A key's token budget reserves what a request may still generate, so the field
read here must be the one the runner obeys: llama-server's OpenAI routes take
C{n_predict} before C{max_completion_tokens} before C{max_tokens} (a request
with C{max_tokens: 1, n_predict: 1000} makes 1,000), and C{n} answers, or one
per prompt of C{/v1/completions}, each that long; its Anthropic route reads
C{max_tokens} alone; Ollama's C{options.num_predict} and the Responses API's
C{max_output_tokens} become the C{max_tokens} of the chat mrunner asks for.
For a key with a token limit the length reserved is also written into the
runner's body (L{Length.imposed}), where the runner reads it first, so the
runner never generates more than was reserved, whatever else the body says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs


@attrs.frozen
class Ask:
    """What a request may generate: up to C{tokens} in each of C{answers} answers (None: no limit given,
    the runner goes on until its context is full)."""

    tokens: int | None
    answers: int = 1


#: A request that generates nothing (embeddings, rerank, token counts).
NOTHING = Ask(0)


def _integer(payload: Mapping[str, Any], *fields: str) -> int | None:
    """The first of C{fields} that C{payload} holds as an integer (a bool is none)."""
    for field in fields:
        value = payload.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _length(value: int | None) -> int | None:
    """A length as llama-server reads it: a negative one (-1, Ollama's -2) is no limit."""
    return None if value is None or value < 0 else value


def openai(payload: Mapping[str, Any]) -> Ask:
    """llama-server's chat and text completions: its own C{n_predict} first, C{n} answers, and a
    completion for each prompt of a list (a list of token ids is one prompt)."""
    tokens = _length(_integer(payload, "n_predict", "max_completion_tokens", "max_tokens"))
    answers = max(1, _integer(payload, "n_cmpl", "n") or 1)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and not all(isinstance(item, int) for item in prompt):
        answers *= max(1, len(prompt))
    return Ask(tokens, answers)


def anthropic(payload: Mapping[str, Any]) -> Ask:
    return Ask(_length(_integer(payload, "max_tokens")))


def ollama(payload: Mapping[str, Any]) -> Ask:
    options = payload.get("options")
    return Ask(_length(_integer(options, "num_predict")) if isinstance(options, Mapping) else None)


def responses(payload: Mapping[str, Any]) -> Ask:
    return Ask(_length(_integer(payload, "max_output_tokens")))


@attrs.frozen
class Length:
    """Where one API's request says how long its answers may be, and where its runner is told."""

    read: Callable[[Mapping[str, Any]], Ask]
    #: The field of the runner's body that it obeys before any other.
    field: str = "n_predict"
    #: Whether the runner can be asked to put its running counts in every streamed event
    #: (llama-server's C{timings_per_token}, on its OpenAI routes; its Anthropic route cannot).
    counts: bool = True

    def imposed(self, body: Mapping[str, Any], cap: int | None) -> dict[str, Any]:
        """C{body} with the length C{cap} written where the runner reads it first, and (streamed) the
        runner asked for its counts in every event, so a stream cut short is charged what it made;
        C{body} itself when there is no cap."""
        if cap is None:
            return dict(body)
        capped = {**body, self.field: cap}
        if self.counts and body.get("stream") is True:
            capped["timings_per_token"] = True
        return capped


OPENAI = Length(openai)
ANTHROPIC = Length(anthropic, "max_tokens", counts=False)
OLLAMA = Length(ollama)
RESPONSES = Length(responses)
#: The routes that generate nothing.
NONE = Length(lambda payload: NOTHING)
