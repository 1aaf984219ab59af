"""Installs each backend once, as a Deferred chain that every waiter shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mrunner.errors import NotFound, Unavailable
from mrunner.interfaces import IBackend
from mrunner.moves import Moves
from mrunner.values import InstallState, InstallStatus

INSTALL_RETRY_AFTER = 5.0

#: NOT_INSTALLED → INSTALLING (with progress) → RUNNING | ERROR; an ERROR is tried again.
INSTALL_MOVES = Moves(
    "backend install",
    {
        InstallState.NOT_INSTALLED: frozenset({InstallState.INSTALLING}),
        InstallState.INSTALLING: frozenset(
            {InstallState.INSTALLING, InstallState.RUNNING, InstallState.ERROR}
        ),
        InstallState.RUNNING: frozenset(),
        InstallState.ERROR: frozenset({InstallState.INSTALLING}),
    },
)


@attrs.define
class _Install:
    """One backend's install; its status changes only by the moves of L{INSTALL_MOVES}."""

    backend: IBackend
    status: InstallStatus = attrs.Factory(InstallStatus)
    waiters: list[Deferred[None]] = attrs.field(factory=list)

    def move(self, state: InstallState, detail: str = "") -> None:
        self.status = InstallStatus(INSTALL_MOVES.check(self.status.state, state), detail)

    @property
    def running(self) -> bool:
        return self.status.state is InstallState.RUNNING

    @property
    def installing(self) -> bool:
        return self.status.state is InstallState.INSTALLING

    def describe(self) -> str:
        """For an error message: C{"installing (building llama.cpp 40%)"}."""
        state = self.status.state.value.lower()
        return f"{state} ({self.status.detail})" if self.status.detail else state


class Installer:
    """Runs C{backend.install()} once and lets any number of requests wait on it.

    A failed install is reported in its status and tried again by the next C{wait}.
    """

    log = Logger()

    def __init__(
        self,
        backends: Mapping[str, IBackend],
        clock: IReactorTime,
        on_installed: Callable[[str], object] = lambda name: None,
    ):
        self._clock = clock
        self._on_installed = on_installed
        self._installs = {name: _Install(backend) for name, backend in backends.items()}

    def __contains__(self, name: object) -> bool:
        return name in self._installs

    def statuses(self) -> dict[str, InstallStatus]:
        return {name: install.status for name, install in self._installs.items()}

    def start(self, name: str) -> None:
        """Begin installing C{name} ahead of its first request; the service does it for the default."""
        self._begin(name)

    def wait(self, name: str, timeout: float | None) -> Deferred[None]:
        """Fire once C{name} is installed; 503 if that fails or takes over C{timeout} (None: no limit)."""
        install = self._installs.get(name)
        if install is None:
            return fail(NotFound(f"there is no backend named {name!r}", code="backend_not_found"))
        if install.running:
            return succeed(None)
        if not install.installing:
            self._begin(name)
            if install.running:
                return succeed(None)
        waiter: Deferred[None] = Deferred(canceller=install.waiters.remove)
        install.waiters.append(waiter)

        def still_installing(result: object, timeout: float) -> None:
            raise Unavailable(
                f"backend {name} is not ready yet ({install.describe()}); try again shortly",
                code="backend_installing",
                retry_after=INSTALL_RETRY_AFTER,
            )

        if timeout is None:
            return waiter
        return waiter.addTimeout(timeout, self._clock, onTimeoutCancel=still_installing)

    def _begin(self, name: str) -> None:
        install = self._installs[name]
        if install.installing or install.running:
            return
        install.move(InstallState.INSTALLING)
        self.log.info("installing backend {backend}", backend=name)

        def report(message: str) -> None:
            if install.installing:
                install.move(InstallState.INSTALLING, message)

        def installed(version: str) -> None:
            install.move(InstallState.RUNNING, version)
            self.log.info("backend {backend} ready: {version}", backend=name, version=version)
            self._on_installed(name)
            self._wake(install, None)

        def failed(reason: Failure) -> None:
            message = reason.getErrorMessage() or f"{type(reason.value).__name__} without a message"
            install.move(InstallState.ERROR, message)
            self.log.error("backend {backend} failed to install: {error}", backend=name, error=message)
            self._wake(
                install,
                Unavailable(f"backend {name} failed to install: {message}; see GET /logs, then try again"),
            )

        install.backend.install(report).addCallbacks(installed, failed)

    @staticmethod
    def _wake(install: _Install, error: Exception | None) -> None:
        waiters, install.waiters = install.waiters, []
        for waiter in waiters:
            if error is None:
                waiter.callback(None)
            else:
                waiter.errback(error)
