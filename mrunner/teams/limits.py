"""A key's limits: requests and tokens in the last minute, tokens today, requests at once.

Pure bookkeeping over times it is given (no clock of its own), so the rules are
tested as a table. Minutes are sliding windows (a request counts for sixty
seconds after it began, its tokens for sixty seconds after it ended); a day is
the UTC day, whose totals come from the usage book and so survive restarts.
What a request may generate is reserved when it is admitted and settled when
it ends, so requests sent at once cannot together pass a budget each fits alone.
Over a limit is L{RateLimited}: a 429 with C{Retry-After} and the
C{x-ratelimit-*} headers OpenAI sends, which the official clients' retries read.
"""

from __future__ import annotations

import math
from collections import deque

import attrs

from mrunner.errors import BadRequest, TooManyRequests
from mrunner.teams.lengths import Ask
from mrunner.teams.members import Member

MINUTE = 60.0
DAY = 86400.0
#: A request at the concurrency limit may retry as soon as another ends: one second is a fair guess.
CONCURRENT_RETRY = 1.0

Headers = tuple[tuple[bytes, bytes], ...]


class RateLimited(TooManyRequests):
    """Over one of a key's limits: retry after C{retry_after} seconds (the headers say which limit)."""

    code = "rate_limit_exceeded"


def day_end(now: float) -> float:
    """When the UTC day of C{now} ends (a daily budget starts afresh then)."""
    return (math.floor(now / DAY) + 1) * DAY


