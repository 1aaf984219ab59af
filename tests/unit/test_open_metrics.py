"""Issue 35, A16: which scrapes of C{/metrics} C{[cluster] open_metrics} lets in without a valid key
(they see the load signals alone), and that view itself."""

from __future__ import annotations

from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource

from mrunner.api.door.callers import OPEN, Caller, key_caller
from mrunner.api.door.trust import Trust
from mrunner.api.manage.status import StatusAPI
from mrunner.config import ClusterConfig, Config, HTTPConfig, KeyConfig
from mrunner.daemon.router_signals import load_signals
from mrunner.errors import Unauthorized
from mrunner.runners.metrics import RunnerScraper
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.members import Member
from tests.support.door import daemon_door
from tests.support.fakes import unreachable_runners

KEYS = {"alice": KeyConfig(key="alice-key")}


def trust(open_metrics: bool = True, **http: tuple[str, ...]) -> Trust:
    return Trust(
        attrs.evolve(
            Config(), http=HTTPConfig(**http), cluster=ClusterConfig(open_metrics=open_metrics), keys=KEYS
        ),
        daemon_door(),
    )


def signals_only(door: Trust, key: str | None, target: bytes = b"/metrics") -> bool:
    headers = Headers({b"authorization": [f"Bearer {key}".encode()]} if key else {})
    return door.check_key(b"GET", target, headers, None).load_signals_only


class WhoTests(SynchronousTestCase):
    def test_without_a_valid_key(self) -> None:
        door = trust(api_keys=("k",), admin_api_keys=("admin",))
        for key in (None, "wrong"):
            for target in (b"/metrics", b"/metrics/", b"/metrics?x=1"):
                self.assertTrue(signals_only(door, key, target), (key, target))

    def test_with_a_key_all(self) -> None:
        door = trust(api_keys=("k",), admin_api_keys=("admin",))
        for key in ("k", "admin", "alice-key"):
            self.assertFalse(signals_only(door, key), key)
        self.assertFalse(signals_only(trust(admin_api_keys=("admin",)), "admin"))

    def test_only_when_open_metrics_opens_it(self) -> None:
        self.assertRaises(Unauthorized, signals_only, trust(open_metrics=False), None)
        self.assertFalse(signals_only(trust(open_metrics=False), "alice-key"))
        self.assertFalse(signals_only(trust(api_keys=("k",)), None, b"/health"))


class ViewTests(SynchronousTestCase):
    def test_the_load_signals_of_every_source(self) -> None:
        daemon, runners = CollectorRegistry(), CollectorRegistry()
        Gauge("mrunner_queue_waiting", "queued", registry=daemon).set(3)
        Counter("mrunner_key_requests", "by key", ["key"], registry=daemon).labels("alice").inc()
        Gauge("vllm:num_requests_running", "running", registry=runners).set(1)
        Gauge("llamacpp:tokens", "a runner's own", ["model"], registry=runners).labels("ai/secret").set(1)
        text = generate_latest(load_signals(daemon, runners)).decode()
        self.assertIn("mrunner_queue_waiting 3.0", text)
        self.assertIn("vllm:num_requests_running 1.0", text)
        self.assertNotIn("alice", text)
        self.assertNotIn("ai/secret", text)


class NoRunners:
    """The scheduler as C{/metrics} reads it: no runner to scrape."""

    def snapshot(self) -> list[Any]:
        return []


class AsCaller(Resource):
    """The routes behind a door that found C{who}."""

    isLeaf = True

    def __init__(self, routes: Resource, who: Caller):
        super().__init__()
        self._routes, self._who = routes, who

    def render(self, request: Any) -> Any:
        request.caller = self._who
        return self._routes.render(request)


class KeyViewTests(SynchronousTestCase):
    """Issue 53, N4: a normal key reads its own per-key series and the load signals, as C{/usage} shows it
    only its own rows; an admin reads all."""

    def scrape(self, who: Caller) -> str:
        registry = CollectorRegistry()
        Gauge("mrunner_queue_waiting", "queued", registry=registry).set(2)
        Counter("mrunner_requests", "by mode", ["mode"], registry=registry).labels("ai/secret").inc()
        keys = KeyMetrics(registry)
        keys.ended("alice", 200, 5, 7)
        keys.ended("ops", 200, 11, 13)
        keys.limited("ops")
        status = StatusAPI(None, registry, NoRunners(), RunnerScraper(unreachable_runners, Clock()))  # type: ignore[arg-type]
        http = StubTreq(AsCaller(status.app.resource(), who))
        response = self.successResultOf(http.get("http://mrunner/metrics"))
        return self.successResultOf(response.text())

    def test_a_normal_key_sees_its_own(self) -> None:
        text = self.scrape(key_caller(b"alice-key", admin=False, member=Member("alice")))
        self.assertIn('mrunner_key_tokens_total{key="alice",kind="completion"} 7.0', text)
        self.assertIn("mrunner_queue_waiting 2.0", text)
        self.assertNotIn("ops", text)
        self.assertNotIn("ai/secret", text)

    def test_an_admin_sees_every_key(self) -> None:
        text = self.scrape(OPEN)
        self.assertIn('mrunner_key_rate_limited_total{key="ops"} 1.0', text)
        self.assertIn('mrunner_key_tokens_total{key="alice",kind="prompt"} 5.0', text)
        self.assertIn("ai/secret", text)
