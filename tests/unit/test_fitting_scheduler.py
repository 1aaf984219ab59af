"""The scheduler with GPUs (fake devices and processes): the plan's placement reaches the runner,
`ps` shows where its memory is, its load output and NVML correct the plan, an out-of-memory load
retries with fewer layers, then half the context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config
from mrunner.config import Config, ModelConfig, ModelsConfig, SchedulerConfig
from mrunner.errors import RunnerFailed, Unprocessable
from mrunner.scheduling.facade import Scheduler
from mrunner.values import ModelSettings
from mrunner.values.backend import COMPLETION
from mrunner.values.request import Resolved
from tests.support.asking import acquire
from tests.support.fakes import FakeBackend, FakeDeviceBudgets, FakeSpawner, FakeStore, model

A, B = "ai/a:latest", "ai/b:latest"
MIB = 2**20
#: 9 layers of 2 MiB, a 2 MiB compute buffer per GPU, 1 MiB in RAM whatever: 20 MiB on one GPU.
NEED, LAYERS, PER_LAYER, PER_DEVICE = 19 * MIB, 9, 2 * MIB, 2 * MIB

OUT_OF_MEMORY = [
    "ggml_backend_cuda_buffer_type_alloc_buffer:"
    " allocating 18.00 MiB on device 1: cudaMalloc failed: out of memory",
    "alloc_tensor_range: failed to allocate CUDA1 buffer of size 18874368",
]


class GpuSchedulerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend(need=NEED, layers=LAYERS, per_layer=PER_LAYER, per_device=PER_DEVICE)
        self.store = FakeStore({name: model(name, name[3] * 64) for name in (A, B)})
        self.spawn = FakeSpawner()

    def make(
        self,
        gpus: dict[str, int],
        budget: int = 100 * MIB,
        preload: tuple[str, ...] = (),
        nvml: dict[int, dict[str, int]] | None = None,
    ) -> Scheduler:
        config = Config(
            home=Path(self.mktemp()),
            scheduler=SchedulerConfig(max_runners=4, memory_budget=budget, keep_alive=300),
            models=ModelsConfig(preload=preload),
        )
        scheduler = Scheduler(
            self.clock,
            config,
            {"llama.cpp": self.backend},
            self.store,
            self.spawn.start_runner,
            devices=FakeDeviceBudgets(gpus, processes=nvml or {}),
        )
        scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        return scheduler

    def run_out(self, times: int) -> list[list[tuple[str, int]]]:
        """The next C{times} loads run out of device memory: where each of them was placed."""
        placed = []
        for _ in range(times):
            placed.append(self.layers())
            self.spawn.processes[-1].load_report.read(OUT_OF_MEMORY)
            self.spawn.processes[-1].exit()
        return placed

    def layers(self, index: int = -1) -> list[tuple[str, int]]:
        placement = self.backend.started[index].placement
        assert placement is not None
        return list(placement.layers)

    def test_whole_on_the_gpu_that_fits_best(self) -> None:
        scheduler = self.make({"CUDA0": 40 * MIB, "CUDA1": 24 * MIB})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.assertEqual(self.layers(), [("CUDA1", 9)])
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()
        [runner] = scheduler.snapshot()
        self.assertEqual(dict(runner.devices), {"CUDA1": 20 * MIB, "CPU": 1 * MIB})
        self.assertEqual((runner.gpu_layers, runner.shares()), (9, "CUDA1 95% / CPU 5%"))

    def test_spread(self) -> None:
        """A model no one GPU holds is spread over both, in proportion to their room."""
        scheduler = self.make({"CUDA0": 12 * MIB, "CUDA1": 12 * MIB})
        acquire(scheduler, self.store, None, "a", COMPLETION)
        self.assertEqual(self.layers(), [("CUDA0", 5), ("CUDA1", 4)])

    def test_measured_buffers_correct_the_plan(self) -> None:
        scheduler = self.make({"CUDA0": 40 * MIB})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        process = self.spawn.processes[-1]
        process.load_report.read(
            [
                "load_tensors:        CUDA0 model buffer size =    22.00 MiB",
                "llama_kv_cache:      CUDA0 KV buffer size =     4.00 MiB",
                "load_tensors:   CPU_Mapped model buffer size =     3.00 MiB",
            ]
        )
        process.ready.callback(None)
        self.successResultOf(d).release()
        [runner] = scheduler.snapshot()
        self.assertEqual(dict(runner.devices)["CUDA0"], 26 * MIB)
        # Pinned, it stays: the next model plans for what is left after what was measured,
        # 14 MiB, six layers (an estimate of 20 MiB would have left room for seven).
        self.successResultOf(scheduler.configure(None, "a", ModelSettings(pinned=True)))
        acquire(scheduler, self.store, None, "b", COMPLETION)
        self.assertEqual(self.layers(), [("CUDA0", 6)])

    def test_nvml_corrects_the_plan(self) -> None:
        """NVML's use of the runner's process (pid 1) counts the GPU runtime's own memory too: larger
        than its load output (26 MiB), it is what `ps` shows and what the next plan leaves room for."""
        scheduler = self.make({"CUDA0": 40 * MIB}, nvml={1: {"CUDA0": 30 * MIB}, 2: {"CUDA0": 9 * MIB}})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        process = self.spawn.processes[-1]
        process.load_report.read(["load_tensors:        CUDA0 model buffer size =    26.00 MiB"])
        process.ready.callback(None)
        self.successResultOf(d).release()
        [runner] = scheduler.snapshot()
        self.assertEqual(dict(runner.devices)["CUDA0"], 30 * MIB)
        self.successResultOf(scheduler.configure(None, "a", ModelSettings(pinned=True)))
        acquire(scheduler, self.store, None, "b", COMPLETION)
        self.assertEqual(self.layers(), [("CUDA0", 4)], "10 MiB left: a 2 MiB buffer and four layers")

    def test_out_of_memory_retries_with_fewer_layers_once(self) -> None:
        scheduler = self.make({"CUDA0": 40 * MIB, "CUDA1": 24 * MIB})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.assertEqual(self.run_out(2), [[("CUDA1", 9)], [("CUDA1", 6)]])
        self.assertEqual(len(self.spawn.processes), 2)
        error = self.failureResultOf(d, RunnerFailed).value
        self.assertIn("ran out of memory on CUDA1 while loading, with 6 layers offloaded", error.message)

    def test_once_with_fewer_layers_and_half_the_context_when_none_was_set(self) -> None:
        self.backend.default_context = 4096
        scheduler = self.make({"CUDA0": 40 * MIB})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.assertEqual(self.run_out(2), [[("CUDA0", 9)], [("CUDA0", 6)]])
        self.assertEqual([s.context_size for s in self.backend.started], [None, 2048])
        self.assertEqual(len(self.spawn.processes), 2)
        error = self.failureResultOf(d, RunnerFailed).value
        self.assertIn("with 6 layers offloaded and its context halved to 2048 tokens;", error.message)

    def test_half_the_context_loads(self) -> None:
        """It runs with 2048 tokens, as `ps` says; it is not stale: the configuration did not change."""
        self.backend.default_context = 4096
        scheduler = self.make({"CUDA0": 40 * MIB})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.run_out(1)
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()
        [runner] = scheduler.snapshot()
        self.assertEqual((runner.context.asked, runner.stale), (2048, False))
        self.successResultOf(acquire(scheduler, self.store, None, "a", COMPLETION)).release()
        self.assertEqual(len(self.spawn.processes), 2, "later requests go to it")

    def test_the_trained_context_in_its_config_is_no_choice(self) -> None:
        """The store records every GGUF's trained context in its config: that fixes nothing."""
        trained = {"context_size": 8192, "architecture": "llama", "gguf": {"llama.context_length": "8192"}}
        self.store.models[A] = attrs.evolve(self.store.models[A], config=trained)
        self.backend.default_context = 8192
        scheduler = self.make({"CUDA0": 40 * MIB})
        acquire(scheduler, self.store, None, "a", COMPLETION)
        self.run_out(1)
        self.assertEqual([s.context_size for s in self.backend.started], [None, 4096])

    def test_a_context_size_someone_set_is_kept(self) -> None:
        """Set in the model's settings, its flags or its config: no retry with half of it."""
        self.backend.default_context = 4096
        fixed = {
            "settings": ModelSettings(context_size=4096),
            "flags": ModelSettings(flags=("--ctx-size=4096",)),
            "short flag": ModelSettings(flags=("-c", "4096")),
            "config": ModelSettings(),
        }
        for why, settings in fixed.items():
            if why == "config":
                self.store.models[A] = attrs.evolve(self.store.models[A], config={"context_size": 4096})
            scheduler = self.make({"CUDA0": 40 * MIB})
            self.successResultOf(scheduler.configure(None, "a", settings))
            d = acquire(scheduler, self.store, None, "a", COMPLETION)
            self.run_out(2)
            self.assertNotIn("halved", self.failureResultOf(d, RunnerFailed).value.message, why)
            self.successResultOf(scheduler.close())
        self.assertEqual(len(self.spawn.processes), 8, "two loads each, none with half the context")

    def test_too_large_names_the_shortfall(self) -> None:
        """What the GPUs cannot hold must fit in RAM, else a 422 says how far over it is."""
        scheduler = self.make({"CUDA0": 8 * MIB}, budget=10 * MIB)
        error = self.failureResultOf(
            acquire(scheduler, self.store, None, "a", COMPLETION), Unprocessable
        ).value
        self.assertEqual(error.code, "model_too_large")
        self.assertIn(
            "with 3 of its 9 layers on the GPUs (CUDA0 8.00 MiB), CPU needs 13.00 MiB, 3.00 MiB over",
            error.message,
        )

    def test_a_preload_fits_with_the_gpus(self) -> None:
        """A preload is checked against the GPUs and RAM together: 19 MiB with 10 MiB of RAM fits."""
        scheduler = self.make({"CUDA0": 40 * MIB}, budget=10 * MIB, preload=(A,))
        self.assertEqual(self.layers(), [("CUDA0", 9)])
        self.spawn.processes[-1].ready.callback(None)
        self.assertEqual([p.state.value for p in scheduler.preloads()], ["loaded"])

    def test_without_gpus_nothing_changes(self) -> None:
        """Only the host's RAM among the devices: no placement, the command line as before GPUs."""
        scheduler = self.make({})
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()
        self.assertIsNone(self.backend.started[-1].placement)
        [runner] = scheduler.snapshot()
        self.assertEqual(
            (dict(runner.devices), runner.gpu_layers, runner.shares()), ({"CPU": NEED}, 0, "CPU")
        )


