"""A request is decided once, in Gateway.begin: the scheduler takes the resolved request as it is,
the GPUs' budgets are pushed by the devices rather than asked for per load, and the fit check runs
only for a load (issue 37, point 2)."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import attrs
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from mrunner.api.observe.records import Records
from mrunner.api.openai.gateway import Gateway
from mrunner.config import Config, GPUConfig, SchedulerConfig
from mrunner.daemon.metrics import Metrics
from mrunner.devices.inventory import Devices
from mrunner.errors import NotFound, Unprocessable
from mrunner.scheduling.facade import Scheduler
from mrunner.values import Device
from mrunner.values.backend import COMPLETION
from mrunner.values.model import Model
from mrunner.values.request import Resolved
from tests.support.devices import CUDA0, GIB, FakeSource
from tests.support.fakes import FakeBackend, FakeDeviceBudgets, FakeSpawner, FakeStore, model

A, B = "ai/a:latest", "ai/b:latest"
MIB = 2**20


@attrs.define
class CountingStore(FakeStore):
    """A store that counts the names it was asked to resolve."""

    resolved: list[str] = attrs.field(factory=list)

    def resolve(self, name: str) -> Model:
        self.resolved.append(name)
        return super().resolve(name)


@attrs.define
class CountingDevices(FakeDeviceBudgets):
    """Devices that count how often they were listed whole (which costs a snapshot of every runner)."""

    listed: int = 0

    def devices(self) -> list[Device]:
        self.listed += 1
        return super().devices()


class SchedulerTakesTheResolvedRequestTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend(need=4 * MIB, layers=4, per_layer=MIB)
        self.store = CountingStore({name: model(name, name[3] * 64) for name in (A, B)})
        self.spawn = FakeSpawner()

    def make(self, budget: int = 10 * MIB, devices: FakeDeviceBudgets | None = None) -> Scheduler:
        self.config = Config(
            home=Path(self.mktemp()),
            scheduler=SchedulerConfig(max_runners=4, memory_budget=budget, keep_alive=300),
        )
        scheduler = Scheduler(
            self.clock,
            self.config,
            {"llama.cpp": self.backend},
            self.store,
            self.spawn.start_runner,
            devices=devices,
        )
        scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        return scheduler

    def serve(self, scheduler: Scheduler, name: str) -> None:
        d = scheduler.acquire(Resolved("llama.cpp", self.store.models[name], COMPLETION))
        if self.spawn.processes and not self.spawn.processes[-1].ready.called:
            self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()

    def test_the_model_is_not_looked_up_again(self) -> None:
        scheduler = self.make()
        self.serve(scheduler, A)  # a load
        self.serve(scheduler, A)  # served by the runner there
        self.assertEqual(self.store.resolved, [], "the scheduler resolves no name")
        self.assertEqual(self.store.checked, [A], "the files are checked before the load alone")

    def test_the_devices_are_not_listed_for_a_load(self) -> None:
        gpus = CountingDevices({"CUDA0": 40 * MIB})
        scheduler = self.make(devices=gpus)
        self.serve(scheduler, A)
        self.serve(scheduler, A)
        self.assertEqual(gpus.listed, 0, "the budgets were pushed (IDevices.watch), not asked for")
        placement = self.backend.started[-1].placement
        assert placement is not None
        self.assertEqual(placement.layers, (("CUDA0", 4),), "the pushed budget placed it")

    def test_the_fit_check_runs_only_for_a_load(self) -> None:
        scheduler = self.make(budget=10 * MIB)
        self.serve(scheduler, A)
        scheduler.reconfigure(
            attrs.evolve(self.config, scheduler=attrs.evolve(self.config.scheduler, memory_budget=2 * MIB))
        )
        self.serve(scheduler, A)  # loaded already: served, as the runner there fits
        d = scheduler.acquire(Resolved("llama.cpp", self.store.models[B], COMPLETION))
        self.assertEqual(self.failureResultOf(d, Unprocessable).value.code, "model_too_large")


class DevicesPushTheirBudgetsTests(SynchronousTestCase):
    def test_pushed_at_once_and_when_listed_again(self) -> None:
        used: list[int] = []

        def held() -> dict[str, int]:
            used.append(1)
            return {}

        source = FakeSource([CUDA0])
        inventory = Devices(source, GPUConfig(memory_budget=0.5), lambda: 0, held, host=lambda: (GIB, GIB))
        pushed: list[tuple[tuple[str, int], ...]] = []
        inventory.watch(pushed.append)
        self.assertEqual(pushed, [(("CUDA0", CUDA0.total // 2),)])
        inventory.check()
        self.assertEqual(len(pushed), 1, "the same budgets are not pushed again")
        source.found = []
        self.successResultOf(inventory.refresh())
        self.assertEqual(pushed[1:], [()], "a GPU gone from the listing is gone from the budgets")
        self.assertEqual(used, [1], "only refresh's answer asked what runners hold; the budgets never do")


class GatewayBeginsOnceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.store = FakeStore({A: model(A)})
        backend = FakeBackend()
        self.scheduler = Scheduler(
            self.clock, Config(), {"llama.cpp": backend}, self.store, FakeSpawner().start_runner
        )
        self.records = Records(10, 2**20, 2**20, self.clock.seconds)
        self.gateway = Gateway(self.scheduler, self.store, Metrics(), self.clock, 1000, self.records)

    def chat(self, body: dict[str, object]) -> DummyRequest:
        request = DummyRequest([b"v1", b"chat", b"completions"])
        request.method, request.path, request.code = b"POST", b"/v1/chat/completions", 200
        request.content = BytesIO(json.dumps(body).encode())
        self.hooked = 0
        finish = request.notifyFinish

        def counted():  # type: ignore[no-untyped-def]
            self.hooked += 1
            return finish()

        request.notifyFinish = counted  # type: ignore[method-assign]
        return request

    def test_one_resolved_request_and_one_hook_on_the_end(self) -> None:
        request = self.chat({"model": "a", "keep_alive": "5m", "messages": []})
        asked = self.gateway.begin(request, COMPLETION, None, lambda payload: None)
        self.assertEqual(asked.resolved, Resolved("llama.cpp", self.store.models[A], COMPLETION, 300.0, 1))
        self.assertEqual(self.hooked, 1, "the metrics and the record end on one hook")
        request.finish()
        assert asked.record is not None
        self.assertEqual((asked.record.status, asked.record.completed), (200, True), "ended by that hook")

    def test_a_missing_model_is_refused_once_recorded(self) -> None:
        request = self.chat({"model": "nothing", "messages": []})
        asked = self.gateway.begin(request, COMPLETION, None, lambda payload: None)
        self.assertIsNotNone(asked.record, "recorded, as before the model was resolved in begin")
        self.assertRaises(NotFound, lambda: asked.resolved)
