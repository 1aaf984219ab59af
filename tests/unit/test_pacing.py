"""The loader under C{order = "loaded"}, with a Clock: a busy model serves its own before a swap,
the wait is bounded by a timer, and load times are kept across restarts."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.manage.scheduler_json import with_queue
from mrunner.scheduling.lease import Lease
from mrunner.scheduling.load_times import LoadTimes
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.patience import FIFO, LOADED, Rules
from mrunner.scheduling.policy import Limits, State
from tests.support.fakes import FakeSpawner
from tests.support.loading import request


class LoadedLoaderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.times = LoadTimes()
        self.loader = self.make(Rules(LOADED, max_wait=15, min_serve=1))

    def make(self, rules: Rules) -> Loader:
        return Loader(self.clock, self.spawn, Limits(1), max_queue=10, rules=rules, load_times=self.times)

    def busy_a(self) -> Lease:
        """Model a, loaded in 2 s, serving one request."""
        d = self.loader.acquire(request("a"))
        self.clock.advance(2)
        self.spawn.processes[-1].ready.callback(None)
        return self.successResultOf(d)

    def state(self, name: str) -> State:
        return self.loader.runners[request(name).key].state

    def test_a_busy_model_serves_its_own_until_the_other_waited_max_wait(self) -> None:
        lease = self.busy_a()
        b = self.loader.acquire(request("b"))
        for _ in range(14):  # a's client asks again as soon as it has its answer, once a second
            self.clock.advance(1)
            lease.release()
            lease = self.successResultOf(self.loader.acquire(request("a")))
            self.assertIs(self.state("a"), State.READY)
        self.clock.advance(1)  # b has waited 15 s: the timer plans again, without a release
        self.assertIs(self.state("a"), State.DRAINING)
        self.assertNoResult(b)
        self.assertEqual(len(self.spawn.processes), 1)
        lease.release()
        self.assertEqual(self.spawn.processes[0].stops, 1, "a stops once its last request is done")
        self.assertEqual(len(self.spawn.processes), 2, "and b loads")
        self.spawn.processes[1].ready.callback(None)
        self.successResultOf(b)

    def test_fifo_drains_at_once(self) -> None:
        self.loader = self.make(Rules(FIFO))
        self.busy_a()
        self.loader.acquire(request("b"))
        self.assertIs(self.state("a"), State.DRAINING)

    def test_an_idle_model_nobody_asks_for_goes_at_once(self) -> None:
        self.busy_a().release()
        self.clock.advance(2)
        self.loader.acquire(request("b"))
        self.assertEqual(self.spawn.processes[0].stops, 1)

    def test_a_load_is_measured_per_model(self) -> None:
        self.busy_a()
        self.assertEqual(self.times.get(request("a").key.model), 2)


class LoadTimesTests(SynchronousTestCase):
    def test_kept_across_restarts(self) -> None:
        path = self.mktemp()

        times = LoadTimes(Path(path))
        times.record("sha256:a", 10)
        times.record("sha256:a", 20)
        self.assertEqual(LoadTimes(Path(path)).get("sha256:a"), 15, "a running mean, read back")
        self.assertEqual(Path(path).stat().st_mode & 0o777, 0o600)

    def test_a_damaged_file_starts_afresh(self) -> None:

        path = Path(self.mktemp())
        for text in ("{not json", '["a"]', '{"sha256:a": "x", "sha256:b": true, "sha256:c": -1}'):
            path.write_text(text)
            self.assertEqual(LoadTimes(path).get("sha256:a"), None, text)


class QueueShownTests(SynchronousTestCase):
    def test_ps_rows_carry_the_queue(self) -> None:
        """A loaded model's row says how many wait and the oldest's wait; a model waiting for its
        runner to start has a row of its own."""
        clock = Clock()
        loader = Loader(clock, FakeSpawner(), Limits(1), max_queue=10, rules=Rules(LOADED))
        loader.acquire(request("a"))
        clock.advance(3)
        loader.acquire(request("a"))
        [waiting] = loader.waiting()
        self.assertEqual((waiting.model_name, waiting.count, waiting.oldest_seconds), ("ai/a:latest", 2, 3))
        row = {"backend_name": "llama.cpp", "model_id": waiting.model_id, "mode": "completion", "instance": 0}
        [shown] = with_queue([dict(row)], [waiting])
        self.assertEqual((shown["waiting"], shown["oldest_wait"]), (2, 3))
        [absent] = with_queue([], [waiting])
        self.assertEqual(
            (absent["state"], absent["model_name"], absent["waiting"]), ("waiting", "ai/a:latest", 2)
        )
