"""How much the bench measures, and the one request shape every scenario sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon and a lighthouse."}]


@dataclass(frozen=True)
class Settings:
    """Sized so that ``make bench`` runs in about six minutes on two cores; each is a command-line option.

    A field's C{help} is the option's text in C{python -m bench --help}.
    """

    rounds: int = field(
        default=5, metadata={"help": "rounds of scenarios 1, 2, 6 and 9, the paths taking turns"}
    )
    wrk_seconds: float = field(
        default=2.0, metadata={"help": "seconds of each wrk run in scenarios 1, 6 and 9 (small chats)"}
    )
    streams_per_round: int = field(
        default=3, metadata={"help": "streams each path answers in a round of scenario 2"}
    )
    stream_tokens: int = field(default=256, metadata={"help": "tokens in each stream of scenario 2"})
    load_rounds: int = field(default=6, metadata={"help": "rounds of scenarios 3 and 4 (cold loads, swaps)"})
    parallel: int = field(
        default=4, metadata={"help": "each runner's parallel slots ([scheduler] parallel, llama-server -np)"}
    )
    threads: int = field(
        default=1, metadata={"help": "each runner's threads ([runner] threads; 0: llama-server's default)"}
    )
    default_threads_rounds: int = field(
        default=5,
        metadata={"help": "rounds of scenario 2 run again with llama-server's default threads (0: not run)"},
    )
    store_rounds: int = field(
        default=3,
        metadata={"help": "rounds of scenarios 7 and 8, pulls and imports of a 112 MB model (0: not run)"},
    )
    soak_streams: int = field(
        default=1000, metadata={"help": "streams scenario 5 holds open at once (the stand-in runner)"}
    )
    soak_seconds: float = field(default=60.0, metadata={"help": "seconds scenario 5 lasts"})
    soak_events: int = field(default=10, metadata={"help": "events in each stream of scenario 5"})
    soak_interval: float = field(
        default=1.0, metadata={"help": "seconds between a stream's events in scenario 5"}
    )
    soak_ramp: float = field(
        default=5.0, metadata={"help": "seconds over which scenario 5 opens its streams"}
    )
    fast_streams: str = field(
        default="64,256,512,1024",
        metadata={"help": "counts of streams scenario 10 runs through each proxy, comma-separated"},
    )
    fast_rate: float = field(
        default=50.0, metadata={"help": "events a second of each stream of scenario 10 (the C stand-in)"}
    )
    fast_rounds: int = field(
        default=2, metadata={"help": "rounds of scenario 10 at each count, the proxies taking turns"}
    )
    fast_ramp: float = field(
        default=0.5, metadata={"help": "seconds over which scenario 10 opens its streams"}
    )
    fast_seconds: float = field(
        default=1.5, metadata={"help": "seconds of each measured window of scenario 10, once all are open"}
    )
    real_streams: str = field(
        default="1:256,4:256,16:256,64:128,256:32",
        metadata={"help": "scenario 13's counts of streams at once, each with its answers' tokens"},
    )
    real_sizes: str = field(
        default="160,320,16",
        metadata={"help": "scenario 13's sweep of answer sizes at 4 streams: first,last,step"},
    )


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
