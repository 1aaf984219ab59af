"""A key's limits: requests and tokens in the last minute, tokens today, requests at once.

Pure bookkeeping over times it is given (no clock of its own), so the rules are
tested as a table. Minutes are sliding windows (a request counts for sixty
seconds after it began, its tokens for sixty seconds after it ended); a day is
the UTC day, whose totals come from the usage book and so survive restarts.
Over a limit is L{RateLimited}: a 429 with C{Retry-After} and the
C{x-ratelimit-*} headers OpenAI sends, which the official clients' retries read.
"""

from __future__ import annotations

import math
from collections import deque

from mrunner.errors import BadRequest, TooManyRequests
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


class Allowance:
    """One key's counts, kept by its name across reloads: the last minute's requests and tokens,
    the requests in flight."""

    def __init__(self) -> None:
        self._requests: deque[float] = deque()
        self._tokens: deque[tuple[float, int]] = deque()
        self._token_sum = 0
        self.in_flight = 0

    def admit(self, member: Member, now: float, asked: int, used_today: int) -> Headers:
        """Count a request that will ask for up to C{asked} tokens; return its C{x-ratelimit-*} headers.

        @raise RateLimited: over a limit, with the headers and when to retry.
        @raise BadRequest: C{asked} is more than a whole budget: no wait would help.
        """
        self._expire(now)
        asked = max(asked, 1)
        for limit, name in (
            (member.tokens_per_minute, "tokens_per_minute"),
            (member.tokens_per_day, "tokens_per_day"),
        ):
            if limit and asked > limit:
                raise BadRequest(
                    f"the request asks for up to {asked} tokens, more than this key's whole {name} ({limit});"
                    " ask for fewer (max_tokens)",
                    code="tokens_over_budget",
                    param="max_tokens",
                )
        refusal = self._refusal(member, now, asked, used_today)
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
        self._requests.append(now)
        self.in_flight += 1
        return self.headers(member, now, used_today)

    def _refusal(self, member: Member, now: float, asked: int, used_today: int) -> tuple[str, float] | None:
        """Which limit refuses the request and the seconds until it would not, or None."""
        if member.max_concurrent and self.in_flight >= member.max_concurrent:
            return f"max_concurrent ({member.max_concurrent} requests at once)", CONCURRENT_RETRY
        rpm = member.requests_per_minute
        if rpm and len(self._requests) >= rpm:
            return f"requests_per_minute ({rpm})", self._requests[-rpm] + MINUTE - now
        tpm = member.tokens_per_minute
        if tpm and self._token_sum + asked > tpm:
            return f"tokens_per_minute ({tpm})", self._tokens_free_at(tpm - asked) - now
        tpd = member.tokens_per_day
        if tpd and used_today + asked > tpd:
            return f"tokens_per_day ({tpd})", day_end(now) - now
        return None

    def _tokens_free_at(self, room: int) -> float:
        """When the minute's tokens will have fallen to C{room} or less."""
        left = self._token_sum
        for ended, tokens in self._tokens:
            left -= tokens
            if left <= room:
                return ended + MINUTE
        return math.inf  # not reached: asked is within the limit, and all the minute's tokens expire

    def end(self, now: float, tokens: int) -> None:
        """A request admitted by L{admit} is over, having used C{tokens} (prompt and completion)."""
        self.in_flight -= 1
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
            fields += _fields(b"tokens", member.tokens_per_minute, self._token_sum, reset)
        elif member.tokens_per_day:
            fields += _fields(b"tokens", member.tokens_per_day, used_today, day_end(now) - now)
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
