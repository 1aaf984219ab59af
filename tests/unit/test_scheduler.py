"""The scheduler with a Clock and fakes: preloads, pins, reload, snapshots, failures through Deferreds."""

from __future__ import annotations

from pathlib import Path

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from mrunner.config import Config, ModelConfig, ModelsConfig, SchedulerConfig
from mrunner.errors import NotFound
from mrunner.interfaces import ILease, IScheduler
from mrunner.moves import IllegalMove
from mrunner.scheduling.facade import Scheduler
from mrunner.scheduling.order import FIFO, LOADED, Rules
from mrunner.scheduling.preloads import PRELOAD_MOVES, Preloads
from mrunner.values import ModelSettings, Preload, PreloadState, State
from mrunner.values.backend import COMPLETION
from tests.support.asking import acquire
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.moves import pairs

A, B, C = "ai/a:latest", "ai/b:latest", "ai/c:latest"


class SchedulerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        self.store = FakeStore({name: model(name, name[3] * 64) for name in (A, B, C)})
        self.spawn = FakeSpawner()

    def make(self, **models: object) -> Scheduler:
        config = Config(
            home=Path(self.mktemp()),
            scheduler=SchedulerConfig(max_runners=4, memory_budget=10, keep_alive=300),
            models=ModelsConfig(**models),  # type: ignore[arg-type]
        )
        self.config = config
        self.scheduler = Scheduler(
            self.clock, config, {"llama.cpp": self.backend}, self.store, self.spawn.start_runner
        )
        return self.scheduler

    def install(self) -> None:
        self.backend.installs[-1].callback("llama.cpp test")

    def ready(self) -> None:
        self.spawn.processes[-1].ready.callback(None)

    def load_a(self) -> None:
        """Start, install, and load model a (then idle)."""
        self.scheduler.start()
        self.install()
        d = acquire(self.scheduler, self.store, None, "a", COMPLETION)
        self.ready()
        self.successResultOf(d).release()

    def states(self) -> dict[str, PreloadState]:
        return {preload.model: preload.state for preload in self.scheduler.preloads()}

    def test_provides_its_interfaces(self) -> None:
        scheduler = self.make()
        self.assertTrue(verifyObject(IScheduler, scheduler))
        scheduler.start()
        self.install()
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.ready()
        lease = self.successResultOf(d)
        self.assertTrue(verifyObject(ILease, lease))
        self.assertEqual((lease.model, lease.socket), (A, self.spawn.processes[0].socket))

    def test_a_models_files_are_checked_before_a_load_not_on_every_request(self) -> None:
        self.make()
        self.load_a()
        self.successResultOf(acquire(self.scheduler, self.store, None, "a", COMPLETION)).release()
        self.assertEqual(self.store.checked, [A])
        self.store.models[A] = attrs.evolve(self.store.models[A], problem="a blob was corrupt")
        self.successResultOf(acquire(self.scheduler, self.store, None, "a", COMPLETION)).release()
        self.assertEqual(self.store.checked, [A, A])

    def test_failures_come_through_the_deferred(self) -> None:
        scheduler = self.make()
        self.failureResultOf(acquire(scheduler, self.store, "vllm", "a", COMPLETION), NotFound)
        self.failureResultOf(acquire(scheduler, self.store, None, "nothing", COMPLETION), NotFound)
        self.failureResultOf(scheduler.configure("vllm", "a", ModelSettings(keep_alive=1)), NotFound)
        self.failureResultOf(scheduler.configure(None, "nothing", ModelSettings(keep_alive=1)), NotFound)

    def test_preloads_in_order_once_installed(self) -> None:
        scheduler = self.make(preload=(A, B))
        scheduler.start()
        self.assertEqual(self.spawn.processes, [], "nothing loads before the backend is installed")
        self.assertEqual(self.states(), {A: PreloadState.LOADING, B: PreloadState.WAITING})
        self.clock.advance(3600)  # a long build: preloads wait for it, whatever install_wait says
        self.install()
        self.assertEqual(len(self.spawn.processes), 1, "one at a time")
        self.ready()
        self.assertEqual(len(self.spawn.processes), 2)
        self.ready()
        self.assertEqual(self.states(), {A: PreloadState.LOADED, B: PreloadState.LOADED})
        self.assertEqual([r.state for r in scheduler.snapshot()], [State.READY, State.READY])
        self.assertEqual([r.in_use for r in scheduler.snapshot()], [0, 0])

    def test_a_failed_preload_is_reported_not_fatal(self) -> None:
        self.backend.need = 6
        scheduler = self.make(preload=("ai/missing:latest", A, B))
        scheduler.start()
        self.install()
        self.ready()
        preloads = {preload.model: preload for preload in scheduler.preloads()}
        self.assertEqual(preloads["ai/missing:latest"].state, PreloadState.FAILED)
        self.assertIn("not found", preloads["ai/missing:latest"].error or "")
        self.assertEqual(preloads[A].state, PreloadState.LOADED)
        self.assertEqual(preloads[B].state, PreloadState.FAILED, "6 + 6 > 10: b does not evict a preload")
        self.assertIn("does not fit", preloads[B].error or "")
        self.assertEqual(len(self.spawn.processes), 1)

    def test_a_preload_missing_from_the_store_is_pulled_first(self) -> None:
        """A new node comes up from its tap.conf and a registry: the preload is pulled, then loaded."""
        pulls: list[tuple[str, Deferred[None]]] = []

        def pull(name: str) -> Deferred[None]:
            pulls.append((name, Deferred()))
            return pulls[-1][1]

        new = "ai/new:latest"
        self.make(preload=(new, "ai/gone:latest"))
        backends = {"llama.cpp": self.backend}
        start = self.spawn.start_runner
        scheduler = Scheduler(self.clock, self.config, backends, self.store, start, pull=pull)
        scheduler.start()
        self.install()
        self.assertEqual([name for name, _ in pulls], [new])
        self.assertEqual(self.spawn.processes, [], "nothing loads before the pull is done")
        self.store.models[new] = model(new, "n" * 64)
        pulls[0][1].callback(None)
        self.ready()
        pulls[1][1].errback(NotFound("ai/gone: not found in the registry"))
        states = {preload.model: (preload.state, preload.error) for preload in scheduler.preloads()}
        self.assertEqual(
            states,
            {
                new: (PreloadState.LOADED, None),
                "ai/gone:latest": (PreloadState.FAILED, "ai/gone: not found in the registry"),
            },
        )

    def test_pinned_from_the_file(self) -> None:
        scheduler = self.make(settings={A: ModelConfig(pinned=True)})
        self.load_a()
        self.clock.advance(10**6)
        (runner,) = scheduler.snapshot()
        self.assertTrue(runner.pinned)
        self.assertEqual(self.spawn.processes[0].stops, 0, "a pinned runner does not expire")
        self.assertTrue(scheduler.configuration(None, "a")["pinned"])

    def test_pin_and_unpin_with_configure(self) -> None:
        scheduler = self.make()
        self.load_a()
        self.assertTrue(self.successResultOf(scheduler.configure(None, "a", ModelSettings(pinned=True))))
        self.clock.advance(10**6)
        self.assertTrue(scheduler.snapshot()[0].pinned)
        self.assertTrue(self.successResultOf(scheduler.configure(None, "a", ModelSettings(pinned=False))))
        self.clock.advance(300)
        self.assertEqual(scheduler.snapshot(), [], "unpinned, it expires after its keep-alive")

    def test_reload(self) -> None:
        scheduler = self.make()
        self.load_a()
        self.assertFalse(scheduler.snapshot()[0].stale)
        new = attrs.evolve(
            self.config,
            scheduler=SchedulerConfig(max_runners=2, memory_budget=10, keep_alive=60),
            models=ModelsConfig(preload=(B,), settings={A: ModelConfig(context_size=512)}),
        )
        scheduler.reconfigure(new)
        runner = scheduler.snapshot()[0]
        self.assertTrue(runner.stale, "a's settings changed: its runner is stale, not restarted")
        self.assertEqual(runner.keep_alive, 60, "the new default keep-alive applies at once")
        self.ready()
        self.assertEqual(self.states(), {B: PreloadState.LOADED}, "the new preload loads beside a")
        self.assertEqual(self.spawn.processes[0].stops, 0, "no runner is dropped by a reload")
        self.successResultOf(scheduler.unload(None, ["a"], False))
        d = acquire(scheduler, self.store, None, "a", COMPLETION)
        self.ready()
        self.successResultOf(d).release()
        self.assertEqual(scheduler.configuration(None, "a")["context_size"], 512)
        self.assertEqual([(r.model_name, r.stale) for r in scheduler.snapshot()], [(B, False), (A, False)])
        self.assertFalse(self.scheduler.loader.fits(0), "max_runners 2 applies at once")

    def test_the_queue_order_from_the_config_and_a_reload(self) -> None:
        scheduler = self.make()
        self.assertEqual(
            scheduler.loader.pacing.rules, Rules(LOADED, 15.0, 1.0, 60.0), "[scheduler]'s defaults"
        )
        order = SchedulerConfig(order="fifo", max_wait=3.0, min_serve=0.5, starvation_seconds=9.0)
        scheduler.reconfigure(attrs.evolve(self.config, scheduler=order))
        self.assertEqual(scheduler.loader.pacing.rules, Rules(FIFO, 3.0, 0.5, 9.0))
        self.assertEqual(scheduler.loader.starvation, 9.0)

    def test_reload_pins_at_once(self) -> None:
        scheduler = self.make()
        self.load_a()
        scheduler.reconfigure(
            attrs.evolve(self.config, models=ModelsConfig(settings={A: ModelConfig(pinned=True)}))
        )
        self.clock.advance(10**6)
        self.assertTrue(scheduler.snapshot()[0].pinned)
        self.assertEqual(scheduler.preloads(), [])
        self.assertEqual(Preload("x").state, PreloadState.WAITING)

    def test_a_preload_dropped_while_it_loads_stays_dropped(self) -> None:
        scheduler = self.make(preload=(A,))
        scheduler.start()
        self.install()
        self.assertEqual(self.states(), {A: PreloadState.LOADING})
        scheduler.reconfigure(attrs.evolve(self.config, models=ModelsConfig()))
        self.ready()
        self.assertEqual(scheduler.preloads(), [], "its load finished, but it is no preload any more")
        self.assertEqual(len(scheduler.snapshot()), 1, "the runner it loaded stays, as any other")

    def test_unload_of_a_name_that_is_no_model_unloads_nothing(self) -> None:
        scheduler = self.make()
        self.assertEqual(self.successResultOf(scheduler.unload(None, ["Not A Name!", "ai/gone"], False)), 0)


