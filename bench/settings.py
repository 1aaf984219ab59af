"""How much the bench measures, and the one request shape every scenario sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon and a lighthouse."}]


@dataclass(frozen=True)
class Settings:
    """Sized so that ``make bench`` runs in about six minutes on two cores; each is a command-line option."""

    rounds: int = 5
    wrk_seconds: float = 2.0
    streams_per_round: int = 3
    stream_tokens: int = 256
    load_rounds: int = 6
    parallel: int = 4
    threads: int = 1  # 0: llama-server's default
    default_threads_rounds: int = 5  # scenario 2 again with llama-server's default threads (0: not)
    store_rounds: int = 3
    soak_streams: int = 1000
    soak_seconds: float = 60.0
    soak_events: int = 10
    soak_interval: float = 1.0
    soak_ramp: float = 5.0


def chat(model: str, max_tokens: int, stream: bool, **extra: Any) -> dict[str, Any]:
    """A chat request that generates exactly C{max_tokens} tokens at temperature 0."""
    return {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }
