"""A runner's process for a load: its socket, command line and log (the loader's C{Spawn})."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from twisted.logger import Logger

from mrunner.home import Home
from mrunner.interfaces import IBackend, IRunnerProcess
from mrunner.values import RunnerKey
from mrunner.values.backend import Command, RunnerSettings
from mrunner.values.model import Model

#: A runner's process for a command, socket, log and label, which the runner's machine spawns.
StartRunner = Callable[[Command, str, Path, str], IRunnerProcess]


class Spawner:
    """Names each runner's socket (unique in this process), builds its command, starts its process."""

    log = Logger()

    def __init__(self, home: Home, backends: Mapping[str, IBackend], start_runner: StartRunner) -> None:
        self._home = home
        self._backends = backends
        self._start_runner = start_runner
        self._names = (f"r{os.getpid()}-{n}" for n in itertools.count(1))

    def __call__(self, key: RunnerKey, model: Model, settings: RunnerSettings) -> IRunnerProcess:
        socket = self._home.socket(next(self._names))
        backend = self._backends[key.backend]
        command = backend.command(model, key.mode, socket, settings)
        note = backend.context(model, settings).note(model.name)
        if note is not None:
            self.log.warn("{note}", note=note)
        label = f"{model.name} ({key.mode})"
        return self._start_runner(command, socket, self._home.runner_log(model.name, key.mode), label)
