"""The one check a keyed inference request passes before it waits for a runner, and its end.

Any front end calls L{Teams.admit} once it has read the body (it needs the
model and C{max_tokens}), sends L{Ticket.headers} with the answer, lets
L{Ticket.meter} see the answer's bytes, and calls L{Ticket.end} when the
answer is over, however it ended. The counts live here, by key name, so a
reloaded configuration changes a key's rules at once and keeps what it has used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mrunner.config import ANONYMOUS
from mrunner.teams.key_metrics import KeyMetrics
from mrunner.teams.limits import Allowance, Headers, RateLimited
from mrunner.teams.members import Member
from mrunner.teams.meter import Meter
from mrunner.teams.usage import UsageBook

#: Where each API's request says the most tokens it may generate.
_MAX_TOKENS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def asked_tokens(payload: Mapping[str, Any]) -> int:
    """The most tokens a request may generate, as it says (0 when it does not)."""
    for field in _MAX_TOKENS:
        value = payload.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    options = payload.get("options")  # Ollama's
    value = options.get("num_predict") if isinstance(options, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class Teams:
    """Admits requests by their key's rules, and counts what they used (usage, metrics, limits)."""

    def __init__(self, now: Callable[[], float], book: UsageBook, metrics: KeyMetrics):
        self.now = now
        self.book = book
        self._metrics = metrics
        self._allowances: dict[str, Allowance] = {}

    def admit(self, member: Member | None, model: str, payload: Mapping[str, Any]) -> Ticket:
        """A ticket for a request of C{member} (None: an anonymous key, or no keys) to C{model} (normalised),
        which the key may use (L{mrunner.teams.access.check_usable} said so).

        @raise RateLimited: the key is over a limit (its headers and C{Retry-After} say which, and when).
        """
        now = self.now()
        if member is None:
            return Ticket(self, ANONYMOUS, model, now, None)
        name = member.name
        if not member.limited:
            return Ticket(self, name, model, now, None)
        allowance = self._allowances.get(name)
        if allowance is None:
            allowance = self._allowances[name] = Allowance()
        try:
            headers = allowance.admit(member, now, asked_tokens(payload), self.book.used_today(name))
        except RateLimited:
            self._metrics.limited(name)
            self.book.add(name, model, 0, 0, True, 0.0)
            raise
        return Ticket(self, name, model, now, allowance, headers)

    def _ended(self, ticket: Ticket, status: int, prompt: int, completion: int) -> None:
        now = self.now()
        if ticket.allowance is not None:
            ticket.allowance.end(now, prompt + completion)
        self.book.add(ticket.key, ticket.model, prompt, completion, status >= 400, now - ticket.started)
        self._metrics.ended(ticket.key, status, prompt, completion)


class Ticket:
    """One admitted request: its key's name, the headers its answer carries, and the meter of its tokens."""

    def __init__(
        self,
        teams: Teams,
        key: str,
        model: str,
        started: float,
        allowance: Allowance | None,
        headers: Headers = (),
    ):
        self.key = key
        self.model = model
        self.started = started
        self.allowance = allowance
        self.headers = headers
        self.meter = Meter()
        self._teams: Teams | None = teams

    def end(self, status: int) -> None:
        """The answer is over with C{status}: charge what it used; only the first call counts."""
        teams, self._teams = self._teams, None
        if teams is not None:
            prompt, completion = self.meter.tokens()
            teams._ended(self, status, prompt, completion)
