"""Follow streams (``/logs`` and ``/engines/requests`` with ``follow=true``): capped, and paced by the client.

A follow holds its connection for as long as its client stays, so follows
have their own cap, C{[http] max_followers} (at most half of
C{max_connections}): past it a follow gets 429, and connections are left for
C{/health} and chats (before, 512 follows took every connection).

A follow is a push producer on its request: nothing is written while the
client's socket takes no more. A log follow then stops reading the files (its
tail remembers where it was); a records follow holds the records that end
meanwhile, and is dropped once they pass L{MAX_HELD} bytes. The records a
follow starts with are the store's own, held unwritten: ``?limit=`` bounds them.
With 25 MB of records, 20 record followers that read nothing added 12.5 MB of
the daemon's memory each when every event was written at once; now 0.3 MB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from zope.interface import implementer

from mrunner.config import Config
from mrunner.errors import TooManyRequests

#: Bytes of new records a follow may hold for a client that does not read; past it, it is dropped.
MAX_HELD = 4 * 1024 * 1024


class Followers:
    """The open follows, within the cap of the configuration in use."""

    def __init__(self, config: Config) -> None:
        self._open: set[Feed] = set()
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Use C{config}'s cap for follows opened from now on."""
        http = config.http
        self.limit = max(1, min(http.max_followers, http.max_connections // 2))

    def open(self, request: IRequest) -> Feed:
        """A new follow's L{Feed}, before anything is written to C{request}; 429 past the cap."""
        if len(self._open) >= self.limit:
            raise TooManyRequests(
                f"{self.limit} follow streams are open, the most mrunner serves at once ([http]"
                " max_followers, at most half of max_connections); close one, or ask without follow=true",
                code="too_many_followers",
            )
        feed = Feed(request, self._open.discard)
        self._open.add(feed)
        return feed

    def __len__(self) -> int:
        return len(self._open)


@implementer(IPushProducer)
class Feed:
    """One follow's stream: written while the client reads, held (within a bound) while it does not."""

    log = Logger()

    def __init__(self, request: IRequest, closed: Callable[[Feed], None], max_held: int = MAX_HELD) -> None:
        self.paused = False
        self._request = request
        self._closed = closed
        self._max_held = max_held
        self._held: deque[tuple[Callable[[], bytes], int]] = deque()
        self._held_bytes = 0
        self._open = True
        request.registerProducer(self, True)  # type: ignore[attr-defined]

    def send(self, make: Callable[[], bytes], size: int = 0) -> None:
        """Write what C{make} makes, now or once the client reads; held, C{size} counts against the bound."""
        if not self._open:
            return
        self._held.append((make, size))
        self._held_bytes += size
        self._flush()
        if self._held_bytes > self._max_held:
            self.log.info(
                "dropped a follow whose client read nothing while {held} bytes waited for it",
                held=self._held_bytes,
            )
            self.close()
            self._request.transport.abortConnection()  # type: ignore[attr-defined]

    def _flush(self) -> None:
        while self._held and not self.paused:
            make, size = self._held.popleft()
            self._held_bytes -= size
            self._request.write(make())  # may pause this feed: the client's socket is full

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        self._flush()

    def stopProducing(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop: forget what is held and leave the cap. Finishing the request is the route's."""
        if self._open:
            self._open = False
            self._held.clear()
            self._held_bytes = 0
            self._closed(self)
            if getattr(self._request, "channel", None) is not None:  # None once the client is gone
                self._request.unregisterProducer()  # type: ignore[attr-defined]


class OpenFollows:
    """A route group's open follows: each ends when its client leaves, or all when the daemon stops."""

    def __init__(self) -> None:
        self._stops: dict[Deferred[bytes], Callable[[], None]] = {}

    def hold(self, stop: Callable[[], None]) -> Deferred[bytes]:
        """The route's answer for a follow that C{stop} ends; Klein cancels it when the client leaves."""

        def hung_up(done: Deferred[bytes]) -> None:
            self._stops.pop(done)()

        done: Deferred[bytes] = Deferred(canceller=hung_up)
        self._stops[done] = stop
        return done

    def end(self) -> None:
        """Stop every follow and end its answer."""
        stops, self._stops = self._stops, {}
        for done, stop in stops.items():
            stop()
            done.callback(b"")
