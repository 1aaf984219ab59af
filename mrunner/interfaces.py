"""The seams of mrunner: the api calls an IScheduler, which uses IBackends and an IModelStore."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from mrunner.backends.base import Command, RunnerSettings
    from mrunner.store.model import Model
    from mrunner.values import ContextSize, InstallStatus, ModelSettings, Preload, RunnerKey, RunnerSnapshot


class IModelStore(Interface):
    """Models on local disk, found by Docker Model Runner's names."""

    def resolve(name: str) -> Model:
        """The L{Model} named C{name} (normalised, tag, digest or short id).

        @raise BadRequest: a name that is not a valid reference.
        @raise NotFound: no such model here.
        """

    def list() -> list[Model]:
        """Every stored L{Model}."""

    def import_gguf(
        name: str, source: BinaryIO, licenses: Sequence[bytes] = (), context_size: int | None = None
    ) -> Deferred[Model]:
        """Store the GGUF read from the binary file C{source} as C{name}, with C{licenses} as license layers.

        C{context_size}, when given, is recorded in the model's config as its default context size.

        @return: Deferred firing with the L{Model}; nothing is left behind on failure.
        """

    def disk_usage() -> int:
        """Bytes the store occupies, partial downloads aside."""

    def partials_usage() -> int:
        """Bytes of partial downloads (kept so a pull resumes; removed when old)."""

    def ready(name: str) -> Deferred[Model]:
        """The L{Model} named C{name}, checked for loading: its blobs' sizes, and their
        digests the first time since start.

        @raise ModelCorrupt: (in the Deferred) a blob is missing or corrupt; it is quarantined.
        """


class IBackend(Interface):
    """An inference engine: it installs itself and builds a runner's command line."""

    name = Attribute("The backend's name in routes and config, e.g. C{llama.cpp}.")
    manages_models = Attribute("True when the backend fetches its own models.")

    def install(report: Callable[[str], None]) -> Deferred[str]:
        """Make the backend runnable, calling C{report(str)} with progress.

        @return: Deferred firing with a version string, e.g. C{"llama.cpp 0c1e570"}.
        """

    def command(model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        """The L{Command} that serves C{model} in C{mode} on the UNIX socket path C{socket}."""

    def memory(model: Model, mode: str, settings: RunnerSettings) -> int:
        """Bytes a runner of C{model} in C{mode} with C{settings} is estimated to need."""

    def context(model: Model, settings: RunnerSettings) -> ContextSize:
        """The context a runner of C{model} with C{settings} asks for, and the one in force."""

    def disk_usage() -> int:
        """Bytes the installed backend occupies."""

    def uninstall() -> Deferred[None]:
        """Remove what C{install} put in place."""


class IRunnerProcess(Interface):
    """One started runner process, as the loader sees it (see L{mrunner.scheduling.process})."""

    socket = Attribute("The UNIX socket path it serves on.")
    pid = Attribute("Its process id, or None once it has ended.")
    ready = Attribute("Deferred: fires when it answers, fails (L{RunnerFailed}) if it cannot start.")
    ended = Attribute("Deferred: fires once the process has exited, whatever the reason.")

    def stop() -> None:
        """SIGTERM now, SIGKILL after the grace period; a no-op once it has ended."""

    def rss() -> int | None:
        """Its resident memory in bytes, None when it cannot be read."""


class ILease(Interface):
    """A request's hold on a slot of a ready runner: what forwarding needs, and nothing else."""

    socket = Attribute("The runner's UNIX socket path.")
    model = Attribute("The model's name, as the runner serves it.")

    def release() -> None:
        """Give the slot back (idempotent): call it when the answer has ended, however it ended."""


class ILoaderEvents(Interface):
    """What happens to runners, told as it happens (metrics count it); C{model} is the model's name.

    C{key} is the runner's L{RunnerKey}: backend, model digest, mode.
    """

    def loaded(key: RunnerKey, model: str, seconds: float) -> None:
        """A runner became ready C{seconds} after it was started."""

    def load_failed(key: RunnerKey, model: str) -> None:
        """A runner could not be started or never became ready."""

    def evicted(key: RunnerKey, model: str, reason: str) -> None:
        """A runner was told to go: C{idle}, C{memory} (room for another), C{unload} or C{crash}."""

    def exited(key: RunnerKey, model: str, cause: str) -> None:
        """A runner's process ended: C{stopped} (asked to), C{crashed} or C{failed} (while loading)."""


class IScheduler(Interface):
    """Gets a request a runner: install the backend, find the model, load it, queue for a slot.

    The API and metrics see the scheduler through this alone: frozen snapshots,
    leases and plain values, never the loader's records.
    """

    def backend_name(backend: str | None) -> str:
        """C{backend}, or the default backend's name.

        @raise NotFound: a backend mrunner does not have.
        """

    def backend_statuses() -> dict[str, InstallStatus]:
        """Each backend's install status."""

    def acquire(
        backend: str | None, model: str, mode: str, keep_alive: float | None = None
    ) -> Deferred[ILease]:
        """An L{ILease} on a ready runner for C{model} in C{mode}.

        A C{keep_alive} (seconds, -1 for ever) replaces the runner's own from
        this request on. Cancelling the result drops the request from the
        wait queue. Every failure comes through the Deferred.
        """

    def snapshot() -> list[RunnerSnapshot]:
        """The runners as they are now, as frozen values."""

    def memory_budget() -> int:
        """Bytes the runners may use together; 0 for no budget."""

    def queued() -> int:
        """How many requests wait for a runner."""

    def preloads() -> list[Preload]:
        """The configured preloads and how each went."""

    def unload(backend: str | None, models: Sequence[str], all: bool) -> Deferred[int]:
        """Stop idle runners (and drain busy ones) that match; fires with how many, once gone."""

    def configuration(backend: str | None, model: str) -> dict[str, Any]:
        """What C{model}'s next runner starts with (context size, flags, keep-alive, pin)."""

    def configure(backend: str | None, model: str, settings: ModelSettings) -> Deferred[bool]:
        """Set runner settings for C{model}; fires with whether anything changed.

        Fails with L{Conflict} while a runner it would restart is busy.
        """
