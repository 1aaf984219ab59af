"""The seams of mrunner: the api calls an IScheduler, which uses IBackends and an IModelStore.

The model routes change the store through IModelStoreAdmin, IModelPuller and IModelPusher.
The seams speak in L{mrunner.values} and import nothing else of mrunner (a contract says so),
so a layer that names a seam depends on no other layer's implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from mrunner.values import (
        ContextSize,
        Device,
        Footprint,
        InstallStatus,
        ModelSettings,
        Preload,
        RunnerKey,
        RunnerSnapshot,
        Waiting,
    )
    from mrunner.values.backend import Command, RunnerSettings
    from mrunner.values.model import Deletion, Model, Reference, Reports
    from mrunner.values.request import Resolved


class IProgress(Interface):
    """Where a pull or push tells how it goes (L{mrunner.store.progress.Progress} is the one made)."""

    total = Attribute("Bytes the whole transfer moves: the store sets it once it knows the manifest.")
    bytes = Attribute("Bytes moved over the network so far, for the daemon's metrics.")

    def update(layer: str, size: int, current: int) -> None:
        """C{current} of the C{size} bytes of C{layer} are here (or sent)."""

    def moved(count: int) -> None:
        """C{count} more bytes went over the network (a blob already here moves none)."""

    def success(message: str) -> None:
        """The transfer is done."""

    def error(message: str) -> None:
        """The transfer failed, after progress was already told."""


class IUpload(Interface):
    """An import's files, staged by the store as the request body's bytes arrive.

    The front door puts one in place of the request's content (it is what
    twisted.web writes the body to), so a route knows by it that the body came
    staged (L{mrunner.store.upload.Upload} is the one made).
    """

    received = Attribute("Bytes of the body written so far.")
    taken = Attribute("True once an import took the staged files over.")

    def write(data: bytes) -> None:
        """The next bytes of the body."""

    def tell() -> int:
        """Bytes written so far, as twisted.web asks of a request's content."""

    def seek(offset: int, whence: int = 0) -> None:
        """What twisted.web calls before the route runs; an upload is not read back."""

    def close() -> None:
        """twisted.web is done with the request: unless an import took the files, remove them."""


class IModelStore(Interface):
    """Models on local disk, found by Docker Model Runner's names: what running them needs.

    The scheduler and the inference APIs reach the store through this alone, and so
    cannot change what it holds; that is L{IModelStoreAdmin}'s.
    """

    def resolve(name: str) -> Model:
        """The L{Model} named C{name} (normalised, tag, digest or short id).

        @raise BadRequest: a name that is not a valid reference.
        @raise NotFound: no such model here.
        """

    def list() -> list[Model]:
        """Every stored L{Model}."""

    def disk_usage() -> int:
        """Bytes the store occupies, partial downloads aside."""

    def partials_usage() -> int:
        """Bytes of partial downloads (kept so a pull resumes; removed when old)."""

    def ready(model: Model) -> Deferred[Model]:
        """C{model} (as L{resolve} found it), checked for loading: its blobs' sizes, and their
        digests the first time since start.

        @raise ModelCorrupt: (in the Deferred) a blob is missing or corrupt; it is quarantined.
        """

    def fewest_tokens(model: Model, texts: Sequence[str], past: int) -> Deferred[int | None]:
        """At least how many tokens C{model}'s tokenizer makes of C{texts}, the parts of one request,
        counted up to C{past + 1}, from its vocabulary alone (no runner); None where the store
        cannot tell (no vocabulary it reads)."""


