"""The daemon's log files: ``$MRUNNER_HOME/logs/daemon.log`` beside one log per runner, and its access log.

The daemon's own events are copied into ``daemon.log`` (whatever else twistd
does with them), so ``GET /logs`` can show them with the runners' output; a
L{LogTail} reads every ``*.log`` there and hands back new lines by source, in
the order of the times their lines begin with (L{mrunner.home.LOG_TIME}).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import (
    ILogObserver,
    Logger,
    LogPublisher,
    eventFromJSON,
    formatEventAsClassicLogText,
    formatTime,
    globalLogPublisher,
    jsonFileLogObserver,
    textFileLogObserver,
)
from twisted.python.logfile import LogFile
from twisted.web.server import Site

from mrunner.home import LOG_TIME, PRIVATE_FILE, Home

DAEMON = "daemon"
ROTATE_BYTES = 10_000_000
KEEP_ROTATED = 3
BACKLOG_BYTES = 1024 * 1024
#: The time a log line begins with (L{LOG_TIME}; twistd's own, to the second, is read too).
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?[+-]\d{4}(?= )")


class DaemonLogFile(Service):
    """Writes every log event of this process to C{home.logs}/daemon.log while running, rotated at 10 MB.

    The first service to start: it makes the home (owner-only) before anything writes there.
    With C{json}, each event is one JSON text (twisted.logger's format, for log shippers).
    """

    def __init__(self, home: Home, publisher: LogPublisher = globalLogPublisher, json: bool = False) -> None:
        self._home = home
        self._json = json
        self._directory = home.logs
        self._publisher = publisher
        self._file: LogFile | None = None
        self._observer: ILogObserver | None = None

    def startService(self) -> None:
        self._home.prepare()
        self._file = LogFile(
            f"{DAEMON}.log",
            str(self._directory),
            rotateLength=ROTATE_BYTES,
            maxRotatedFiles=KEEP_ROTATED,
            defaultMode=PRIVATE_FILE,
        )
        file: Any = self._file  # LogFile takes str
        observer = jsonFileLogObserver(file) if self._json else textFileLogObserver(file, timeFormat=LOG_TIME)
        self._observer = observer
        self._publisher.addObserver(self._observer)
        super().startService()

    def stopService(self) -> None:
        super().stopService()
        if self._observer is not None and self._file is not None:
            self._publisher.removeObserver(self._observer)
            self._file.close()
            self._observer = self._file = None


class AccessLog:
    """The access log's lines, logged together once a second rather than as an event each.

    An event per request went through twisted.logger's formatting for every
    observer (twistd's log and daemon.log): a sixth of the daemon's CPU on small
    chats (py-spy). A batch is one event: its lines after the first are
    indented by twistd's log format.
    """

    log = Logger(namespace="access")

    def __init__(self, clock: IReactorTime, interval: float = 1.0) -> None:
        self._clock = clock
        self._interval = interval
        self._lines: list[str] = []
        self._flushing: IDelayedCall | None = None

    def write(self, line: str) -> None:
        self._lines.append(line)
        if self._flushing is None:
            self._flushing = self._clock.callLater(self._interval, self.flush)

    def flush(self) -> None:
        self._flushing = None
        if self._lines:
            lines, self._lines = "".join(self._lines).rstrip("\n"), []
            self.log.info("{lines}", lines=lines)

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        self.flush()


class BatchedLogSite(Site):
    """A Site whose access log is an L{AccessLog}."""

    def __init__(self, resource: Any, reactor: Any, **kwargs: Any) -> None:
        super().__init__(resource, reactor=reactor, **kwargs)

    def startFactory(self) -> None:
        super().startFactory()
        self.logFile = AccessLog(self.reactor)


class LogTail:
    """Remembers how far each log file was read; L{read} returns the complete lines written since.

    A file seen for the first time gives at most its last C{backlog} bytes; a
    file that shrank (rotated or truncated) is read again from its start.
    """

    def __init__(
        self,
        directory: Path,
        backlog: int = BACKLOG_BYTES,
        sources: Callable[[str], bool] = lambda name: True,
    ) -> None:
        """Read the logs whose source (file name without C{.log}) C{sources} accepts."""
        self._directory = directory
        self._backlog = backlog
        self._sources = sources
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[tuple[str, str]]:
        """New C{(source, line)} pairs, the logs merged by the times their lines begin with.

        A line without a time (an event's second line, a runner's log from before lines had
        times) goes with the line before it; on equal times the daemon's come first, then the
        runners' by file name, each file in its own order.
        """
        logs: list[list[tuple[float, str, str]]] = []
        for path in self._files():
            try:
                logs.append(list(_timed(path.stem, (readable(line) for line in self._new_lines(path)))))
            except FileNotFoundError:  # removed or rotated between listing and reading
                self._offsets.pop(path, None)
        return [(source, line) for _, source, line in heapq.merge(*logs, key=lambda timed: timed[0])]

    def _files(self) -> list[Path]:
        try:
            files = [
                path
                for path in self._directory.iterdir()
                if path.suffix == ".log" and self._sources(path.stem)
            ]
        except FileNotFoundError:
            return []
        return sorted(files, key=lambda path: (path.stem != DAEMON, path.name))

    def _new_lines(self, path: Path) -> list[str]:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            start = self._offsets.get(path)
            first = start is None
            if start is None:
                start = max(0, size - self._backlog)
            elif size < start:
                start = 0
            f.seek(start)
            data = f.read(size - start)
        if first and start > 0:  # the backlog began mid-line: start at the next one
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        self._offsets[path] = start + end
        # Split at newlines alone: splitlines() would also cut at the JSON log's record separator.
        return data[:end].decode("utf-8", errors="replace").split("\n")[:-1]


def _timed(source: str, lines: Iterator[str]) -> Iterator[tuple[float, str, str]]:
    """Each line of one log with the time it, or the last line before it that has one, begins with."""
    when = float("-inf")
    for line in lines:
        stamp = _STAMP.match(line)
        if stamp is not None:
            with suppress(ValueError):  # a date that is no date: the time before it stands
                when = datetime.fromisoformat(stamp.group()).timestamp()
        yield when, source, line


def readable(line: str) -> str:
    """A line of the log as text: a JSON event (C{[log] format = "json"}) as the text log would show it."""
    if not line.startswith("\x1e"):
        return line
    try:
        text = formatEventAsClassicLogText(eventFromJSON(line[1:]), partial(formatTime, timeFormat=LOG_TIME))
    except ValueError:
        return line
    return (text or line).rstrip("\n")
