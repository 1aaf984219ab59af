"""The scheduler's values as the HTTP API shows them: runners in C{/engines/ps}, installs, preloads.

A preload that failed shows wherever a person looks for what runs: a row of C{/engines/ps}
in state C{failed} with its error, an entry of C{/engines/status}, and C{/ready}'s C{failed}.
"""

from __future__ import annotations

import math
from typing import Any

from mrunner.values import InstallState, InstallStatus, Preload, PreloadState, RunnerSnapshot, State, Waiting
from mrunner.values.backend import COMPLETION
from mrunner.values.durations import timestamp


def runner_json(runner: RunnerSnapshot) -> dict[str, Any]:
    """One runner as C{GET /engines/ps} shows it; C{memory} is what the budget counts."""
    return {
        "backend_name": runner.backend,
        "model_name": runner.model_name,
        "model_id": runner.model_id,
        "mode": runner.mode,
        "state": runner.state.value,
        "loading": runner.state is State.LOADING,
        "draining": runner.state is State.DRAINING,
        "in_use": runner.in_use,
        "parallel": runner.parallel,
        "parallel_configured": runner.slots_asked or runner.parallel,
        "last_used": timestamp(runner.last_used),
        "keep_alive": None if runner.pinned else seconds_or_forever(runner.keep_alive),
        "expires_at": None if runner.expires_at is None else timestamp(runner.expires_at),
        "pinned": runner.pinned,
        "stale": runner.stale,
        "memory": runner.memory,
        "memory_estimate": runner.memory_estimate,
        "memory_measured": runner.memory_measured,
        "pid": runner.pid,
        "socket": runner.socket,
        "context_size": runner.context.in_force,
        "context_size_configured": runner.context.asked,
        "warning": runner.notes(),
        "devices": dict(runner.devices),
        "gpu_layers": runner.gpu_layers,
        "processor": runner.shares(),
        "instance": runner.instance,
    }


def with_queue(rows: list[dict[str, Any]], queue: list[Waiting]) -> list[dict[str, Any]]:
    """C{rows} (runners) with the queue for each model: C{waiting} and C{oldest_wait} (seconds) on its
    first instance's row, and a row in state C{waiting} for a model that waits for its runner to start."""
    found = {(w.backend, w.model_id, w.mode): w for w in queue}
    for row in rows:
        waiting = (
            found.pop((row["backend_name"], row["model_id"], row["mode"]), None)
            if not row["instance"]
            else None
        )
        row["waiting"] = waiting.count if waiting else 0
        row["oldest_wait"] = round(waiting.oldest_seconds, 3) if waiting else None
    absent = [
        {**_absent(w.backend, w.model_name, w.mode, "waiting"), "model_id": w.model_id, "waiting": w.count}
        | {"oldest_wait": round(w.oldest_seconds, 3)}
        for w in found.values()
    ]
    return rows + absent


def seconds_or_forever(seconds: float) -> float | None:
    """A keep-alive in seconds; None (for ever) when negative or not a finite number."""
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def install_text(status: InstallStatus) -> str:
    """C{"Running: llama.cpp b1"}, C{"Installing: compiling 12/40"}, C{"Not Installed"}, C{"Error: …"}."""
    return f"{status.state.value}: {status.detail}" if status.detail else status.state.value


def install_ready(status: InstallStatus) -> bool:
    return status.state is InstallState.RUNNING


def preload_json(preload: Preload) -> dict[str, Any]:
    return {"model": preload.model, "state": preload.state.value, "error": preload.error}


def failed_preloads(preloads: list[Preload]) -> list[Preload]:
    return [preload for preload in preloads if preload.state is PreloadState.FAILED]


def failed_preload_json(preload: Preload, backend: str) -> dict[str, Any]:
    """A preload that failed, as a row of C{/engines/ps}: the runner that is not there, and why."""
    return {**_absent(backend, preload.model, COMPLETION, preload.state.value), "error": preload.error}


def _absent(backend: str, model: str, mode: str, state: str) -> dict[str, Any]:
    """A row of C{/engines/ps} for a runner that is not there (yet), in C{state}."""
    return {
        "backend_name": backend,
        "model_name": model,
        "model_id": None,
        "mode": mode,
        "state": state,
        "loading": False,
        "draining": False,
        "in_use": 0,
        "parallel": 0,
        "last_used": None,
        "keep_alive": None,
        "expires_at": None,
        "pinned": False,
        "stale": False,
        "memory": 0,
        "memory_estimate": 0,
        "memory_measured": None,
        "pid": None,
        "socket": None,
        "devices": {},
        "gpu_layers": 0,
        "processor": None,
        "instance": 0,
    }


def failed_preload_statuses(preloads: list[Preload]) -> dict[str, str]:
    """C{/engines/status}'s entries for preloads that failed: C{{"preload NAME": "Error: why"}}."""
    return {f"preload {preload.model}": f"Error: {preload.error}" for preload in failed_preloads(preloads)}