class IModelStoreAdmin(IModelStore):
    """What the model routes (C{/models}, Ollama's model routes) do to the store: import, tag,
    delete, verify.

    Apart from L{IModelStore} because its callers are apart: these change what is stored
    (and sit behind C{admin_api_keys}), while the inference path only reads, so its fakes
    stay small and its types say it cannot change the store.
    """

    def import_gguf(
        name: str, source: BinaryIO, licenses: Sequence[bytes] = (), context_size: int | None = None
    ) -> Deferred[Model]:
        """Store the GGUF read from the binary file C{source} as C{name}, with C{licenses} as license layers.

        C{context_size}, when given, is recorded in the model's config as its default context size.

        @return: Deferred firing with the L{Model}; nothing is left behind on failure.
        """

    def import_package(name: str, source: BinaryIO, context_size: int | None = None) -> Deferred[Model]:
        """Store the package tar read from C{source} (see L{mrunner.store.package}), read in a thread."""

    def upload(packaged: bool) -> IUpload:
        """Where a GGUF file or (C{packaged}) a package tar is written as it arrives, for L{import_upload}."""

    def import_upload(name: str, upload: IUpload, context_size: int | None = None) -> Deferred[Model]:
        """Store as C{name} the model whose bytes were all written to C{upload}, without reading them again.

        The store takes the staged files over: it commits them, or removes them when the import fails.
        """

    def tag(source: str, target: str) -> Model:
        """Give the model C{source} the name C{target} (moving that tag if it was elsewhere)."""

    def deletion(name: str, force: bool = False) -> tuple[str, bool]:
        """The digest L{delete} would act on, and whether it would remove the whole model; or why it
        would refuse."""

    def delete(name: str, force: bool = False) -> Deletion:
        """Remove the name C{name}, as C{docker rmi} does: only that tag while another name holds the
        model, else the model and the blobs nothing else uses.

        @raise Conflict: C{name} is the id of a model with several tags and C{force} is false.
        @return: Docker's shape: C{[{"Untagged": tag}, ..., {"Deleted": digest}]}.
        """

    def verify(name: str | None = None) -> Deferred[Reports]:
        """Hash every blob of the model C{name} (of every model, without one) and report; a corrupt
        blob is quarantined.

        @return: per model C{{"id", "tags", "status": "ok"|"corrupt", "problem"?, "blobs": [...]}}.
        """


class IModelPuller(Interface):
    """Brings models into the store from where their names point (a registry, Hugging Face)."""

    def pull(ref: Reference, progress: IProgress) -> Deferred[Model]:
        """Fetch C{ref} and store it under its tag, telling C{progress} as bytes arrive."""


