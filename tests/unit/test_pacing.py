"""The loader under C{order = "loaded"}, with a Clock: a busy model serves its own before a swap,
the wait is bounded by a timer, and load times are kept across restarts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.manage.scheduler_json import with_queue
from mrunner.scheduling.lease import Lease
from mrunner.scheduling.load_times import MAX_BYTES, MAX_MODELS, LoadTimes
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.order import FIFO, LOADED, Rules
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
        deep = ["[" * 100_000, '{"a":' * 100_000]  # nested past Python's limit (issue 53 L3)
        huge = '{"sha256:a": 1e400, "sha256:b": 1%s}' % ("0" * 400)
        wrong = '{"sha256:a": "x", "sha256:b": true, "sha256:c": -1}'
        for text in ("{not json", '["a"]', wrong, huge, *deep):
            path.write_text(text)
            self.assertEqual(LoadTimes(path).get("sha256:a"), None, text[:20])
        path.write_text('{"sha256:a": 1, "pad": "%s"}' % ("x" * MAX_BYTES))
        self.assertEqual(LoadTimes(path).get("sha256:a"), None, "larger than any the daemon writes")

    def test_no_regular_file_starts_afresh_at_once(self) -> None:
        """A directory, or a FIFO no one writes to, which blocked the start in open() (issue 53 L3)."""
        directory, fifo = Path(self.mktemp()), Path(self.mktemp())
        directory.mkdir()
        os.mkfifo(fifo)
        signal.signal(signal.SIGALRM, _too_long)
        self.addCleanup(signal.signal, signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 5)
        self.addCleanup(signal.setitimer, signal.ITIMER_REAL, 0)
        for path in (directory, fifo):
            self.assertEqual(LoadTimes(path).get("sha256:a"), None, path)

    def test_a_long_file_keeps_the_most_recent_in_linear_time(self) -> None:
        """Its last MAX_MODELS entries, read once: a first load no longer trims 300,000 one by one."""
        path = Path(self.mktemp())
        path.write_text(json.dumps({f"sha256:{n}": n for n in range(5000)}))
        times = LoadTimes(path)
        self.assertEqual(len(times._seconds), MAX_MODELS)
        self.assertEqual((times.get("sha256:4999"), times.get(f"sha256:{4999 - MAX_MODELS}")), (4999, None))


def _too_long(*args: object) -> None:
    raise AssertionError("reading the load times blocked")


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


steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from("ab")),
        st.tuples(st.just("answer"), st.integers(0, 7)),
        st.tuples(st.just("ready"), st.just("")),
        st.tuples(st.just("wait"), st.sampled_from([0.1, 1.0, 4.0, 20.0])),
    ),
    max_size=40,
)


class LoadedLoaderPropertyTests(SynchronousTestCase):
    @settings(deadline=None)
    @given(steps)
    def test_safe_and_everyone_served(self, script: list[tuple[str, object]]) -> None:
        """Whatever comes, leaves and loads when: never two runners (one fits), no busy runner
        stopped, and once the answers are all in and time passes, every request has had its lease."""
        clock, spawn = Clock(), FakeSpawner()
        loader = Loader(clock, spawn, Limits(1), max_queue=50, rules=Rules(LOADED, max_wait=5))
        asked, held = [], []
        for step, arg in script:
            if step == "ask":
                d = loader.acquire(request(str(arg), parallel=2))
                asked.append(d)
                d.addCallback(held.append)
            elif step == "answer" and held:
                held.pop(int(arg) % len(held)).release()  # type: ignore[call-overload]
            elif step == "ready":
                for process in spawn.processes:
                    if not process.ready.called and not process.ended.called:
                        process.ready.callback(None)
            elif step == "wait":
                clock.advance(float(arg))  # type: ignore[arg-type]
            alive = [p for p in spawn.processes if p.started and not p.ended.called]
            self.assertLessEqual(len(alive), 1, "one runner fits")
            for runner in loader.runners.values():
                self.assertEqual(
                    runner.process.stops if runner.in_use else 0, 0, "a busy runner is never stopped"
                )
        for _ in range(20):  # every answer comes, loads finish, time passes
            while held:
                held.pop().release()
            for process in spawn.processes:
                if not process.ready.called and not process.ended.called:
                    process.ready.callback(None)
            clock.advance(10)
        for d in asked:
            self.successResultOf(d)
