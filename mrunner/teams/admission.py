"""The one check a keyed inference request passes before it waits for a runner, and its end.

Any front end calls L{Teams.admit} once it has read the body (it needs the
model and the length asked, read by the API's L{Length}), sends
L{Ticket.headers} with the answer, builds the runner's body with
L{Ticket.runner_body}, lets L{Ticket.meter} see the runner's answer, and
calls L{Ticket.end} when the answer is over, however it ended. The counts live
here, by key name, so a reloaded configuration changes a key's rules at once
and keeps what it has used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mrunner.config import ANONYMOUS
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.lengths import NONE, Length
from mrunner.teams.limits import Allowance, Grant, Headers, RateLimited
from mrunner.teams.members import Member
from mrunner.teams.meter import Meter
from mrunner.teams.usage import UsageBook

#: The grant of a request no token limit applies to: no headers, no cap, nothing reserved.
UNLIMITED = Grant(())


class Teams:
    """Admits requests by their key's rules, and counts what they used (usage, metrics, limits)."""

    def __init__(self, now: Callable[[], float], book: UsageBook, metrics: KeyMetrics):
        self.now = now
        self.book = book
        self._metrics = metrics
        self._allowances: dict[str, Allowance] = {}

    def admit(
        self, member: Member | None, model: str, payload: Mapping[str, Any], length: Length = NONE
    ) -> Ticket:
        """A ticket for a request of C{member} (None: an anonymous key, or no keys) to C{model} (normalised,
        and one the key may use: L{mrunner.teams.access.check_usable} said so), whose API says in
        C{payload} how long its answers may be as C{length} reads it.

        @raise RateLimited: the key is over a limit (its headers and C{Retry-After} say which, and when).
        """
        now = self.now()
        if member is None:
            return Ticket(self, ANONYMOUS, model, now, None, length)
        name = member.name
        if not member.limited:
            return Ticket(self, name, model, now, None, length)
        allowance = self._allowances.get(name)
        if allowance is None:
            allowance = self._allowances[name] = Allowance()
        try:
            grant = allowance.admit(member, now, length.read(payload), self.book.used_today(name))
        except RateLimited:
            self._metrics.limited(name)
            self.book.add(name, model, 0, 0, True, 0.0)
            raise
        return Ticket(self, name, model, now, allowance, length, grant)

    def _ended(self, ticket: Ticket, status: int, prompt: int, completion: int) -> None:
        now = self.now()
        if ticket.allowance is not None:
            ticket.allowance.end(now, prompt + completion, ticket.grant.reserved)
        self.book.add(ticket.key, ticket.model, prompt, completion, status >= 400, now - ticket.started)
        self._metrics.ended(ticket.key, status, prompt, completion)


class Ticket:
    """One admitted request: its key's name, the headers its answer carries, the length its runner is
    told, and the meter of its tokens."""

    def __init__(
        self,
        teams: Teams,
        key: str,
        model: str,
        started: float,
        allowance: Allowance | None,
        length: Length = NONE,
        grant: Grant = UNLIMITED,
    ):
        self.key = key
        self.model = model
        self.started = started
        self.allowance = allowance
        self.grant = grant
        self.meter = Meter()
        self._length = length
        self._teams: Teams | None = teams

    @property
    def headers(self) -> Headers:
        return self.grant.headers

    def runner_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body to send the runner: a key with a token limit has the length it reserved written in
        (L{Length.imposed}); any other request's C{body} is sent as it is."""
        return self._length.imposed(body, self.grant.cap)

    def end(self, status: int) -> None:
        """The answer is over with C{status}: charge what it used; only the first call counts."""
        teams, self._teams = self._teams, None
        if teams is not None:
            prompt, completion = self.meter.tokens()
            teams._ended(self, status, prompt, completion)
