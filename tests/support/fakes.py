"""Fakes that record what the scheduling core asks of processes and backends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mrunner.backends.loadlines import LoadReport
from mrunner.errors import NotFound, RunnerFailed
from mrunner.interfaces import IBackend, IDevices, ILoaderEvents, IModelStore, IRunnerProcess
from mrunner.runners.process import RunnerOptions
from mrunner.values import ContextSize, Device, Footprint, RunnerKey
from mrunner.values.backend import Command, RunnerSettings
from mrunner.values.model import Model

#: A fake's timers: a deadline no test reaches unless it means to, the daemon's default grace.
FAKE_OPTIONS = RunnerOptions(load_timeout=3600.0, stop_grace=5.0)


@implementer(IRunnerProcess)
@attrs.define(eq=False)
class FakeProcess:
    """A runner process the test makes ready (C{ready.callback}), fail (C{ready.errback}) or end."""

    socket: str
    pid: int | None = 1
    ready: Deferred[None] = attrs.field(factory=Deferred)
    ended: Deferred[None] = attrs.field(factory=Deferred)
    stops: int = 0
    kills: int = 0
    exits_on_stop: bool = True
    resident: int | None = None
    load_report: LoadReport = attrs.field(factory=LoadReport)
    options: RunnerOptions = FAKE_OPTIONS
    how: str = "exited with code 1"
    started: bool = False
    before_stop: Any = None

    def start(self, on_output: Any) -> None:
        self.started = True

    def healthy(self) -> Deferred[bool]:
        """Answers once the test fires C{ready}: True, or its failure."""
        answer: Deferred[bool] = Deferred()
        self.ready.addCallbacks(lambda _: answer.callback(True), answer.errback)
        return answer

    def opened(self) -> None:
        pass

    def failure(self, why: str) -> RunnerFailed:
        return RunnerFailed(f"runner {why}")

    def terminate(self) -> None:
        self.stops += 1
        if self.exits_on_stop:
            self.exit()

    def kill(self) -> None:
        self.kills += 1

    def exit(self) -> None:
        """The process ends."""
        if not self.ended.called:
            self.ended.callback(None)

    def rss(self) -> int | None:
        return self.resident


@attrs.define
class FakeSpawner:
    """Records every spawn; the test drives each process's readiness."""

    processes: list[FakeProcess] = attrs.field(factory=list)
    keys: list[Any] = attrs.field(factory=list)
    commands: list[Command] = attrs.field(factory=list)

    def __call__(self, key: Any, model: Model, settings: RunnerSettings) -> FakeProcess:
        """The loader's C{spawn}."""
        self.keys.append(key)
        return self.start_runner(Command("runner", ()), f"/run/r{len(self.processes)}.sock")

    def start_runner(self, command: Command, socket: str, *rest: Any) -> FakeProcess:
        """The scheduler's C{start_runner}."""
        process = FakeProcess(socket)
        self.processes.append(process)
        self.commands.append(command)
        return process


@implementer(ILoaderEvents)
@attrs.define
class RecordingEvents:
    """The loader's events in order, without the key and model (one runner's test needs neither)."""

    seen: list[tuple[object, ...]] = attrs.field(factory=list)

    def loaded(self, key: RunnerKey, model: str, seconds: float) -> None:
        self.seen.append(("loaded", seconds))

    def load_failed(self, key: RunnerKey, model: str) -> None:
        self.seen.append(("load_failed",))

    def evicted(self, key: RunnerKey, model: str, reason: str) -> None:
        self.seen.append(("evicted", reason))

    def exited(self, key: RunnerKey, model: str, cause: str) -> None:
        self.seen.append(("exited", cause))


def model(name: str = "ai/smollm2:latest", digest: str = "a" * 64) -> Model:
    return Model(id=f"sha256:{digest}", tags=(name,), created=0, config={}, gguf="/m.gguf")


