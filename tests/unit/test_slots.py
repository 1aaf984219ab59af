"""A context size is what one request may use (issue 49): a runner's KV pool holds a whole context per
slot, and where the memory budget cannot hold them all, the runner gets the most slots that fit."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import attrs
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.manage.scheduler_json import runner_json
from mrunner.backends.llamacpp import arguments, sizing
from mrunner.config import Config, SchedulerConfig
from mrunner.errors import Unprocessable
from mrunner.runners.request import LoadRequest
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.slots import SlotNotes, fitted_slots
from mrunner.values import RunnerKey
from mrunner.values.backend import COMPLETION, RunnerSettings
from mrunner.values.model import Model
from tests.support.asking import acquire
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model

A = "ai/a:latest"
MIB = 2**20
METADATA = {
    "general.architecture": "llama",
    "llama.block_count": 30,
    "llama.embedding_length": 576,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.context_length": 8192,
}


def asked(slots: int, need: int = 10, per_slot: int = 4) -> LoadRequest:
    settings = RunnerSettings(parallel=slots)
    return LoadRequest(RunnerKey("b", "m", COMPLETION), model(A), settings, 0, memory=need + per_slot * slots)


def under(budget: int, request: LoadRequest) -> bool:
    return request.memory <= budget


def estimate(request: LoadRequest) -> LoadRequest:
    return attrs.evolve(request, memory=10 + 4 * request.settings.parallel)


class FittedSlotsTests(SynchronousTestCase):
    def test_cases(self) -> None:
        """A runner of 10 bytes and 4 a slot: (slots asked, budget) -> (slots given, slots_asked)."""
        cases = {
            "all fit": (4, 26, (4, None)),
            "three fit": (4, 25, (3, 4)),
            "one fits": (4, 14, (1, 4)),
            "not even one: one, for the 422": (4, 5, (1, 4)),
            "one asked": (1, 5, (1, None)),
        }
        for why, (slots, budget, expected) in cases.items():
            given = fitted_slots(asked(slots), estimate, partial(under, budget))
            self.assertEqual((given.settings.parallel, given.slots_asked), expected, why)
            self.assertEqual(given.memory, 10 + 4 * given.settings.parallel, why)

    def test_asked_is_the_configured_number(self) -> None:
        """A runner with fewer slots is not stale: what it was asked is what the settings say."""
        given = fitted_slots(asked(4), estimate, lambda r: r.memory <= 18)
        self.assertEqual(given.asked, RunnerSettings(parallel=4))


class SlotNotesTests(SynchronousTestCase):
    def test_said_once_per_key_and_number(self) -> None:
        """Every request for a load builds its request again: the log says it once, and again on a change."""
        notes = SlotNotes()
        fewer = fitted_slots(asked(4), estimate, partial(under, 18))
        with capturedLogs() as events:
            for request in (asked(4), fewer, fewer, fitted_slots(asked(4), estimate, partial(under, 14))):
                notes(request, 8192)
        said = [formatEvent(event) for event in events]
        self.assertEqual(len(said), 2, said)
        self.assertIn("ai/a:latest gets 2 of the 4 slots asked (8192 tokens each)", said[0])
        self.assertIn("raise [scheduler] memory_budget", said[0])
        self.assertIn("gets 1 of the 4", said[1])


class PoolTests(SynchronousTestCase):
    def described(self, context: int | None = 8192) -> tuple[Model, RunnerSettings]:
        path = self.mktemp()
        Path(path).write_bytes(b"\0" * 1000)
        described = attrs.evolve(model(A), config={"gguf": METADATA}, gguf=path)
        return described, RunnerSettings(context_size=context)

    def test_the_pool_is_a_context_per_slot(self) -> None:
        described, one = self.described()
        four = attrs.evolve(one, parallel=4)
        self.assertEqual(sizing.pool_size(described, four), 4 * 8192)
        kv = 30 * 8192 * 3 * (64 + 64) * 2
        mask = sizing.UBATCH * 8192 * 2
        grown = sizing.memory_estimate(described, four) - sizing.memory_estimate(described, one)
        self.assertEqual(grown, 3 * (kv + mask))

    def test_a_slot_is_capped_at_the_trained_context(self) -> None:
        """Asked for more than the model was trained for, each slot gets the trained context."""
        described, settings = self.described(context=100_000)
        self.assertEqual(sizing.pool_size(described, attrs.evolve(settings, parallel=2)), 2 * 8192)

    def test_the_command_line(self) -> None:
        described, settings = self.described()
        args = arguments.command(
            "llama-server", described, COMPLETION, "/r.sock", attrs.evolve(settings, parallel=4)
        ).args
        flags = {"--ctx-size": "32768", "--parallel": "4", "--kv-unified-per-slot": "8192"}
        self.assertEqual({flag: args[args.index(flag) + 1] for flag in flags}, flags)
        self.assertIn("--kv-unified", args)


class SchedulerSlotsTests(SynchronousTestCase):
    """The scheduler starts a runner with the slots its budget holds, and says so in ps."""

    def make(self, budget: int) -> Scheduler:
        self.backend = FakeBackend(need=10 * MIB, per_slot=4 * MIB, default_context=8192)
        self.store = FakeStore({A: model(A, "a" * 64)})
        self.spawn = FakeSpawner()
        config = Config(
            home=Path(self.mktemp()),
            scheduler=SchedulerConfig(max_runners=4, memory_budget=budget, keep_alive=300, parallel=4),
        )
        scheduler = Scheduler(
            Clock(), config, {"llama.cpp": self.backend}, self.store, self.spawn.start_runner
        )
        scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")
        return scheduler

    def test_fewer_slots_shown_and_kept(self) -> None:
        scheduler = self.make(budget=20 * MIB)
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d).release()
        self.assertEqual([s.parallel for s in self.backend.started], [2])
        [runner] = scheduler.snapshot()
        shown = runner_json(runner)
        self.assertEqual((shown["parallel"], shown["parallel_configured"], runner.stale), (2, 4, False))
        self.assertIn("gets 2 of the 4 slots asked (8192 tokens each)", shown["warning"])
        self.assertEqual(runner.memory_estimate, 18 * MIB)
        for _ in range(2):
            self.successResultOf(acquire(scheduler, self.store, None, "a", COMPLETION))
        self.assertNoResult(acquire(scheduler, self.store, None, "a", COMPLETION))
        self.assertEqual(len(self.spawn.processes), 1, "the same runner: two slots, the third waits")

    def test_all_slots_when_they_fit(self) -> None:
        scheduler = self.make(budget=100 * MIB)
        acquire(scheduler, self.store, None, "a", COMPLETION)
        self.spawn.processes[-1].ready.callback(None)
        [runner] = scheduler.snapshot()
        self.assertEqual((runner.parallel, runner.slots_asked, runner.notes()), (4, None, None))

    def test_not_even_one_slot_is_a_422(self) -> None:
        scheduler = self.make(budget=12 * MIB)
        error = self.failureResultOf(acquire(scheduler, self.store, None, "a", COMPLETION), Unprocessable)
        self.assertIn("needs about 14.00 MiB", error.value.message)