class IModelPusher(Interface):
    """Sends stored models to the registry their names point at."""

    def push(ref: Reference, progress: IProgress) -> Deferred[str]:
        """Push the model named C{ref} to C{ref}'s registry; fires with the manifest digest."""


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

    def footprint(model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        """L{memory} split into what can be offloaded to GPUs, layer by layer, and what stays in RAM."""

    def context(model: Model, settings: RunnerSettings) -> ContextSize:
        """The context a runner of C{model} with C{settings} asks for, and the one in force."""

    def disk_usage() -> int:
        """Bytes the installed backend occupies."""

    def uninstall() -> Deferred[None]:
        """Remove what C{install} put in place."""


class IDevices(Interface):
    """The devices runners can use, the host's RAM (C{CPU}) last; empty of GPUs on a CPU machine."""

    variant = Attribute("The llama-server build in use: C{cpu}, C{cuda}, C{rocm}, C{vulkan} or C{metal}.")

    def devices() -> list[Device]:
        """Each device as last seen: total, free (live where NVML reports it), budget and used."""

    def refresh() -> Deferred[list[Device]]:
        """Look again (NVML, else C{llama-server --list-devices}); fires with L{devices}' new answer."""

    def used_by(pid: int) -> dict[str, int]:
        """Bytes process C{pid} holds on each GPU as NVML measures them; none without NVML."""

    def check() -> None:
        """Warn of the C{[gpu] devices} the build does not list (after an install, when it is known)."""

    def watch(budgets: Callable[[tuple[tuple[str, int], ...]], object]) -> None:
        """Call C{budgets} with each GPU's budget (id, bytes) now, and again whenever they change.

        A budget is a share of a GPU's memory, which no runner's use moves: it changes only
        when the devices are listed again, so a load needs no look at them.
        """


class IRunnerProcess(Interface):
    """One runner's process, as its machine drives it (see L{mrunner.runners.process}): no state, no timer."""

    socket = Attribute("The UNIX socket path it serves on.")
    pid = Attribute("Its process id once spawned, else None.")
    options = Attribute("L{mrunner.runners.process.RunnerOptions}: its load timeout and stop grace.")
    ended = Attribute("Deferred: fires once the process has exited, whatever the reason.")
    how = Attribute("How it ended (C{exited with code 1}), once it has.")
    load_report = Attribute(
        "L{mrunner.backends.loadlines.LoadReport}: each device's buffers as its load output gave"
        " them, and the device that ran out of memory, if one did."
    )

    def start(on_output: Callable[[], object]) -> None:
        """Spawn it; C{on_output()} each time it writes while it loads. Raises if it cannot be spawned."""

    def healthy() -> Deferred[bool]:
        """Whether it answers C{GET /health} with 200 now."""

    def opened() -> None:
        """It answered: make its socket private and read its output now and then."""

    def failure(why: str) -> Exception:
        """The error of a start that failed for C{why}, with the tail of its output."""

    before_stop = Attribute(
        "None, or what C{terminate} calls first when the runner was ready (its prompt cache saves its"
        " slots): a Deferred whose firing, however it fires, sends the SIGTERM."
    )

    def terminate() -> None:
        """SIGTERM (once), after C{before_stop} has done when it is set and the runner was ready."""

    def kill() -> None:
        """SIGKILL; nothing once it has ended."""

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

    def admit() -> None:
        """Raise L{mrunner.errors.Unavailable} (503) when no new request is taken: draining or closed.

        Asked before anything about the request itself, so a node on its way out says so first.
        """

    def acquire(request: Resolved) -> Deferred[ILease]:
        """An L{ILease} on a ready runner for C{request}, taken as resolved (nothing is looked up again).

        Its C{keep_alive} (seconds, -1 for ever) replaces the runner's own from
        this request on. Its C{rank} is the priority class (0 high, 1 normal,
        2 low): waiters are served best class first. Cancelling the result drops the request from the
        wait queue. Every failure comes through the Deferred.
        """

    def snapshot() -> list[RunnerSnapshot]:
        """The runners as they are now, as frozen values."""

    def memory_budget() -> int:
        """Bytes the runners may use together; 0 for no budget."""

    def queued() -> int:
        """How many requests wait for a runner."""

    def ahead(request: Resolved) -> int | None:
        """How many requests are served before C{request} (the one given to L{acquire}), which waits
        in the queue; None while it does not: its backend installing, its files checked, or leased."""

    def waiting() -> list[Waiting]:
        """The queue, model by model (for C{/engines/ps} and the metrics)."""

    def preloads() -> list[Preload]:
        """The configured preloads and how each went."""

    def drain() -> Deferred[None]:
        """Take no new requests from now on (503, Retry-After); fire once those in flight are done."""

    def draining() -> bool:
        """Whether L{drain} was called: the node is on its way out."""

    def in_flight() -> int:
        """Requests queued for a runner or served by one now."""

    def unload(backend: str | None, models: Sequence[str], all: bool) -> Deferred[int]:
        """Stop idle runners (and drain busy ones) that match; fires with how many, once gone."""

    def configuration(backend: str | None, model: str) -> dict[str, Any]:
        """What C{model}'s next runner starts with (context size, flags, keep-alive, pin)."""

    def configure(backend: str | None, model: str, settings: ModelSettings) -> Deferred[bool]:
        """Set runner settings for C{model}; fires with whether anything changed.

        Fails with L{Conflict} while a runner it would restart is busy.
        """
