"""C{mrunner bench MODEL}: tokens per second at several concurrencies, as C{docker model bench} measures.

Everything goes through the daemon's own OpenAI chat route, as a client's
requests would: first a load-only request (C{X-Preload-Only}), timed apart as
the load time, then for each concurrency that many streamed requests at once,
each asking for C{max_tokens} tokens (C{ignore_eos}, so a model that stops
early still makes them) after a prompt of about C{prompt_tokens}. The token
counts are the runner's own (C{usage}); the time to first token is the first
content chunk's arrival.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
from rich.table import Table

from mrunner.cli.chat import CHAT_PATH, Chat
from mrunner.cli.client import Daemon, lines
from mrunner.cli.context import Context
from mrunner.cli.output import show_json

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_PROMPT_TOKENS = 128
DEFAULT_MAX_TOKENS = 128
BAR_WIDTH = 30

Clock = Callable[[], float]


@attrs.frozen
class Sample:
    """One request: seconds to its first token and to its end, and the runner's token counts."""

    first_token: float
    seconds: float
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class Level:
    """The requests sent at once at one concurrency, and the wall time they took together."""

    concurrency: int
    seconds: float
    samples: tuple[Sample, ...]

    @property
    def tokens_per_second(self) -> float:
        return sum(s.completion_tokens for s in self.samples) / self.seconds if self.seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        firsts = [s.first_token for s in self.samples]
        return {
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "prompt_tokens": sum(s.prompt_tokens for s in self.samples),
            "completion_tokens": sum(s.completion_tokens for s in self.samples),
            "time_to_first_token": {"mean": sum(firsts) / len(firsts), "max": max(firsts)},
        }


def prompt(tokens: int) -> str:
    """About C{tokens} tokens of prompt: one short common word is one token in most vocabularies."""
    return " ".join(["hello"] * max(tokens, 1))


def one_request(daemon: Daemon, body: dict[str, Any], clock: Clock = time.monotonic) -> Sample:
    started = clock()
    first = None
    usage: dict[str, Any] = {}
    with daemon.open("POST", CHAT_PATH, body) as response:
        for line in lines(response):
            data = line.removeprefix(b"data:").strip()
            if not line.startswith(b"data:") or data == b"[DONE]":
                continue
            event = json.loads(data)
            usage = event.get("usage") or usage
            if first is None and any(
                (c.get("delta") or {}).get("content") for c in event.get("choices") or []
            ):
                first = clock()
    ended = clock()
    return Sample(
        (first or ended) - started,
        ended - started,
        int(usage.get("prompt_tokens", 0)),
        int(usage.get("completion_tokens", 0)),
    )


def level(daemon: Daemon, body: dict[str, Any], concurrency: int, clock: Clock = time.monotonic) -> Level:
    """C{concurrency} requests sent at once; the level's time is from the first sent to the last ended."""
    started = clock()
    with ThreadPoolExecutor(concurrency) as pool:
        samples = list(pool.map(lambda _: one_request(daemon, body, clock), range(concurrency)))
    return Level(concurrency, clock() - started, tuple(samples))


def load(chat: Chat, clock: Clock = time.monotonic) -> float:
    """Seconds the load-only request took: the runner's load (nothing when it is loaded already; a
    backend's install too, while one is under way)."""
    started = clock()
    chat.preload()
    return clock() - started


def bench(context: Context, args: argparse.Namespace) -> None:
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt(args.prompt_tokens)}],
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not args.json:
        context.err.print(f"loading {args.model}…", markup=False)
    loaded = load(Chat(context.daemon, context.err, args.model))
    levels = []
    for concurrency in args.concurrency:
        if not args.json:
            context.err.print(f"{concurrency} at once…", markup=False)
        levels.append(level(context.daemon, body, concurrency))
    if args.json:
        show_json(context.out, report(args, loaded, levels))
        return
    context.out.print(f"{args.model}: loaded in {loaded:.2f}s", markup=False)
    context.out.print(table(levels))


def report(args: argparse.Namespace, loaded: float, levels: Sequence[Level]) -> dict[str, Any]:
    return {
        "model": args.model,
        "load_seconds": loaded,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "levels": [one.as_json() for one in levels],
    }


def table(levels: Sequence[Level]) -> Table:
    """A row per concurrency, with a bar of its tokens per second against the fastest."""
    most = max((one.tokens_per_second for one in levels), default=0.0) or 1.0
    grid = Table(box=None)
    for name, justify in (
        ("at once", "right"),
        ("tokens/s", "right"),
        ("", "left"),
        ("first token", "right"),
    ):
        grid.add_column(name, justify=justify)  # type: ignore[arg-type]
    for one in levels:
        first = one.as_json()["time_to_first_token"]["mean"]
        bar = "█" * max(1, round(BAR_WIDTH * one.tokens_per_second / most))
        grid.add_row(str(one.concurrency), f"{one.tokens_per_second:.1f}", bar, f"{first * 1000:.0f} ms")
    return grid


def concurrencies(text: str) -> tuple[int, ...]:
    """C{--concurrency 1,2,4}: positive whole numbers, in the order given."""
    words = [word.strip() for word in text.split(",")]
    if not all(word.isascii() and word.isdigit() and int(word) > 0 for word in words):
        raise argparse.ArgumentTypeError(f"expected positive whole numbers like 1,2,4,8, got {text!r}")
    return tuple(int(word) for word in words)
