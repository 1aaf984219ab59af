"""A runner as a frozen L{RunnerSnapshot}: what C{/engines/ps}, the metrics and the page see."""

from __future__ import annotations

from collections.abc import Mapping

from mrunner.errors import NotFound
from mrunner.interfaces import IBackend
from mrunner.runners.runner import Runner
from mrunner.scheduling.configured import Configured
from mrunner.values import HOST, RunnerSnapshot


def snapshot(runner: Runner, configured: Configured, backends: Mapping[str, IBackend]) -> RunnerSnapshot:
    """C{runner} now; C{stale} when the settings in force would start it otherwise."""
    model, key = runner.request.model, runner.key
    try:
        wanted = configured.runner(configured.model(key.backend, model))
    except NotFound:  # its draft model was removed: the next load fails, so this runner is stale
        wanted = None
    return RunnerSnapshot(
        backend=key.backend,
        model_name=model.name,
        model_id=key.model,
        mode=key.mode,
        state=runner.state,
        in_use=runner.in_use,
        parallel=runner.parallel,
        last_used=runner.finished_at,
        keep_alive=runner.keep_alive,
        expires_at=runner.expires_at,
        memory=runner.memory,
        memory_estimate=runner.request.memory,
        memory_measured=runner.process.rss(),
        pid=runner.process.pid,
        socket=runner.socket,
        pinned=runner.pinned,
        stale=runner.request.asked != wanted,
        context=backends[key.backend].context(model, runner.request.settings),
        devices={**runner.on_gpus, HOST: runner.memory},
        gpu_layers=runner.gpu_layers,
        instance=key.instance,
        slots_asked=runner.request.slots_asked,
    )
