"""Daemon metrics from the loader's events, and the scrape of runners' own metrics, without processes."""

from __future__ import annotations

import attrs
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from mrunner.daemon.metrics import Metrics
from mrunner.interfaces import ILoaderEvents
from mrunner.runners.metrics import RunnerScraper, metric_name
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.policy import Limits
from mrunner.scheduling.roster import NoEvents
from mrunner.values import RunnerSnapshot, State, Waiting
from tests.support.fakes import FakeSpawner
from tests.support.loading import request
from tests.support.metrics import LLAMA_METRICS, snapshot


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labels(model: str = "ai/a:latest", **more: str) -> frozenset[tuple[str, str]]:
    return frozenset({"backend": "llama.cpp", "model": model, "mode": "completion", **more}.items())


class EventTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.spawn = FakeSpawner()
        self.metrics = Metrics()
        self.loader = Loader(self.clock, self.spawn, Limits(1), max_queue=4, events=self.metrics)

    def test_interfaces(self) -> None:
        self.assertTrue(verifyObject(ILoaderEvents, self.metrics))
        self.assertTrue(verifyObject(ILoaderEvents, NoEvents()))

    def test_load_idle_expiry_and_exit(self) -> None:
        d = self.loader.acquire(request("a", keep_alive=10))
        self.clock.advance(2.5)
        self.spawn.processes[0].ready.callback(None)
        self.successResultOf(d).release()
        self.clock.advance(10)
        seen = self.samples()
        self.assertEqual(seen[("mrunner_load_seconds_count", frozenset({("model", "ai/a:latest")}))], 1)
        self.assertEqual(seen[("mrunner_load_seconds_sum", frozenset({("model", "ai/a:latest")}))], 2.5)
        self.assertEqual(seen[("mrunner_evictions_total", labels(reason="idle"))], 1)
        self.assertEqual(seen[("mrunner_runner_exits_total", labels(cause="stopped"))], 1)

    def test_eviction_for_room_crash_and_unload(self) -> None:
        self.successResultOf(self.ready_lease("a")).release()
        b = self.ready_lease("b")  # one slot: a goes for b
        self.successResultOf(b)
        self.spawn.processes[1].exit()  # b crashes while serving
        self.successResultOf(self.ready_lease("c")).release()
        self.successResultOf(self.loader.unload(lambda key: True))
        seen = self.samples()
        self.assertEqual(seen[("mrunner_evictions_total", labels("ai/a:latest", reason="memory"))], 1)
        self.assertEqual(seen[("mrunner_evictions_total", labels("ai/b:latest", reason="crash"))], 1)
        self.assertEqual(seen[("mrunner_runner_exits_total", labels("ai/b:latest", cause="crashed"))], 1)
        self.assertEqual(seen[("mrunner_evictions_total", labels("ai/c:latest", reason="unload"))], 1)

    def test_load_failure(self) -> None:
        d = self.loader.acquire(request("a"))
        self.spawn.processes[0].exit()
        self.failureResultOf(d)
        seen = self.samples()
        self.assertEqual(seen[("mrunner_load_failures_total", labels())], 1)
        self.assertEqual(seen[("mrunner_runner_exits_total", labels(cause="failed"))], 1)

    def test_bytes_moved(self) -> None:
        self.metrics.moved("pull", 100)
        self.metrics.moved("push", 7)
        seen = self.samples()
        self.assertEqual(seen[("mrunner_pulled_bytes_total", frozenset())], 100)
        self.assertEqual(seen[("mrunner_pushed_bytes_total", frozenset())], 7)

    def ready_lease(self, name: str):
        d = self.loader.acquire(request(name))
        self.spawn.processes[-1].ready.callback(None)
        return d

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return samples(self.metrics)


def get_metrics(socket: str, path: bytes) -> Deferred[tuple[int, bytes]]:
    """Runner sockets by name: C{slow} never answers, C{bare} has no metrics, the others llama-server's."""
    assert path == b"/metrics"
    if socket == "/run/slow.sock":
        return Deferred()
    if socket == "/run/bare.sock":
        return succeed((404, b"no metrics here"))
    return succeed((200, LLAMA_METRICS))


class ScrapeTests(SynchronousTestCase):
    def test_names(self) -> None:
        self.assertEqual(metric_name("llamacpp:prompt_tokens_total"), "llamacpp_prompt_tokens_total")
        self.assertEqual(metric_name("1st-metric.x"), "_1st_metric_x")

    def test_ready_runners_answering_in_time(self) -> None:
        clock = Clock()
        scraper = RunnerScraper(get_metrics, clock, seconds=1)
        runners = [
            snapshot("r0"),
            snapshot("r1"),
            snapshot("slow"),
            snapshot("bare"),
            snapshot("r2", State.LOADING),
        ]
        d = scraper.scrape(runners)
        self.assertNoResult(d)  # the slow one holds it, for one second at most
        clock.advance(1)
        text = generate_latest(self.successResultOf(d)).decode()  # type: ignore[arg-type]
        families = {family.name: family for family in text_string_to_metric_families(text)}
        self.assertEqual(set(families), {"llamacpp_prompt_tokens", "llamacpp_requests_processing"})
        self.assertEqual(text.count("# TYPE llamacpp_prompt_tokens_total counter"), 1)
        models = {sample.labels["model"] for sample in families["llamacpp_prompt_tokens"].samples}
        self.assertEqual(models, {"ai/r0:latest", "ai/r1:latest"})
        (sample, _) = families["llamacpp_requests_processing"].samples
        self.assertEqual(
            sample.labels, {"backend": "llama.cpp", "model": "ai/r0:latest", "mode": "completion"}
        )


class _TwoInstances:
    """What the collector reads of a scheduler running two instances of one model."""

    def snapshot(self) -> list[RunnerSnapshot]:
        return [attrs.evolve(snapshot("a"), in_use=1, memory=5), attrs.evolve(snapshot("a"), memory=7)]

    def queued(self) -> int:
        return 0

    def waiting(self) -> list[Waiting]:
        return [Waiting("llama.cpp", "ai/b:latest", "sha256:b", "completion", 3, 12.5)]

    def memory_budget(self) -> int:
        return 0


class InstancesTests(SynchronousTestCase):
    def test_instances_of_one_model_are_summed(self) -> None:
        """Instances share their labels: one sample each, summed (Prometheus refuses duplicates)."""
        metrics = Metrics()
        metrics.watch(_TwoInstances())  # type: ignore[arg-type]
        found = samples(metrics)
        self.assertEqual(found["mrunner_runners", labels(state="ready")], 2)
        self.assertEqual(found["mrunner_runner_requests_in_flight", labels()], 1)
        self.assertEqual(found["mrunner_runner_memory_bytes", labels()], 12)

    def test_the_queue_model_by_model(self) -> None:
        metrics = Metrics()
        metrics.watch(_TwoInstances())  # type: ignore[arg-type]
        found = samples(metrics)
        self.assertEqual(found["mrunner_model_queue_waiting", labels("ai/b:latest")], 3)
        self.assertEqual(found["mrunner_model_queue_oldest_wait_seconds", labels("ai/b:latest")], 12.5)
