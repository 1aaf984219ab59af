"""Scenario 14, "four agents" (issue 49): four agents' conversations at once on one SmolLM2 runner, each
turn's prompt 2,350 to 2,750 tokens and growing (the four together past one context of 8,192 from the
first turn), through mrunner and sent to ``llama-server`` direct.

A context size is what one request may use, so with C{parallel = 4} mrunner's runner holds four whole
contexts (C{--ctx-size} 4 x 8,192, SmolLM2's trained context): every turn must be a 200, none
llama-server's "Context size has been exceeded". The direct ``llama-server`` runs mrunner's runner's
command line, read back from the kernel, so both have the same pool and flags. Each agent sends its
turns one after another, each turn its conversation so far with the answer and a new user message
appended; the four agents run at once. The figures: turns not answered 200, the generated tokens over
the wall time from the first send to the last answer, the slowest turn, and the runner's resident
memory at its peak against mrunner's estimate for it. mrunner runs first, then direct, once each: on a
shared machine the ratios are what to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import conversation, daemon, http, proc, servers
from bench.report import Goal, Row, share
from bench.servers import Target
from bench.settings import CHAT, Settings

MODEL = conversation.SMOLLM2
SCENARIO = "14 four agents"
AGENTS = 4
#: SmolLM2's trained context: each agent's last turn (about 2,750 tokens and its answer) fits one.
CONTEXT = 8192
TURNS = 3
#: Each answer's tokens (C{ignore_eos}: exactly these): the prompts, not the answers, are the load.
ANSWER_TOKENS = 16
#: Notes in an agent's first message (about 2,350 tokens: the four past 8,192, one pool of one
#: context, at the first turn) and in each later one (about 200 more).
FIRST_NOTES, MORE_NOTES = 100, 8
#: Seconds one turn may take: four prefills of 2,350 tokens on one busy core take a minute or two.
TURN_TIMEOUT = 1800.0
#: The slowest turn's allowance over direct's, for the machine's noise.
SLOWEST_ALLOWANCE_S = 1.0
#: How far mrunner's estimate of its runner's memory may be from the runner's peak RSS: the budget
#: admits runners by the estimate, so it is overrun or left idle by as much.
ESTIMATE_SPREAD = 0.1
FAILED, RATE, SLOWEST = "turns_not_200", "tokens_per_s", "slowest_turn_s"

Figures = dict[str, float]


@dataclass(frozen=True)
class Turn:
    """One turn as its agent saw it: the status, the seconds to the whole answer, its token counts."""

    status: int
    seconds: float
    prompt_tokens: int
    tokens: int


def notes(agent: int, turn: int, count: int) -> str:
    """C{count} notes for C{agent}'s C{turn}, none of them in another agent's conversation."""
    return " ".join(
        f"Note {agent}.{turn}.{i}: the {conversation.COLOURS[i % 4]} box on shelf {i % 9} "
        f"holds {i * 7 + turn + agent} marbles."
        for i in range(count)
    )


def message(agent: int, turn: int) -> dict[str, str]:
    """C{agent}'s user message at C{turn}: its notes and a question."""
    count = FIRST_NOTES if turn == 0 else MORE_NOTES
    return {"role": "user", "content": f"More notes.\n{notes(agent, turn, count)}\nWhich shelf has the most?"}


def opening(agent: int) -> list[dict[str, str]]:
    system = f"You are agent {agent}, a careful assistant. Answer in one short sentence."
    return [{"role": "system", "content": system}, message(agent, 0)]


def talk(url: str, agent: int) -> list[Turn]:
    """C{agent}'s C{TURNS} turns, each its conversation so far with the last answer and a new message."""
    messages = opening(agent)
    turns = []
    with http.client(timeout=TURN_TIMEOUT) as client:
        for turn in range(1, TURNS + 1):
            body = {
                "model": MODEL,
                "messages": messages,
                "max_tokens": ANSWER_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            }
            began = time.perf_counter()
            response = client.post(f"{url}{CHAT}", json=body)
            seconds = time.perf_counter() - began
            answer: dict[str, Any] = response.json() if response.status_code == 200 else {}
            usage = answer.get("usage", {})
            turns.append(
                Turn(
                    response.status_code,
                    seconds,
                    usage.get("prompt_tokens", 0),
                    usage.get("completion_tokens", 0),
                )
            )
            content = answer["choices"][0]["message"]["content"] if answer else ""
            messages += [{"role": "assistant", "content": content}, message(agent, turn)]
    return turns