class InstancesTests(SynchronousTestCase):
    """C{[models."NAME"] instances = N}: more runners of one model when all are busy, if they fit."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = FakeStore({name: model(name, name[3] * 64) for name in (A, B)})
        self.spawn = FakeSpawner()

    def make(self, backend: FakeBackend, gpus: dict[str, int], budget: int, instances: int = 2) -> Scheduler:
        config = Config(
            home=Path(self.mktemp()),
            scheduler=SchedulerConfig(max_runners=4, memory_budget=budget, keep_alive=300, parallel=1),
            models=ModelsConfig(settings={A: ModelConfig(instances=instances)}),
        )
        self.backend = backend
        scheduler = Scheduler(
            self.clock,
            config,
            {"llama.cpp": backend},
            self.store,
            self.spawn.start_runner,
            devices=FakeDeviceBudgets(gpus),
        )
        scheduler.start()
        backend.installs[-1].callback("llama.cpp test")
        return scheduler

    def test_another_instance_when_busy_and_the_least_busy_serves(self) -> None:
        scheduler = self.make(FakeBackend(need=4), {}, budget=10)
        first = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[0].ready.callback(None)
        held = self.successResultOf(first)
        second = acquire(
            scheduler, self.store, None, "a", COMPLETION
        )  # the first is busy: a second runner starts
        self.assertEqual(len(self.spawn.processes), 2)
        self.spawn.processes[1].ready.callback(None)
        self.assertEqual(self.successResultOf(second).socket, self.spawn.processes[1].socket)
        third = acquire(
            scheduler, self.store, None, "a", COMPLETION
        )  # both busy, no third instance: it waits
        self.assertNoResult(third)
        self.assertEqual(len(self.spawn.processes), 2)
        held.release()
        self.assertEqual(self.successResultOf(third).socket, self.spawn.processes[0].socket)
        self.assertEqual([(r.model_name, r.instance) for r in scheduler.snapshot()], [(A, 0), (A, 1)])

    def test_the_instance_the_prompt_cache_prefers_serves(self) -> None:
        """Both idle, the least busy would be the first; the one whose slot holds the turn serves it."""
        scheduler = self.make(FakeBackend(need=4), {}, budget=10)
        first = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[0].ready.callback(None)
        held = self.successResultOf(first)
        second = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[1].ready.callback(None)
        held.release()
        self.successResultOf(second).release()
        asked: list[tuple[object, ...]] = []

        def prefer(request: Any, running: list[Any]) -> Any:
            asked.append(request.conversation)
            return running[1] if request.conversation else None

        scheduler.loader.prefer = prefer
        turn = Resolved("llama.cpp", self.store.resolve("a"), COMPLETION, conversation=("m1", "m2"))
        self.assertEqual(self.successResultOf(scheduler.acquire(turn)).socket, self.spawn.processes[1].socket)
        plain = self.successResultOf(acquire(scheduler, self.store, None, "a", COMPLETION))
        self.assertEqual(plain.socket, self.spawn.processes[0].socket)
        self.assertEqual(asked, [("m1", "m2"), ()])

    def test_an_instance_that_does_not_fit_is_not_started(self) -> None:
        """Nothing is evicted for another instance: the request waits for the one running."""
        scheduler = self.make(FakeBackend(need=6), {}, budget=10)
        first = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[0].ready.callback(None)
        held = self.successResultOf(first)
        second = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.assertEqual(len(self.spawn.processes), 1)
        held.release()
        self.successResultOf(second).release()

    def test_another_instance_that_fails_is_not_retried_at_once(self) -> None:
        """Its waiter is not failed: the first instance serves it; the other waits out a back-off."""
        scheduler = self.make(FakeBackend(need=4), {}, budget=10)
        first = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[0].ready.callback(None)
        held = self.successResultOf(first)
        second = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[1].exit()  # the second instance fails to start
        self.assertNoResult(second)
        self.assertEqual(len(self.spawn.processes), 2, "not started again at once")
        held.release()
        self.assertEqual(self.successResultOf(second).socket, self.spawn.processes[0].socket)

    def test_instances_on_gpus_of_their_own(self) -> None:
        backend = FakeBackend(need=NEED, layers=LAYERS, per_layer=PER_LAYER, per_device=PER_DEVICE)
        scheduler = self.make(backend, {"CUDA0": 40 * MIB, "CUDA1": 40 * MIB}, budget=100 * MIB)
        first = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[0].ready.callback(None)
        self.successResultOf(first)
        acquire(scheduler, self.store, None, "a", COMPLETION)
        placements = [settings.placement for settings in backend.started]
        self.assertEqual([p.layers for p in placements if p], [(("CUDA0", 9),), (("CUDA1", 9),)])


class InstancesConfigTests(SynchronousTestCase):
    def load(self, value: str) -> config.Config:
        path = Path(self.mktemp())
        path.write_text(f'home = "{path.parent}/home"\n[models."ai/a"]\ninstances = {value}\n')
        return config.load(path, environ={})

    def test_instances(self) -> None:
        self.assertEqual(self.load("3").models.settings[A].instances, 3)

    def test_a_count_of_runners_is_positive(self) -> None:
        for bad in ("0", "-1", "true", '"2"', "1.5"):
            error = self.assertRaises(config.ConfigError, self.load, bad)
            self.assertIn("instances: expected a positive integer", str(error), bad)
