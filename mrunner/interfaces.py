"""The seams of mrunner: the api calls an IScheduler, which uses IBackends and an IModelStore."""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IModelStore(Interface):
    """Models on local disk, found by Docker Model Runner's names."""

    def resolve(name):
        """The L{Model} named C{name} (normalised, tag, digest or short id).

        @raise BadRequest: a name that is not a valid reference.
        @raise NotFound: no such model here.
        """

    def list():
        """Every stored L{Model}."""

    def import_gguf(name, source):
        """Store the GGUF read from the binary file C{source} as C{name}.

        @return: Deferred firing with the L{Model}; nothing is left behind on failure.
        """

    def disk_usage():
        """Bytes the store occupies."""


class IBackend(Interface):
    """An inference engine: it installs itself and builds a runner's command line."""

    name = Attribute("The backend's name in routes and config, e.g. C{llama.cpp}.")
    manages_models = Attribute("True when the backend fetches its own models.")

    def install(report):
        """Make the backend runnable, calling C{report(str)} with progress.

        @return: Deferred firing with a version string, e.g. C{"llama.cpp 0c1e570"}.
        """

    def command(model, mode, socket, settings):
        """The L{Command} that serves C{model} in C{mode} on the UNIX socket path C{socket}."""

    def memory(model, mode, settings):
        """Bytes a runner of C{model} in C{mode} with C{settings} is estimated to need."""

    def disk_usage():
        """Bytes the installed backend occupies."""

    def uninstall():
        """Remove what C{install} put in place; Deferred."""


class IScheduler(Interface):
    """Gets a request a runner: install the backend, find the model, load it, queue for a slot."""

    def backend_statuses():
        """C{{backend: "Running: …" | "Installing: …" | "Not Installed" | "Error: …"}}."""

    def acquire(backend, model, mode):
        """A Deferred L{Lease} on a ready runner for C{model} in C{mode}.

        Cancelling it drops the request from the wait queue.
        """

    def running():
        """Descriptions of the runners, for C{GET /engines/ps}."""

    def unload(backend, models, all):
        """Stop idle runners (and drain busy ones) that match; returns how many."""

    def configure(backend, model, settings):
        """Set runner settings for C{model}; L{Conflict} while its runner is busy."""