def run(url: str) -> tuple[Figures, list[Turn]]:
    """The four agents at once against C{url}: the figures and every turn."""
    began = time.perf_counter()
    with ThreadPoolExecutor(AGENTS) as pool:
        turns = [turn for agent in pool.map(lambda n: talk(url, n), range(AGENTS)) for turn in agent]
    wall = time.perf_counter() - began
    return figures(turns, wall), turns


def figures(turns: list[Turn], wall: float) -> Figures:
    return {
        FAILED: sum(turn.status != 200 for turn in turns),
        RATE: sum(turn.tokens for turn in turns) / wall,
        SLOWEST: max(turn.seconds for turn in turns),
    }


@contextmanager
def paths(tmp: Path, executable: Path, settings: Settings) -> Iterator[tuple[Target, Target, list[str]]]:
    """mrunner with SmolLM2's runner loaded, and llama-server direct with that runner's command line
    (yielded too)."""
    conf = daemon.llama_conf(executable, AGENTS, settings.threads, CONTEXT)
    with daemon.started(tmp / "agents-home", conf, "llama.cpp") as mrunner:
        daemon.import_model(mrunner.url, MODEL, conversation.smollm2())
        conversation.ask(mrunner.url, MODEL, [{"role": "user", "content": "hi"}], max_tokens=1)
        argv = daemon.runner_argv(mrunner.url)
        with servers.llama_server(argv, tmp, "agents-direct") as direct:
            yield mrunner, direct, argv


def runner(url: str) -> dict[str, Any]:
    """mrunner's one runner as C{/engines/ps} shows it."""
    with http.client(timeout=10.0) as client:
        (row,) = client.get(f"{url}/engines/ps").raise_for_status().json()
    found: dict[str, Any] = row
    return found


def peak_mb(pid: int) -> float:
    """A process's resident megabytes (10^6 bytes) at their peak so far (VmHWM)."""
    return proc.memory_kib(pid, "VmHWM") * 1024 / 1e6


def measure(tmp: Path, executable: Path, settings: Settings, progress: Callable[[str], None]) -> list[Row]:
    """The four agents through mrunner, then direct; the runners' peak memory; mrunner's estimate."""
    results = {}
    with paths(tmp, executable, settings) as (mrunner, direct, argv):
        for name, target in (("mrunner", mrunner), ("direct", direct)):
            progress(f"14: four agents, {TURNS} turns each, through {name}")
            results[name] = run(target.url)
        ps = runner(mrunner.url)
        memory = {"direct": peak_mb(direct.pids[0]), "mrunner": peak_mb(ps["pid"])}
    details = {
        "prompt_tokens_least_most": {
            name: (min(t.prompt_tokens for t in turns), max(t.prompt_tokens for t in turns))
            for name, (_, turns) in results.items()
        },
        "ctx_size": int(argv[argv.index("--ctx-size") + 1]),
        "parallel": ps["parallel"],
        "context_size": ps["context_size"],
        "daemon_measured_mb": ps["memory_measured"] and ps["memory_measured"] / 1e6,
    }
    figures = {name: figures for name, (figures, _) in results.items()}
    return rows(figures, memory, ps["memory_estimate"], details)


def rows(results: dict[str, Figures], memory: Figures, estimate: int, details: dict[str, Any]) -> list[Row]:
    """Scenario 14's rows: every turn a 200, tokens/s, the slowest turn, the runners' peak memory and
    mrunner's estimate against its runner's."""
    at = {key: {name: figures[key] for name, figures in results.items()} for key in (FAILED, RATE, SLOWEST)}
    turns = f"{AGENTS} agents x {TURNS} turns"
    return [
        Row(
            SCENARIO,
            f"turns not 200, {turns}",
            at[FAILED],
            Goal("0: every turn 200", lambda v: v["mrunner"] == 0),
            details,
        ),
        Row(SCENARIO, f"tokens/s, {turns}", at[RATE], share("direct", 0.9)),
        Row(
            SCENARIO,
            "slowest turn s",
            at[SLOWEST],
            Goal(
                f"<= 1.5 x direct + {SLOWEST_ALLOWANCE_S:g} s",
                lambda v: v["mrunner"] <= 1.5 * v["direct"] + SLOWEST_ALLOWANCE_S,
            ),
        ),
        Row(SCENARIO, "runner's peak RSS MB", memory),
        Row(
            SCENARIO,
            "memory estimate MB; direct: mrunner's runner's peak RSS",
            {"direct": memory["mrunner"], "mrunner": estimate / 1e6},
            Goal(
                f"within {ESTIMATE_SPREAD:.0%} of direct",
                lambda v: abs(v["mrunner"] - v["direct"]) <= ESTIMATE_SPREAD * v["direct"],
            ),
        ),
    ]
