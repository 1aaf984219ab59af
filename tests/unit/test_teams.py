"""Named keys, their limits, the meter of an answer's tokens and the door's key check."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from mrunner import config as configuration
from mrunner.api.door.trust import Trust
from mrunner.config import Config, ConfigError, KeyConfig
from mrunner.errors import BadRequest, Forbidden, Unauthorized
from mrunner.teams.admission import Teams
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.lengths import OPENAI, Ask
from mrunner.teams.limits import DAY, Allowance, RateLimited, reset_text
from mrunner.teams.members import KeyRing, Member
from mrunner.teams.meter import HEAD, TAIL, Meter
from mrunner.teams.usage import UsageBook
from tests.support.door import daemon_door


def limited(allowance: Allowance, member: Member, now: float, asked: int = 0, today: int = 0) -> RateLimited:
    try:
        allowance.admit(member, now, Ask(asked), today)
    except RateLimited as e:
        return e
    raise AssertionError("admitted")


class LimitTests(SynchronousTestCase):
    def test_requests_per_minute(self) -> None:
        member = Member("alice", requests_per_minute=5)
        allowance = Allowance()
        for second in range(5):
            headers = dict(allowance.admit(member, 100 + second, Ask(0), 0).headers)
            allowance.end(100 + second, 0)
        self.assertEqual(headers[b"x-ratelimit-limit-requests"], b"5")
        self.assertEqual(headers[b"x-ratelimit-remaining-requests"], b"0")
        error = limited(allowance, member, 110)
        self.assertEqual((error.status, error.code), (429, "rate_limit_exceeded"))
        self.assertEqual(error.retry_after, 50, "the first of the five leaves the window at 160")
        self.assertIn("requests_per_minute (5)", error.message)
        fields = dict(error.headers)
        self.assertEqual(fields[b"x-ratelimit-reset-requests"], b"50s")
        self.assertEqual(fields[b"retry-after-ms"], b"50000")
        allowance.admit(member, 160, Ask(0), 0)  # the window slid

    def test_max_concurrent(self) -> None:
        member = Member("bob", max_concurrent=2)
        allowance = Allowance()
        allowance.admit(member, 0, Ask(0), 0)
        allowance.admit(member, 0, Ask(0), 0)
        self.assertEqual(limited(allowance, member, 0).retry_after, 1)
        allowance.end(1, 0)
        allowance.admit(member, 1, Ask(0), 0)

    def test_tokens_per_minute_checks_max_tokens_against_what_is_left(self) -> None:
        member = Member("carol", tokens_per_minute=100)
        allowance = Allowance()
        allowance.admit(member, 0, Ask(50), 0)
        allowance.end(10, 70, 50)  # charged with what the runner said, not what was reserved
        allowance.admit(member, 20, Ask(30), 0)
        allowance.end(30, 20, 30)
        error = limited(allowance, member, 40, asked=20)
        self.assertEqual(error.retry_after, 30, "70 tokens leave the window at 70")
        self.assertEqual(dict(error.headers)[b"x-ratelimit-remaining-tokens"], b"10")
        allowance.admit(member, 40, Ask(10), 0)
        with self.assertRaises(BadRequest) as caught:
            allowance.admit(member, 200, Ask(101), 0)
        self.assertEqual(caught.exception.code, "tokens_over_budget")

    def test_tokens_per_day_until_midnight_utc(self) -> None:
        member = Member("dave", tokens_per_day=1000)
        allowance = Allowance()
        noon = 20000 * DAY + DAY / 2
        allowance.admit(member, noon, Ask(10), 990)
        error = limited(allowance, member, noon, asked=11, today=990)
        self.assertEqual(error.retry_after, DAY / 2)
        self.assertIn("tokens_per_day", error.message)

    def test_reset_text(self) -> None:
        self.assertEqual(
            [reset_text(s) for s in (0.5, 1, 59.4, 60, 360, 3725)],
            [b"0.5s", b"1s", b"59.4s", b"1m0s", b"6m0s", b"1h2m5s"],
        )


class MeterTests(SynchronousTestCase):
    CASES = [
        (
            "OpenAI chat, usage after timings",
            b'{"choices":[],"timings":{"prompt_n":3,"predicted_n":4},"usage":{"completion_tokens":5,'
            b'"prompt_tokens":9,"total_tokens":14}}',
            (9, 5),
        ),
        (
            "OpenAI stream: llama-server's timings in the last event",
            b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
            b'data: {"choices":[],"timings":{"prompt_n":7,"predicted_n":2}}\n\ndata: [DONE]\n\n',
            (7, 2),
        ),
        (
            "Anthropic stream: input first, output last",
            b'event: message_start\ndata: {"message":{"usage":{"input_tokens":12,"output_tokens":1}}}\n\n'
            + b"event: content_block_delta\ndata: {}\n\n" * 400
            + b'event: message_delta\ndata: {"usage":{"output_tokens":30}}\n\n',
            (12, 30),
        ),
        ("nothing said", b'{"data":[]}', (0, 0)),
    ]

    def test_cases(self) -> None:
        for name, answer, expected in self.CASES:
            for size in (1, 7, len(answer)):  # however the answer is cut into writes
                meter = Meter()
                meter.start(False)
                for i in range(0, len(answer), size):
                    meter.write(answer[i : i + size])
                self.assertEqual(meter.tokens(), expected, f"{name}, writes of {size}")

    def test_keeps_head_and_tail_only(self) -> None:
        meter = Meter()
        meter.write(b"x" * 100_000)
        meter.write(b'"prompt_tokens": 3, "completion_tokens": 4}')
        self.assertLessEqual(len(meter._head) + len(meter._tail), HEAD + TAIL)
        self.assertEqual(meter.tokens(), (3, 4))


class KeyConfigTests(SynchronousTestCase):
    def load(self, text: str, environ: dict[str, str] | None = None) -> Config:
        path = Path(self.mktemp())
        path.write_text(text)
        return configuration.load(path, environ=environ or {})

    def test_keys(self) -> None:
        secret = Path(self.mktemp())
        secret.write_text("bob-key\n")
        secret.chmod(0o600)
        config = self.load(
            f'[keys.alice]\nkey = "alice-key"\nmodels = ["smollm2", "hf.co/*"]\nrequests_per_minute = 5\n'
            f'priority = "high"\n[keys.bob]\nkey_file = "{secret}"\nadmin = true\n'
            '[keys.carol]\nkey_env = "CAROL_KEY"\n[scheduler]\nstarvation_seconds = "2m"\n',
            {"CAROL_KEY": "carol-key"},
        )
        self.assertEqual(config.scheduler.starvation_seconds, 120)
        self.assertEqual(
            [config.keys[n].key for n in ("alice", "bob", "carol")], ["alice-key", "bob-key", "carol-key"]
        )
        self.assertNotIn("alice-key", repr(config))
        ring = KeyRing(config.keys)
        alice = ring.find(b"alice-key")
        assert alice is not None
        self.assertEqual((alice.name, alice.priority, alice.requests_per_minute), ("alice", 0, 5))
        self.assertEqual(alice.models, ("ai/smollm2:latest", "hf.co/*"))
        self.assertTrue(alice.may_use("hf.co/org/repo:Q4"))
        self.assertFalse(alice.may_use("ai/other:latest"))
        self.assertIsNone(ring.find(b"nobody"))
        self.assertIsNone(ring.find(None))

    def test_refused(self) -> None:
        for text, why in [
            ('[keys.alice]\nmodels = ["x"]\n', "give the key"),
            ('[keys.alice]\nkey_env = "ABSENT"\n', "key_env ABSENT is not set"),
            ('[keys.alice]\nkey = "k"\npriority = "urgent"\n', "high, normal, low"),
            ('[keys.alice]\nkey = "k"\nrequests_per_minute = -1\n', "whole number"),
            ('[keys.alice]\nkey = "k"\nquota = 1\n', "unknown key"),
            ('[keys."a b"]\nkey = "k"\n', "a key's name"),
            ('[keys.anonymous]\nkey = "k"\n', "a key's name"),
            ('[keys.alice]\nkey_file = "/absent/file"\n', "cannot read"),
            ('[keys.a]\nkey = "k"\n[keys.b]\nkey = "k"\n', "another named key's"),
        ]:
            with self.assertRaises(ConfigError, msg=text) as caught:
                self.load(text)
            self.assertIn(why, str(caught.exception))


def headers(key: str | None) -> Headers:
    return Headers({b"authorization": [b"Bearer " + key.encode()]} if key else {})


class DoorTests(SynchronousTestCase):
    """The front door finds a named key's rules; anonymous keys keep working."""

    def trust(self, **http: tuple[str, ...]) -> Trust:
        keys = {"alice": KeyConfig(key="alice-key"), "root": KeyConfig(key="root-key", admin=True)}
        return Trust(Config(keys=keys, http=configuration.HTTPConfig(**http)), daemon_door())

    def test_named_keys(self) -> None:
        trust = self.trust()
        alice = trust.check_key(b"POST", b"/v1/chat/completions", headers("alice-key"), None)
        self.assertEqual((alice.name, alice.admin, alice.rank), ("alice", False, 1))
        with self.assertRaises(Forbidden) as caught:
            trust.check_key(b"POST", b"/models/create", headers("alice-key"), None)
        self.assertIn("'alice' is not an admin key", caught.exception.message)
        root = trust.check_key(b"GET", b"/engines/usage", headers("root-key"), None)
        self.assertEqual((root.name, root.admin), ("root", True))
        for missing in (None, "wrong"):
            with self.assertRaises(Unauthorized):
                trust.check_key(b"POST", b"/v1/chat/completions", headers(missing), None)
        self.assertEqual(trust.check_key(b"GET", b"/health", headers(None), None).name, "anonymous")

    def test_anonymous_keys_still_work(self) -> None:
        trust = self.trust(api_keys=("old",), admin_api_keys=("old-admin",))
        old = trust.check_key(b"POST", b"/v1/chat/completions", headers("old"), None)
        self.assertEqual((old.name, old.member), ("anonymous", None))
        with self.assertRaises(Forbidden):
            trust.check_key(b"GET", b"/engines/requests", headers("old"), None)
        self.assertFalse(trust.check_key(b"GET", b"/engines/usage", headers("old"), None).admin)
        self.assertTrue(trust.check_key(b"GET", b"/engines/usage", headers("old-admin"), None).admin)


class TeamsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(20000 * DAY)
        self.book = UsageBook(Path(self.mktemp()), None, self.clock.seconds)
        self.registry = CollectorRegistry()
        self.teams = Teams(self.clock.seconds, self.book, KeyMetrics(self.registry))

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def test_charged_after_from_the_answer(self) -> None:
        dave = Member("dave", tokens_per_day=100)
        ticket = self.teams.admit(dave, "ai/m:latest", {"max_tokens": 50}, OPENAI)
        ticket.meter.write(b'{"usage":{"prompt_tokens":30,"completion_tokens":40}}')
        self.clock.advance(2)
        ticket.end(200)
        ticket.end(200)  # once only
        self.assertEqual(self.book.used_today("dave"), 70)
        with self.assertRaises(RateLimited):
            self.teams.admit(dave, "ai/m:latest", {"max_tokens": 31}, OPENAI)
        self.teams.admit(dave, "ai/m:latest", {"max_tokens": 30}, OPENAI)
        self.assertEqual(self.value("mrunner_key_tokens_total", key="dave", kind="completion"), 40)
        self.assertEqual(self.value("mrunner_key_requests_total", key="dave", status="200"), 1)
        self.assertEqual(self.value("mrunner_key_rate_limited_total", key="dave"), 1)
        self.clock.advance(DAY)
        self.assertEqual(self.book.used_today("dave"), 0, "a new UTC day")

    def test_anonymous(self) -> None:
        ticket = self.teams.admit(None, "ai/m:latest", {})
        self.assertEqual((ticket.key, ticket.headers), ("anonymous", ()))
        ticket.end(500)
        self.assertEqual(self.value("mrunner_key_requests_total", key="anonymous", status="500"), 1)
