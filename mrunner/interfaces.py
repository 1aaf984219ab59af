"""The seams of mrunner: the api calls an IScheduler, which uses IBackends and an IModelStore."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from mrunner.backends.base import Command, RunnerSettings
    from mrunner.scheduling.loader import Lease
    from mrunner.scheduling.scheduler import ModelSettings
    from mrunner.store.model import Model


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

    def disk_usage() -> int:
        """Bytes the installed backend occupies."""

    def uninstall() -> Deferred[None]:
        """Remove what C{install} put in place."""


class IScheduler(Interface):
    """Gets a request a runner: install the backend, find the model, load it, queue for a slot."""

    def backend_statuses() -> dict[str, str]:
        """C{{backend: "Running: …" | "Installing: …" | "Not Installed" | "Error: …"}}."""

    def acquire(
        backend: str | None, model: str, mode: str, keep_alive: float | None = None
    ) -> Deferred[Lease]:
        """A L{Lease} on a ready runner for C{model} in C{mode}.

        A C{keep_alive} (seconds, -1 for ever) replaces the runner's own from
        this request on. Cancelling the result drops the request from the
        wait queue.
        """

    def running() -> list[dict[str, Any]]:
        """Descriptions of the runners, for C{GET /engines/ps}."""

    def unload(backend: str | None, models: Sequence[str], all: bool) -> Deferred[int]:
        """Stop idle runners (and drain busy ones) that match; fires with how many, once gone."""

    def configure(backend: str | None, model: str, settings: ModelSettings) -> Deferred[Any]:
        """Set runner settings for C{model}; L{Conflict} while its runner is busy."""
