"""What a streamed request is sent while it waits in the queue for its runner: SSE comments.

A load takes a minute on a real machine, and a queue behind a busy model can
take as long; a client, or a proxy in front of mrunner (nginx's
C{proxy_read_timeout} is 60 s), that reads nothing for that long gives up, and
the person at it does not know why. So a request that asked for server-sent
events (OpenAI's, Anthropic's and the Responses API's C{stream: true}) and has
waited L{FIRST} seconds in the queue gets its answer's head (200,
C{text/event-stream}) and a comment, C{: waiting for ai/x to load, 3 ahead},
then one every L{EVERY} seconds until its lease comes. Every SSE client skips
comment lines. Ollama's NDJSON has no comments, so its streams get none.

Only a request in the loader's queue is noted: one whose backend is still
installing has not waited long (C{[scheduler] install_wait}), and its 503 with
C{Retry-After} is what a client retries. Once the head is out, the wait's end
is the runner's events, or its error as the stream's last event in the API's
shape (L{mrunner.api.errors.render_error}). The notes are not the answer: a
request's record neither keeps them nor takes the first for its first byte.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.web.server import Request

from mrunner.proxy.relay import start_event_stream, unrecorded

#: Seconds in the queue before the first note, and between notes.
FIRST = 3.0
EVERY = 5.0
#: Seconds before looking again at a request not yet queued (its backend installing).
RECHECK = 1.0


class WaitNotes:
    """Writes C{note()} as a comment every L{EVERY} seconds from L{FIRST} on, until L{stop}.

    C{note} says what the request waits for, or None while it is not queued.
    """

    def __init__(self, request: Request, clock: IReactorTime, note: Callable[[], str | None]):
        self._request = request
        self._clock = clock
        self._note = note
        self._call: IDelayedCall = clock.callLater(FIRST, self._write)

    def _write(self) -> None:
        note = self._note()
        if note is None:
            self._call = self._clock.callLater(RECHECK, self._write)
            return
        if not self._request.startedWriting:
            self._request.setResponseCode(200)
            self._request.setHeader(b"content-type", b"text/event-stream")
            self._request.setHeader(b"cache-control", b"no-cache")
            start_event_stream(self._request)
        unrecorded(self._request, b": " + note.encode() + b"\n\n")
        self._call = self._clock.callLater(EVERY, self._write)

    def stop(self) -> None:
        """The lease came, or the wait failed or was cancelled: no more notes."""
        if self._call.active():
            self._call.cancel()


def wait_note(model: str, loaded: bool, ahead: int) -> str:
    """What a note says: the model it waits to load, or for a free slot of, and how many are ahead."""
    what = f"a free slot of {model}" if loaded else f"{model} to load"
    return f"waiting for {what}, {ahead} ahead"