def reset_text(seconds: float) -> bytes:
    """A reset time as OpenAI writes it in C{x-ratelimit-reset-*}: C{1s}, C{6m0s}, C{0.5s}."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.3g}s".encode()
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours}h" if hours else "").encode() + f"{minutes}m{rest}s".encode()


@attrs.frozen
class Grant:
    """What admission gave a request: its headers, the length its runner is told, the tokens held for it."""

    headers: Headers
    #: Tokens per answer the runner must be told (None: no token limit, the request's own length stands).
    cap: int | None = None
    #: Tokens held for the request until it ends (L{Allowance.end}), counted as used meanwhile.
    reserved: int = 0


class Allowance:
    """One key's counts, kept by its name across reloads: the last minute's requests and tokens,
    the requests in flight and the tokens they may still generate."""

    def __init__(self) -> None:
        self._requests: deque[float] = deque()
        self._tokens: deque[tuple[float, int]] = deque()
        self._token_sum = 0
        self.in_flight = 0
        #: Tokens the requests in flight may still generate: what they reserved when admitted.
        self.reserved = 0

    def admit(self, member: Member, now: float, ask: Ask, used_today: int) -> Grant:
        """Count a request that may generate C{ask}; reserve that against the token limits.

        A request that gives no length gets what is left of the tightest budget as its cap
        (shared among its answers), so that it too stops within the budget.

        @raise RateLimited: over a limit, with the headers and when to retry.
        @raise BadRequest: the request asks for more than a whole budget: no wait would help.
        """
        self._expire(now)
        budgets = [
            (limit, name)
            for limit, name in (
                (member.tokens_per_minute, "tokens_per_minute"),
                (member.tokens_per_day, "tokens_per_day"),
            )
            if limit
        ]
        # At least a token for each answer when no length is given (a prompt alone costs tokens too).
        need = max(ask.answers if ask.tokens is None else ask.tokens * ask.answers, 1)
        for limit, name in budgets:
            if need > limit:
                raise BadRequest(
                    f"the request asks for up to {need} tokens ({ask.answers} answers), more than this key's"
                    f" whole {name} ({limit}); ask for fewer (max_tokens, n)",
                    code="tokens_over_budget",
                    param="max_tokens",
                )
        refusal = self._refusal(member, now, need, used_today)
        if refusal is not None:
            why, retry = refusal
            error = RateLimited(
                f"key {member.name!r} is over its {why}; retry in {math.ceil(retry)}s", retry_after=retry
            )
            error.headers = (
                *self.headers(member, now, used_today),
                (b"retry-after-ms", b"%d" % (retry * 1000)),
            )
            raise error
        cap = None
        if budgets and ask.tokens != 0:
            cap = ask.tokens if ask.tokens is not None else self._room(member, used_today) // ask.answers
            self.reserved += cap * ask.answers
        self._requests.append(now)
        self.in_flight += 1
        return Grant(self.headers(member, now, used_today), cap, 0 if cap is None else cap * ask.answers)

    def _room(self, member: Member, used_today: int) -> int:
        """Tokens left in the tightest of C{member}'s budgets, what requests in flight hold aside."""
        rooms = [
            limit - used - self.reserved
            for limit, used in (
                (member.tokens_per_minute, self._token_sum),
                (member.tokens_per_day, used_today),
            )
            if limit
        ]
        return max(0, min(rooms))

    def _refusal(self, member: Member, now: float, need: int, used_today: int) -> tuple[str, float] | None:
        """Which limit refuses the request and the seconds until it would not, or None.

        A budget full only with what requests in flight reserved may have room again as soon as
        one ends (and charges what it used): it is retried like the concurrency limit."""
        if member.max_concurrent and self.in_flight >= member.max_concurrent:
            return f"max_concurrent ({member.max_concurrent} requests at once)", CONCURRENT_RETRY
        rpm = member.requests_per_minute
        if rpm and len(self._requests) >= rpm:
            return f"requests_per_minute ({rpm})", self._requests[-rpm] + MINUTE - now
        held = f"; {self.reserved} held for requests in flight" if self.reserved else ""
        tpm = member.tokens_per_minute
        if tpm and self._token_sum + need > tpm:
            return f"tokens_per_minute ({tpm}{held})", self._tokens_free_at(tpm - need) - now
        if tpm and self._token_sum + self.reserved + need > tpm:
            return f"tokens_per_minute ({tpm}{held})", CONCURRENT_RETRY
        tpd = member.tokens_per_day
        if tpd and used_today + need > tpd:
            return f"tokens_per_day ({tpd}{held})", day_end(now) - now
        if tpd and used_today + self.reserved + need > tpd:
            return f"tokens_per_day ({tpd}{held})", CONCURRENT_RETRY
        return None

    def _tokens_free_at(self, room: int) -> float:
        """When the minute's tokens will have fallen to C{room} or less."""
        left = self._token_sum
        for ended, tokens in self._tokens:
            left -= tokens
            if left <= room:
                return ended + MINUTE
        return math.inf  # not reached: need is within the limit, and all the minute's tokens expire

    def end(self, now: float, tokens: int, reserved: int = 0) -> None:
        """A request admitted by L{admit} is over, having used C{tokens} (prompt and completion): its
        reservation (L{Grant.reserved}) is let go and what it used is counted instead."""
        self.in_flight -= 1
        self.reserved -= reserved
        if tokens > 0:
            self._tokens.append((now, tokens))
            self._token_sum += tokens

    def headers(self, member: Member, now: float, used_today: int) -> Headers:
        """OpenAI's C{x-ratelimit-*} headers for the limits C{member} has (none for those it has not)."""
        fields: list[tuple[bytes, bytes]] = []
        if member.requests_per_minute:
            reset = self._requests[0] + MINUTE - now if self._requests else 0.0
            fields += _fields(b"requests", member.requests_per_minute, len(self._requests), reset)
        if member.tokens_per_minute:
            reset = self._tokens[-1][0] + MINUTE - now if self._tokens else 0.0
            fields += _fields(b"tokens", member.tokens_per_minute, self._token_sum + self.reserved, reset)
        elif member.tokens_per_day:
            fields += _fields(
                b"tokens", member.tokens_per_day, used_today + self.reserved, day_end(now) - now
            )
        return tuple(fields)

    def _expire(self, now: float) -> None:
        start = now - MINUTE
        requests, tokens = self._requests, self._tokens
        while requests and requests[0] <= start:
            requests.popleft()
        while tokens and tokens[0][0] <= start:
            self._token_sum -= tokens.popleft()[1]


def _fields(kind: bytes, limit: int, used: int, reset: float) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-ratelimit-limit-" + kind, b"%d" % limit),
        (b"x-ratelimit-remaining-" + kind, b"%d" % max(0, limit - used)),
        (b"x-ratelimit-reset-" + kind, reset_text(reset)),
    ]
