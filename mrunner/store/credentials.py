"""A registry's credentials for the daemon: C{[registry.auth]} in tap.conf first, then Docker's config.

Docker's config (L{mrunner.docker_config}) is read at each lookup, as each
C{docker} command reads it, so a C{docker login} or C{mrunner login} counts at
the next pull without a restart. A credential helper runs as a child process
of the reactor, found on C{PATH} only, with the registry on its standard input
and only the environment a helper needs (not the daemon's secrets), and is
killed after C{timeout} seconds; a helper that fails, hangs or answers nonsense
is logged (its name, the registry and how it failed, never its output, which
may hold a secret) and the lookup goes on to C{auths}. A config.json that
cannot be read is logged the same way, and the pull goes on without credentials.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mrunner import docker_config
from mrunner.docker_config import Credential, DockerConfigError

HELPER_TIMEOUT = 10.0
#: A helper's answer is a few hundred bytes; more is not read.
MAX_ANSWER = 64 * 1024


class _Helper(ProcessProtocol):
    """Writes the request to the helper's standard input, keeps (a bounded amount of) what it says."""

    def __init__(self, request: bytes) -> None:
        self._request = request
        self.output = b""
        self.exited: Deferred[int | None] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self._request)
        self.transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == 1 and len(self.output) < MAX_ANSWER:
            self.output += data[: MAX_ANSWER - len(self.output)]
        elif childFD == 2 and docker_config.NOT_FOUND.encode() in data.lower():
            self.output += data[:200]  # only to recognise the miss, which helpers tell on either stream

    def processExited(self, reason: Failure) -> None:
        """On exit, not at the end of its pipes: a helper's own children may hold them open."""
        if not self.exited.called:
            self.exited.callback(0 if reason.check(ProcessDone) else getattr(reason.value, "exitCode", None))


def _kill(process: Any) -> None:
    with suppress(ProcessExitedAlready):  # it exited as the time ran out
        process.signalProcess("KILL")


class Credentials:
    """Finds the credentials for a registry host (L{find})."""

    log = Logger()

    def __init__(
        self,
        configured: Mapping[str, Mapping[str, str]],
        reactor: Any = None,
        environ: Mapping[str, str] | None = None,
        timeout: float = HELPER_TIMEOUT,
    ) -> None:
        """Without C{environ}, only C{configured} (C{[registry.auth]}) is used."""
        self._configured = configured
        self._reactor = reactor
        self._environ = environ
        self._timeout = timeout

    @property
    def config_file(self) -> str | None:
        """The Docker config this daemon reads (None: only C{[registry.auth]}), for C{mrunner status}."""
        return None if self._environ is None else str(docker_config.config_path(self._environ))

    async def find(self, host: str) -> Credential | None:
        """C{[registry.auth]}, else the helper, else C{auths}; a source that fails is logged and skipped."""
        entry = self._configured.get(host)
        if entry:
            return Credential(entry.get("username", ""), entry.get("password", ""))
        if self._environ is None:
            return None
        try:
            config = docker_config.read(docker_config.config_path(self._environ))
        except DockerConfigError as e:
            self._skipped("Docker credentials", host, e)
            return None
        try:
            helper = docker_config.helper_for(config, host)
            found = await self._run(helper, host) if helper else None
        except DockerConfigError as e:
            self._skipped("credential helper", host, e)
            found = None
        try:
            return found or docker_config.stored(config, host)
        except DockerConfigError as e:
            self._skipped("Docker credentials", host, e)
            return None

    def _skipped(self, source: str, host: str, error: DockerConfigError) -> None:
        self.log.warn("{source} for {host} not used: {error}", source=source, host=host, error=str(error))

    async def _run(self, helper: str, host: str) -> Credential | None:
        """C{docker-credential-HELPER get}: its answer, or None for a miss.

        @raise DockerConfigError: the helper is missing, hung, failed or answered nonsense.
        """
        name = docker_config.program(helper)
        environment = docker_config.helper_environment(self._environ or {})
        executable = shutil.which(name, path=environment.get("PATH", ""))
        if executable is None:
            raise DockerConfigError(f"the credential helper {name} is not on PATH")
        protocol = _Helper(docker_config.server_key(host).encode())
        process = self._reactor.spawnProcess(protocol, executable, [executable, "get"], env=environment)
        timer = self._reactor.callLater(self._timeout, _kill, process)
        code = await protocol.exited
        if timer.active():
            timer.cancel()
        else:
            raise DockerConfigError(f"{name} did not answer within {self._timeout:g}s and was killed")
        if code != 0:
            if docker_config.is_miss(protocol.output):
                return None
            raise DockerConfigError(f"{name} get exited with code {code}")
        try:
            return docker_config.helper_answer(protocol.output)
        except DockerConfigError as e:
            raise DockerConfigError(f"{name} get: {e}") from None
