"""Reading llama-server's chat (or text) completions, whole or as streamed chunks, for the translated APIs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mrunner.teams.meter import counts


class Tally:
    """What an answer adds up to: text, reasoning, tool calls (streamed in pieces), finish reason, counts.

    Feed it streamed chunks with L{add} (each returns the text and reasoning it
    adds) or a whole answer with L{whole}.
    """

    def __init__(self) -> None:
        self.text = ""
        self.reasoning = ""
        self.finish_reason: str | None = None
        self.timings: Mapping[str, Any] = {}
        self.usage: Mapping[str, Any] = {}
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: Mapping[str, Any]) -> tuple[str, str]:
        self.timings = chunk.get("timings") or self.timings
        self.usage = chunk.get("usage") or self.usage
        text = reasoning = ""
        for choice in chunk.get("choices") or ():
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or choice.get("message") or {}
            text += delta.get("content") or choice.get("text") or ""
            reasoning += delta.get("reasoning_content") or ""
            for i, call in enumerate(delta.get("tool_calls") or ()):
                slot = self._calls.setdefault(
                    call.get("index", i), {"id": "", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
        self.text += text
        self.reasoning += reasoning
        return text, reasoning

    def whole(self, answer: Mapping[str, Any]) -> Tally:
        self.add(answer)
        return self

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI's tool calls, whole: C{{"id", "function": {"name", "arguments": str}}}."""
        return [self._calls[i] for i in sorted(self._calls)]

    @property
    def counts(self) -> tuple[int, int]:
        """Prompt (cached tokens included) and generated tokens, as the key's meter counts them."""
        prompt, generated, _ = self._counts()
        return prompt, generated

    @property
    def cached(self) -> int:
        """Of the prompt's tokens, those the runner read from its cache."""
        return self._counts()[2]

    def _counts(self) -> tuple[int, int, int]:
        details = self.usage.get("prompt_tokens_details")
        fields = {**self.timings, **self.usage, **(details if isinstance(details, Mapping) else {})}
        return counts({name: value for name, value in fields.items() if isinstance(value, int)})
