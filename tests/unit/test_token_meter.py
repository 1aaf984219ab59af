"""How a key's tokens are counted and reserved (issue 35 A2, A3, A4): the length each API asks for as
its runner reads it, reservations at admission, the cap a limited key's runner is told, and the meter
of cut streams and cached prompts. The events are llama-server's own, as the pinned one writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.compat.ollama import shapes as ollama_shapes
from mrunner.api.compat.responses import shapes as responses_shapes
from mrunner.api.openai.tally import Tally
from mrunner.errors import BadRequest
from mrunner.teams import lengths
from mrunner.teams.admission import Teams, Ticket
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.lengths import ANTHROPIC, OLLAMA, OPENAI, RESPONSES, Ask
from mrunner.teams.limits import DAY, RateLimited
from mrunner.teams.members import Member
from mrunner.teams.meter import Meter
from mrunner.teams.usage import UsageBook


def event(data: dict[str, Any], name: str | None = None) -> bytes:
    """One server-sent event as llama-server writes it (compact JSON)."""
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"finish_reason": finish, "index": 0, "delta": delta}
    return event({"choices": [choice], "object": "chat.completion.chunk", **extra})


def timings(prompt_n: int, cache_n: int, predicted_n: int) -> dict[str, Any]:
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": 1.5, "predicted_n": predicted_n}


ROLE = chat_chunk({"role": "assistant", "content": None})


def chat_stream(tokens: int, every: bool = False, cache_n: int = 0, prompt_n: int = 25) -> bytes:
    """A chat stream's first C{tokens} events, cut there; C{every}: with timings in each
    (C{timings_per_token})."""
    return ROLE + b"".join(
        chat_chunk({"content": "m"}, **({"timings": timings(prompt_n, cache_n, i + 1)} if every else {}))
        for i in range(tokens)
    )


def anthropic_start(input_tokens: int, cached: int) -> bytes:
    usage = {"cache_read_input_tokens": cached, "input_tokens": input_tokens, "output_tokens": 0}
    start = event(
        {"type": "message_start", "message": {"role": "assistant", "usage": usage}}, "message_start"
    )
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    return start + event(block, "content_block_start")


ANTHROPIC_DELTA = event(
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "m"}},
    "content_block_delta",
)


def metered(answer: bytes, size: int | None = None) -> tuple[int, int]:
    meter = Meter()
    meter.start(False)
    size = size or len(answer) or 1
    for i in range(0, len(answer), size):
        meter.write(answer[i : i + size])
    return meter.tokens()


class LengthTests(SynchronousTestCase):
    """The length checked is the one the runner obeys (A3)."""

    CASES = [
        (OPENAI, {"max_tokens": 5}, Ask(5)),
        (OPENAI, {"max_completion_tokens": 6, "max_tokens": 2}, Ask(6)),
        (OPENAI, {"max_tokens": 1, "n_predict": 1000}, Ask(1000)),
        (OPENAI, {"n_predict": -1, "max_tokens": 5}, Ask(None)),
        (OPENAI, {"max_tokens": True}, Ask(None)),
        (OPENAI, {}, Ask(None)),
        (OPENAI, {"max_tokens": 10, "n": 3}, Ask(10, 3)),
        (OPENAI, {"max_tokens": 10, "prompt": ["a", "b"], "n": 2}, Ask(10, 4)),
        (OPENAI, {"max_tokens": 10, "prompt": [1, 2, 3]}, Ask(10)),
        (ANTHROPIC, {"max_tokens": 7, "n_predict": 1000}, Ask(7)),
        (OLLAMA, {"options": {"num_predict": 8}, "max_tokens": 1}, Ask(8)),
        (OLLAMA, {"max_tokens": 100}, Ask(None)),
        (OLLAMA, {"options": {"num_predict": -2}}, Ask(None)),
        (RESPONSES, {"max_output_tokens": 9, "max_tokens": 1}, Ask(9)),
        (lengths.NONE, {"max_tokens": 9}, lengths.NOTHING),
    ]

    def test_cases(self) -> None:
        for length, payload, expected in self.CASES:
            self.assertEqual(length.read(payload), expected, payload)

    def test_imposed(self) -> None:
        body = {"messages": [], "max_tokens": 1, "stream": True}
        self.assertEqual(OPENAI.imposed(body, None), body)
        self.assertEqual(OPENAI.imposed(body, 40), {**body, "n_predict": 40, "timings_per_token": True})
        self.assertEqual(OPENAI.imposed({"stream": False}, 3), {"stream": False, "n_predict": 3})
        self.assertEqual(
            ANTHROPIC.imposed(body, 40), {**body, "max_tokens": 40}, "its runner takes no other field"
        )


class ReservationTests(SynchronousTestCase):
    """Tokens a request may still generate are reserved when it is admitted and settled when it ends."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(20000 * DAY + 3600)
        self.book = UsageBook(Path(self.mktemp()), None, self.clock.seconds)
        self.teams = Teams(self.clock.seconds, self.book, KeyMetrics(CollectorRegistry()))

    def burst(self, member: Member, payload: dict[str, Any], count: int = 20) -> list[Ticket | RateLimited]:
        results: list[Ticket | RateLimited] = []
        for _ in range(count):
            try:
                results.append(self.teams.admit(member, "ai/m:latest", payload, OPENAI))
            except RateLimited as e:
                results.append(e)
        return results

    def test_twenty_at_once_within_the_day(self) -> None:
        """A3: 20 at once, max_tokens 100, 500 a day: five are admitted, the rest wait for them."""
        results = self.burst(Member("day", tokens_per_day=500), {"max_tokens": 100})
        admitted = [r for r in results if isinstance(r, Ticket)]
        refused = [r for r in results if isinstance(r, RateLimited)]
        self.assertEqual((len(admitted), len(refused)), (5, 15))
        self.assertEqual(refused[0].retry_after, 1, "room comes back as soon as one ends")
        self.assertIn("500 held for requests in flight", refused[0].message)
        self.assertEqual(dict(refused[0].headers)[b"x-ratelimit-remaining-tokens"], b"0")
        admitted[0].meter.write(b'{"usage":{"prompt_tokens":20,"completion_tokens":10}}')
        admitted[0].end(200)
        self.assertEqual(self.teams._allowances["day"].reserved, 400)
        self.assertIsInstance(
            self.teams.admit(Member("day", tokens_per_day=500), "ai/m", {"max_tokens": 70}, OPENAI), Ticket
        )
        with self.assertRaises(RateLimited):
            self.teams.admit(Member("day", tokens_per_day=500), "ai/m", {"max_tokens": 1}, OPENAI)

    def test_twenty_at_once_within_the_minute(self) -> None:
        results = self.burst(Member("minute", tokens_per_minute=300), {"max_tokens": 100})
        self.assertEqual(sum(isinstance(r, Ticket) for r in results), 3)

    def test_the_field_the_runner_obeys_is_checked(self) -> None:
        """A3: {"max_tokens": 1, "n_predict": 1000} asks for 1,000, more than the whole budget."""
        with self.assertRaises(BadRequest) as caught:
            self.teams.admit(
                Member("d", tokens_per_day=500), "ai/m", {"max_tokens": 1, "n_predict": 1000}, OPENAI
            )
        self.assertEqual(caught.exception.code, "tokens_over_budget")
        with self.assertRaises(BadRequest):
            self.teams.admit(Member("d", tokens_per_day=500), "ai/m", {"max_tokens": 200, "n": 3}, OPENAI)
        with self.assertRaises(BadRequest, msg="more answers than the budget has tokens: no wait helps"):
            self.teams.admit(Member("m", tokens_per_minute=100), "ai/m", {"prompt": ["a"] * 101}, OPENAI)

    def test_no_length_gets_the_budget_left(self) -> None:
        """A2: a limited key's request without max_tokens is capped at what is left, and its runner is
        told so in the field it reads first, with its counts in every event."""
        member = Member("d", tokens_per_day=500)
        self.book.add("d", "ai/m", 100, 50, False, 1.0)
        first = self.teams.admit(member, "ai/m", {"max_tokens": 100}, OPENAI)
        body = {"messages": [], "max_tokens": 5000, "stream": True}
        capped = self.teams.admit(member, "ai/m", body, OLLAMA)
        self.assertEqual(capped.grant.cap, 250, "500 - 150 used - 100 held")
        self.assertEqual(capped.runner_body(body), {**body, "n_predict": 250, "timings_per_token": True})
        self.assertEqual(first.runner_body({"max_tokens": 100}), {"max_tokens": 100, "n_predict": 100})
        with self.assertRaises(RateLimited) as caught:
            self.teams.admit(member, "ai/m", {}, OPENAI)
        self.assertIn("tokens_per_day", caught.exception.message)
        two = self.teams._allowances["d"]
        first.end(200)
        capped.end(200)
        self.assertEqual(two.reserved, 0)
        answers = self.teams.admit(member, "ai/m", {"n": 2}, OPENAI)
        self.assertEqual((answers.grant.cap, answers.grant.reserved), (175, 350), "the budget shared by two")

    def test_unlimited_keys_are_not_capped(self) -> None:
        for member in (None, Member("free"), Member("slow", requests_per_minute=5)):
            ticket = self.teams.admit(member, "ai/m", {"stream": True}, OPENAI)
            self.assertEqual(ticket.runner_body({"stream": True}), {"stream": True})
            self.assertEqual(ticket.grant.reserved, 0)

    def test_nothing_generated_nothing_capped(self) -> None:
        ticket = self.teams.admit(Member("d", tokens_per_day=500), "ai/m", {"input": "x"}, lengths.NONE)
        self.assertEqual((ticket.grant.cap, ticket.grant.reserved), (None, 0))