@implementer(IModelStore)
@attrs.define
class FakeStore:
    models: dict[str, Model] = attrs.field(factory=dict)
    checked: list[str] = attrs.field(factory=list)  # the names of the models L{ready} was asked for
    #: What L{fewest_tokens} answers: None, as for a model with no vocabulary mrunner reads.
    tokens: int | None = None

    def resolve(self, name: str) -> Model:
        for candidate in (name, f"ai/{name}:latest", f"{name}:latest"):
            if candidate in self.models:
                return self.models[candidate]
        raise NotFound(f"model {name!r} not found")

    def list(self) -> list[Model]:
        return list(self.models.values())

    def disk_usage(self) -> int:
        return 0

    def partials_usage(self) -> int:
        return 0

    def ready(self, model: Model) -> Deferred[Model]:
        self.checked.append(model.name)
        return succeed(model)

    def fewest_tokens(self, model: Model, texts: Sequence[str], past: int) -> Deferred[int | None]:
        return succeed(self.tokens)


@implementer(IBackend)
@attrs.define
class FakeBackend:
    """A backend whose install the test finishes or fails."""

    name: str = "llama.cpp"
    manages_models: bool = False
    need: int = 0
    trained: int | None = None
    layers: int = 0
    per_layer: int = 0
    per_device: int = 0
    #: The context it gives when the settings fix none (llama.cpp's is 4096 tokens).
    default_context: int | None = None
    #: Bytes each of a runner's slots adds to C{need} (its whole context's KV cache).
    per_slot: int = 0
    #: The settings of each runner it was asked to start (the plan's placement among them).
    started: list[RunnerSettings] = attrs.field(factory=list)
    installs: list[Deferred[str]] = attrs.field(factory=list)
    reports: list[Any] = attrs.field(factory=list)

    def install(self, report: Any) -> Deferred[str]:
        self.reports.append(report)
        d: Deferred[str] = Deferred()
        self.installs.append(d)
        return d

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        self.started.append(settings)
        return Command("/bin/true", (socket,))

    def memory(self, model: Model, mode: str, settings: RunnerSettings) -> int:
        return self.need + self.per_slot * settings.parallel

    def footprint(self, model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        """C{memory} in RAM, less C{layers} offloadable layers of C{per_layer} bytes when set."""
        host = self.memory(model, mode, settings) - self.layers * self.per_layer
        return Footprint(host, self.layers, self.per_layer, self.per_device)

    def context(self, model: Model, settings: RunnerSettings) -> ContextSize:
        """As llama-server: at most C{trained} tokens a request, when set."""
        asked = settings.context_size or self.default_context
        return ContextSize(asked, min(asked, self.trained) if asked and self.trained else asked)

    def disk_usage(self) -> int:
        return 0

    def uninstall(self) -> Deferred[None]:
        return succeed(None)


@implementer(IDevices)
@attrs.define
class FakeDeviceBudgets:
    """Devices as the test sets them: GPUs with a budget each, and the host's RAM last."""

    gpus: dict[str, int] = attrs.field(factory=dict)
    variant: str = "cuda"
    #: What NVML would measure of each process (by pid) on each GPU.
    processes: dict[int, dict[str, int]] = attrs.field(factory=dict)

    def devices(self) -> list[Device]:
        listed = [Device(id, id, budget, budget, budget) for id, budget in self.gpus.items()]
        return [*listed, Device("CPU", "host", 2**40, 2**40, 0)]

    def refresh(self) -> Deferred[list[Device]]:
        return succeed(self.devices())

    def used_by(self, pid: int) -> dict[str, int]:
        return dict(self.processes.get(pid, {}))

    def check(self) -> None:
        pass

    def watch(self, budgets: Callable[[tuple[tuple[str, int], ...]], object]) -> None:
        budgets(tuple(self.gpus.items()))


def unreachable_runners(socket: str, path: bytes) -> Deferred[tuple[int, bytes]]:
    """A GET of runner sockets that no runner answers on: the scrape of C{/metrics} skips them."""
    return fail(ConnectionRefusedError(socket))
