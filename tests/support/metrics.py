"""A runner's snapshot and llama-server's metrics text, for the tests of what the daemon counts."""

from __future__ import annotations

from mrunner.values import RunnerSnapshot, State

LLAMA_METRICS = b"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def snapshot(name: str, state: State = State.READY) -> RunnerSnapshot:
    return RunnerSnapshot(
        backend="llama.cpp",
        model_name=f"ai/{name}:latest",
        model_id="sha256:" + "a" * 64,
        mode="completion",
        state=state,
        in_use=0,
        parallel=1,
        last_used=0,
        keep_alive=300,
        expires_at=None,
        memory=1,
        memory_estimate=1,
        memory_measured=None,
        pid=1,
        socket=f"/run/{name}.sock",
        pinned=False,
        stale=False,
    )
