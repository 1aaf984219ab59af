"""A loader's request, as the scheduler builds one, for the unit tests of the loader and its callers."""

from __future__ import annotations

from mrunner.runners.request import LoadRequest
from mrunner.values import RunnerKey
from mrunner.values.backend import COMPLETION, RunnerSettings
from tests.support.fakes import model


def request(
    name: str = "a", mode: str = COMPLETION, parallel: int = 1, keep_alive: float = 300.0, memory: int = 0
):
    digest = name * 64 if len(name) == 1 else name
    return LoadRequest(
        RunnerKey("llama.cpp", f"sha256:{digest}", mode),
        model(f"ai/{name}:latest", digest),
        RunnerSettings(parallel=parallel),
        keep_alive,
        memory,
    )