class PreloadsTests(SynchronousTestCase):
    """The preloads' records: their moves, and what a reload keeps, retries and drops."""

    def test_moves(self) -> None:
        W, L, D, F = PreloadState.WAITING, PreloadState.LOADING, PreloadState.LOADED, PreloadState.FAILED
        self.assertEqual(pairs(PRELOAD_MOVES), {(W, L), (L, D), (L, F), (F, W)})
        self.assertRaises(IllegalMove, PRELOAD_MOVES.check, D, L)

    def test_configure_take_and_finish(self) -> None:
        preloads = Preloads()
        self.assertEqual(preloads.configure([A, B]), [A, B])
        a, b = preloads.take(A), preloads.take(B)
        assert a is not None and b is not None
        self.assertIsNone(preloads.take(A), "already loading")
        preloads.finish(a)
        preloads.finish(b, "no room")
        self.assertEqual(
            preloads.all(), [Preload(A, PreloadState.LOADED), Preload(B, PreloadState.FAILED, "no room")]
        )
        self.assertEqual(preloads.configure([C, B, A]), [C, B], "new ones, and failed ones again")
        self.assertEqual(
            [p.state for p in preloads.all()], [PreloadState.WAITING] * 2 + [PreloadState.LOADED]
        )

    def test_a_renewed_preload_is_not_finished_by_the_old_load(self) -> None:
        preloads = Preloads()
        preloads.configure([A])
        old = preloads.take(A)
        assert old is not None
        preloads.configure([])
        self.assertIsNone(preloads.take(A), "dropped")
        preloads.configure([A])
        new = preloads.take(A)
        preloads.finish(old, "from before the reload")
        self.assertEqual(preloads.all(), [Preload(A, PreloadState.LOADING)])
        assert new is not None
        preloads.finish(new)
        self.assertEqual(preloads.all(), [Preload(A, PreloadState.LOADED)])