CACHED = 2021  # A4: a 2,022-token prompt sent again, all but its last token read from the cache


class MeterTests(SynchronousTestCase):
    def test_a_cut_stream_is_charged_what_was_relayed(self) -> None:
        """A2: 400 events and no end: one token per event, and (asked for) the runner's own counts."""
        self.assertEqual(metered(chat_stream(400)), (0, 401), "the role event counts too: about one a token")
        self.assertEqual(metered(chat_stream(400, every=True)), (25, 400))
        completions = b"".join(
            event({"choices": [{"text": "m", "index": 0, "logprobs": None, "finish_reason": None}]})
            for _ in range(400)
        )
        self.assertEqual(metered(completions), (0, 400))
        cut = anthropic_start(1, CACHED) + ANTHROPIC_DELTA * 400
        self.assertEqual(metered(cut), (2022, 400), "Anthropic's prompt comes first")

    def test_events_split_between_writes_count_once(self) -> None:
        for size in (1, 5, 19, 20, 27, 28, 100, 4096):
            self.assertEqual(metered(chat_stream(50), size), (0, 51), size)
            self.assertEqual(metered(anthropic_start(3, 0) + ANTHROPIC_DELTA * 50, size), (3, 50), size)

    def test_a_whole_stream_is_charged_what_it_says(self) -> None:
        final = chat_chunk({}, "length", timings=timings(1, CACHED, 400))
        self.assertEqual(metered(chat_stream(400) + final + b"data: [DONE]\n\n"), (2022, 400))
        end = event({"type": "message_delta", "usage": {"output_tokens": 7}}, "message_delta")
        self.assertEqual(metered(anthropic_start(1, CACHED) + ANTHROPIC_DELTA * 7 + end), (2022, 7))

    def test_cached_prompts_one_rule(self) -> None:
        """A4: the same cached prompt is 2,022 tokens on every route and mode."""
        usage = {
            "completion_tokens": 3,
            "prompt_tokens": 2022,
            "prompt_tokens_details": {"cached_tokens": CACHED},
        }
        whole = {"choices": [], "usage": usage, "timings": timings(1, CACHED, 3)}
        anthropic = {
            "type": "message",
            "usage": {"cache_read_input_tokens": CACHED, "input_tokens": 1, "output_tokens": 3},
        }
        streamed = chat_stream(3) + chat_chunk({}, "stop", timings=timings(1, CACHED, 3))
        with_usage = streamed + event({"choices": [], "usage": usage})
        for answer in (json.dumps(whole).encode(), json.dumps(anthropic).encode(), streamed, with_usage):
            self.assertEqual(metered(answer), (2022, 3), answer[-200:])

    def test_the_client_is_told_what_the_meter_counts(self) -> None:
        """A4: the translated APIs tell their clients the meter's numbers, cached ones apart."""
        streamed = Tally()
        for chunk in (
            {"choices": [{"delta": {"content": "m"}}]},
            {"choices": [], "timings": timings(1, CACHED, 3)},
        ):
            streamed.add(chunk)
        whole = Tally().whole(
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 2022,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": CACHED},
                },
            }
        )
        for tally in (streamed, whole):
            self.assertEqual((tally.counts, tally.cached), ((2022, 3), CACHED))
            usage = responses_shapes.response_object("r", 0, {}, "completed", [], tally)["usage"]
            self.assertEqual(
                (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]), (2022, CACHED)
            )
            self.assertEqual(
                ollama_shapes.counts(*tally.counts), {"prompt_eval_count": 2022, "eval_count": 3}
            )
