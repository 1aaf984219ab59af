"""The llama.cpp backend: find or build ``llama-server`` and start it for one model.

``python -m mrunner.backends.llamacpp [CONFIG]`` installs it ahead of time,
printing progress, so the first request does not wait for a build.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mrunner.backends import build, childprocess, cuda, variants
from mrunner.config import Config
from mrunner.devices import listing
from mrunner.devices.listing import Listed
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend
from mrunner.values import ContextSize, Footprint, Placement
from mrunner.values.backend import COMPLETION, EMBEDDING, RERANKING, Command, RunnerSettings
from mrunner.values.model import Model

#: The context size when neither the runner settings nor the model's config name one.
MAX_DEFAULT_CONTEXT_SIZE = 8192
F16_BYTES = 2
#: llama-server's default micro-batch, in tokens.
UBATCH = 512
#: Compute-buffer bytes per token of a micro-batch per embedding dimension.
ACTIVATION_BYTES = 48
#: Resident bytes of a llama-server whose model, cache and buffers are negligible.
BASE_RSS = 16 * 2**20
DEFAULT_CONTEXT_SIZE = 4096
#: Seconds a ``llama-server --version`` probe may take.
PROBE_TIMEOUT = 30.0

#: Model files llama-server loads beside the weights, by role, and the flag that names each.
FILE_FLAGS = {"mmproj": "--mmproj", "chat_template": "--chat-template-file"}
LOADED_FILES = ("mmproj",)

_MODE_FLAGS = {
    COMPLETION: (),
    EMBEDDING: ("--embeddings",),
    RERANKING: ("--embeddings", "--reranking"),
}
# "version: 0.5.0-dev (build 1, commit 0c1e570)" now, "version: 4123 (0c1e570)" in older builds.
_VERSION = re.compile(r"version:.*\(.*?\b([0-9a-f]{7,40})\)")


def context_size(model: Model, settings: RunnerSettings) -> int:
    """The ``--ctx-size`` a runner gets: the context in force (L{context_in_force}).

    Never llama-server's own default (0, the model's training context), which
    can be 128k tokens and many GiB of KV cache; the memory estimate needs this
    number too.
    """
    return context_in_force(model, settings).in_force or DEFAULT_CONTEXT_SIZE


def context_in_force(model: Model, settings: RunnerSettings) -> ContextSize:
    """The context asked for (the settings', else the model config's up to 8192, else 4096), and
    the one in force: no more than the model was trained for.

    With ``--kv-unified`` a slot may use the whole context, but llama-server caps
    a slot at the model's trained context (its log says "capping", nothing else
    does) while it still allocates the KV cache for all of ``--ctx-size``: 2.36 GiB
    for SmolLM2-135M asked for 100000 tokens, where its 8192 take 311 MiB. So a
    runner is started with the context in force, whichever load starts it (one
    that ``_configure`` restarts, or the next request's), and the estimate is of that.
    """
    if settings.context_size:
        asked = settings.context_size
    else:
        named = int(model.config.get("context_size") or DEFAULT_CONTEXT_SIZE)
        asked = min(named, MAX_DEFAULT_CONTEXT_SIZE)
    trained = model.trained_context
    return ContextSize(asked, asked if trained is None else min(asked, trained))


def memory_estimate(model: Model, settings: RunnerSettings) -> int:
    """Bytes a llama-server of C{model} needs on the CPU, as it allocates them.

    - weights: the GGUF file (every shard of a split model), mapped whole, and
      the vision projector's, loaded whole;
    - KV cache: f16 keys and values of every layer for the context; with
      ``--kv-unified`` the slots share one cache, so C{settings.parallel}
      does not multiply it;
    - compute buffers, reserved for one micro-batch of ``UBATCH`` tokens: the
      f16 attention mask (``UBATCH`` x context) plus activations, about
      48 bytes per embedding dimension per token (read off llama-server's
      ``compute buffer size`` for the test models);
    - the process itself: code, libraries and server state (``BASE_RSS``,
      the resident size of a llama-server with a near-empty model);
    - a draft model for speculative decoding: its own weights, KV cache and
      buffers for the same context, in the same process.
    """
    draft = 0
    if settings.draft is not None:
        draft = memory_estimate(settings.draft, attrs.evolve(settings, draft=None)) - BASE_RSS
    parts = _parts(model, settings)
    return files_size(model) + parts.kv_cache + parts.compute + BASE_RSS + draft


@attrs.frozen
class _Parts:
    blocks: int
    kv_cache: int
    compute: int


def _parts(model: Model, settings: RunnerSettings) -> _Parts:
    """The model's repeating blocks, its KV cache and its compute buffers for C{settings}."""
    metadata = model.config.get("gguf") or {}
    architecture = model.config.get("architecture") or metadata.get("general.architecture")

    def number(key: str, default: int) -> int:
        try:
            return int(metadata[f"{architecture}.{key}"])
        except (KeyError, TypeError, ValueError):
            return default

    context = context_size(model, settings)
    embedding = number("embedding_length", 0)
    heads = number("attention.head_count", 1) or 1
    head_size = embedding // heads
    per_token = number("attention.head_count_kv", heads) * (
        number("attention.key_length", head_size) + number("attention.value_length", head_size)
    )
    blocks = number("block_count", 0)
    kv_cache = blocks * context * per_token * F16_BYTES
    compute = UBATCH * context * F16_BYTES + UBATCH * embedding * ACTIVATION_BYTES
    return _Parts(blocks, kv_cache, compute)


def footprint(model: Model, settings: RunnerSettings) -> Footprint:
    """L{memory_estimate} split the way llama.cpp places a model over devices.

    ``-ngl N`` offloads the last N of the model's layers, counting its blocks
    and then the output layer (so blocks + 1 offloads everything): each block's
    weights go with its KV cache to the device that holds it, and every GPU in
    use reserves its own compute buffer, about as large as the CPU's. The
    token embeddings, the vision projector, a draft model (run with
    ``--gpu-layers-draft 0``) and the process itself stay in RAM. The layers
    are taken as equal shares of the weights file and the KV cache: the file's
    non-repeating tensors (embeddings, output) are a small part of any model
    worth a GPU, and the measured use corrects the rest (L{loadlines}).
    A model without GGUF metadata has no layers to offload.
    """
    total = memory_estimate(model, settings)
    parts = _parts(model, settings)
    if not parts.blocks:
        return Footprint(total)
    layers = parts.blocks + 1
    weights = sum(os.path.getsize(path) if os.path.exists(path) else 0 for path in model.weights)
    per_layer = (weights + parts.kv_cache) // layers
    return Footprint(total - layers * per_layer, layers, per_layer, parts.compute)


def placement_args(placement: Placement, draft: bool = False) -> list[str]:
    """The flags that put a runner's layers where the plan says: ``--device`` lists the GPUs it
    uses, ``-ngl`` counts the layers they hold, ``--tensor-split`` shares them out.

    ``--fit off``: the pinned llama-server otherwise changes every unset
    argument to fit the memory free when it starts, which another runner may
    be about to take; mrunner has done the arithmetic against its budgets, so
    two runners never plan for the same free memory. A flag of the model's
    own ``runtime_flags`` comes later and still wins. ``-lv 4``: the pinned
    build logs each device's buffers only at that verbosity, and the measured
    use is read from those lines (L{mrunner.backends.loadlines}); it adds
    about 30 lines to a runner's log per request.
    """
    devices = [device for device, _ in placement.layers]
    args = ["--fit", "off", "-lv", "4", "--device", ",".join(devices) or "none"]
    args += ["--n-gpu-layers", str(placement.gpu_layers)]
    if len(devices) > 1:
        args += ["--tensor-split", ",".join(str(n) for _, n in placement.layers)]
    if draft:
        args += ["--gpu-layers-draft", "0"]
    return args


def files_size(model: Model) -> int:
    """Bytes of the files a runner loads: every weights shard and the projector (0 for a missing one)."""
    paths = [*model.weights, *(model.files[role] for role in LOADED_FILES if role in model.files)]
    return sum(os.path.getsize(path) if os.path.exists(path) else 0 for path in paths)


def cache_root(settings: Mapping[str, Any], environ: Mapping[str, str]) -> Path:
    """Where every daemon of this user shares builds: the ``cache`` key, else the XDG cache."""
    if settings.get("cache"):
        return Path(str(settings["cache"])).expanduser()
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "~"), ".cache")
    return Path(xdg).expanduser() / "mrunner"


def build_dir(root: Path, variant: str = "cpu") -> Path:
    """The pinned build of C{variant}'s directory under C{root} ($MRUNNER_HOME or the shared cache)."""
    return root / "backends" / "llama.cpp" / variants.directory_name(build.PIN, variant)


def failure_note(directory: Path) -> Path:
    """Where a failed GPU build's reason is kept, so the next start does not spend a build failing again."""
    return directory.with_name(directory.name + ".failed")


def cached_executable(environ: Mapping[str, str] = os.environ, variant: str = "cpu") -> Path:
    """Where ``python -m mrunner.backends.llamacpp`` (``make backend``) puts the shared build."""
    return build.executable_in(build_dir(cache_root({}, environ), variant))


@attrs.frozen
class _Installed:
    executable: Path
    version: str
    # The directory install() built or found under $MRUNNER_HOME or the cache; None for
    # a configured or PATH executable, which is not ours to measure or remove.
    directory: Path | None


@implementer(IBackend)
class LlamaCppBackend:
    """llama.cpp's ``llama-server``, one process per (model, mode), on a UNIX socket."""

    name = "llama.cpp"
    manages_models = False
    log = Logger()

    def __init__(
        self, config: Config, reactor: Any, environ: Mapping[str, str] = os.environ, fallback: bool = True
    ):
        self._reactor = reactor
        self._fallback = fallback
        self._environ = environ
        self._settings = config.backend(self.name)
        self._home = config.home
        self._cache = cache_root(self._settings, environ)
        self._installed: _Installed | None = None
        self._listed: list[Listed] = []
        #: The build in use: C{cpu} until install() finds out otherwise.
        self.variant = "cpu"

    @property
    def executable(self) -> Path | None:
        """The ``llama-server`` that install() found or built, else None."""
        return self._installed.executable if self._installed else None

    def install(self, report: Callable[[str], object]) -> Deferred[str]:
        """Use a configured, PATH, earlier or shared build, else build into the shared cache."""
        return Deferred.fromCoroutine(self._install(report))

    async def _install(self, report: Callable[[str], object]) -> str:
        self.variant = "cpu"
        configured = self._settings.get("path")
        if configured:
            path = Path(str(configured)).expanduser()
            report(f"checking {path}")
            if not path.exists():
                raise build.InstallFailed(f"llama-server not found at {path}: configured path does not exist")
            version = await self._probe(path)
            self._use(path, version, None)
            return await self._listing(version)
        try:
            setting = str(self._settings.get("variant", "auto"))
            wanted = variants.choose(setting, variants.Machine(self._environ))
        except variants.UnknownVariant as e:
            raise build.InstallFailed(str(e)) from None
        if wanted == "cpu":
            return await self._listing(await self._find_or_build("cpu", report))
        failed = failure_note(build_dir(self._cache, wanted))
        try:
            if self._fallback and failed.exists():
                again = f"python -m mrunner.backends.llamacpp --variant={wanted}"
                raise build.InstallFailed(
                    f"{failed.read_text().strip()} (earlier: `{again}` or removing {failed} tries again)"
                )
            version = await self._find_or_build(wanted, report)
        except build.InstallFailed as e:
            if not failed.exists():
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(str(e))
            if not self._fallback:
                raise
            self.log.warn("the {variant} build failed, using the CPU build: {error}", variant=wanted, error=e)
            version = await self._find_or_build("cpu", report)
            return f"{version} (cpu: the {wanted} build failed: {e})"
        failed.unlink(missing_ok=True)
        self.variant = wanted
        return await self._listing(version)

    async def _find_or_build(self, variant: str, report: Callable[[str], object]) -> str:
        """An earlier build of C{variant} (or for cpu one on PATH) if it runs, else a new one in the cache."""
        report("looking for llama-server")
        for path, directory in self._candidates(variant):
            try:
                version = await self._probe(path)
            except build.InstallFailed as e:
                self.log.warn("ignoring {path}: {error}", path=path, error=e)
                continue
            return self._use(path, version, directory)
        flags: list[str] = [*variants.CMAKE_FLAGS[variant]]
        if variant == "cuda":
            nvcc = shutil.which("nvcc", path=self._environ.get("PATH", os.defpath))
            if nvcc is None:
                raise build.InstallFailed("cannot build the cuda variant: nvcc not found on PATH")
            report("finding cuBLAS")
            try:
                wheels = self._cache / "backends" / "llama.cpp"
                flags += await cuda.flags(self._reactor, nvcc, wheels, self._environ)
            except (childprocess.ChildFailed, OSError) as e:
                raise build.InstallFailed(f"cannot build the cuda variant: {e}") from None
        directory = build_dir(self._cache, variant)
        builder = build.Build(self._reactor, directory, report, environ=self._environ, flags=flags)
        await builder.run()
        return self._use(builder.executable, await self._probe(builder.executable), directory)

    def _candidates(self, variant: str) -> Iterator[tuple[Path, Path | None]]:
        """Existing executables in order of preference: PATH (cpu only), $MRUNNER_HOME, the shared cache."""
        on_path = shutil.which("llama-server", path=self._environ.get("PATH", os.defpath))
        if on_path and variant == "cpu":
            yield Path(on_path), None
        for directory in (build_dir(self._home, variant), build_dir(self._cache, variant)):
            executable = build.executable_in(directory)
            if executable.is_file():
                yield executable, directory

    async def _listing(self, version: str) -> str:
        """Ask the installed build for its devices; a build we did not make is of the variant it lists.

        Our own CPU build lists none, so it is not asked (a CPU machine starts as it always did).
        """
        ours = self._installed is not None and self._installed.directory is not None
        if ours and self.variant == "cpu":
            return version
        self._listed = await self.list_devices()
        if not ours:
            self.variant = listing.variant_of(self._listed)
        return version if self.variant == "cpu" else f"{version} ({self.variant})"

    def listed(self) -> list[Listed]:
        """The GPUs the installed build listed last; none before install()."""
        return list(self._listed)

    def list_devices(self) -> Deferred[list[Listed]]:
        """Run ``llama-server --list-devices``: the GPUs it prints; none (and a warning) if it fails or
        prints something else."""
        return Deferred.fromCoroutine(self._list_devices())

    async def _list_devices(self) -> list[Listed]:
        if self._installed is None:
            return []
        path = self._installed.executable
        found = listing.Listing()
        probe = childprocess.run(self._reactor, [str(path), "--list-devices"], on_line=found.feed)
        probe.addTimeout(PROBE_TIMEOUT, self._reactor)
        try:
            tail = (await probe).tail
        except (childprocess.ChildFailed, OSError, TimeoutError) as e:
            self.log.warn("{path} --list-devices failed, taking it as no GPUs: {error}", path=path, error=e)
            found, tail = listing.Listing(), ()
        if tail and not found.looks_like_listing():
            self.log.warn(
                "{path} --list-devices printed no device list, taking it as no GPUs: {output!r:.200}",
                path=path,
                output="\n".join(tail),
            )
        for reason in found.refused:
            self.log.warn("{path} --list-devices: {reason}", path=path, reason=reason)
        if found.over:
            self.log.warn(
                "{path} --list-devices listed {over} devices past the first {kept}; only those are used",
                path=path,
                over=found.over,
                kept=listing.MAX_DEVICES,
            )
        self._listed = found.devices
        return self.listed()

    async def _probe(self, path: Path) -> str:
        """Run C{path} ``--version``: the version string if it works, else L{InstallFailed}."""
        probe = childprocess.run(self._reactor, [str(path), "--version"])
        probe.addTimeout(PROBE_TIMEOUT, self._reactor)
        try:
            exit = await probe
        except (childprocess.ChildFailed, OSError) as e:
            raise build.InstallFailed(f"llama-server at {path} does not run: {e}") from None
        except TimeoutError:
            raise build.InstallFailed(
                f"llama-server at {path} does not run: `--version` took over {PROBE_TIMEOUT:.0f}s"
            ) from None
        for line in exit.tail:
            if match := _VERSION.search(line):
                return f"{self.name} {match[1]}"
        return f"{self.name} (unknown version)"

    def _use(self, executable: Path, version: str, directory: Path | None) -> str:
        self._installed = _Installed(executable, version, directory)
        self.log.info("using {executable} ({version})", executable=executable, version=version)
        return version

    def command(self, model: Model, mode: str, socket: str, settings: RunnerSettings) -> Command:
        """``llama-server`` serving C{model} in C{mode} on the UNIX socket C{socket}.

        The model's projector and chat template layers are passed as ``--mmproj``
        and ``--chat-template-file``; a split model is opened at its first shard;
        a draft model in the settings as ``--model-draft``.

        ``--kv-unified`` lets every parallel slot use the whole context (llama-server
        otherwise splits it into ``-np`` equal parts once ``-np`` is given), so the
        KV cache, and the memory estimate, do not grow with C{settings.parallel}.
        """
        if self._installed is None:
            raise RuntimeError("llama.cpp is not installed: call install() first")
        if not socket.endswith(".sock"):
            raise ValueError(f"llama-server listens on a UNIX socket only if it ends in .sock: {socket}")
        args = [
            *("--model", model.gguf, "--host", socket, "--alias", model.name),
            *("--ctx-size", str(context_size(model, settings))),
            *("--parallel", str(settings.parallel), "--kv-unified"),
            *("--metrics", "--jinja", "--no-webui"),
        ]
        for role, flag in FILE_FLAGS.items():
            if role in model.files:
                args += [flag, model.files[role]]
        if settings.draft is not None:  # a plain model as the draft: say which kind of drafting
            args += ["--model-draft", settings.draft.gguf, "--spec-type", "draft-simple"]
        if settings.threads > 0:
            args += ["--threads", str(settings.threads)]
        if settings.placement is not None:
            args += placement_args(settings.placement, draft=settings.draft is not None)
        if mode == RERANKING and not can_rerank(model):
            raise BadRequest(
                f"model {model.name} cannot rerank: it has no ranking head (GGUF pooling type"
                " 'rank'); use a reranker model",
                code="model_cannot_rerank",
            )
        if mode == EMBEDDING and not can_embed(model):
            raise BadRequest(
                f"model {model.name} is not an embedding model: its GGUF gives it no pooling type, so"
                " llama-server has no sentence embedding to answer with; use an embedding model",
                code="model_cannot_embed",
            )
        args += [*_MODE_FLAGS[mode], *settings.flags]
        return Command(str(self._installed.executable), tuple(args))

    def memory(self, model: Model, mode: str, settings: RunnerSettings) -> int:
        return memory_estimate(model, settings)

    def footprint(self, model: Model, mode: str, settings: RunnerSettings) -> Footprint:
        return footprint(model, settings)

    def context(self, model: Model, settings: RunnerSettings) -> ContextSize:
        return context_in_force(model, settings)

    def disk_usage(self) -> int:
        """Bytes of the directory install() built or found; 0 for an executable we do not own."""
        if self._installed is None or self._installed.directory is None:
            return 0
        return sum(
            os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(self._installed.directory)
            for name in names
        )

    def uninstall(self) -> Deferred[None]:
        """Remove the build install() used if it is ours; leave a configured or PATH one alone."""
        installed, self._installed = self._installed, None
        if installed is None or installed.directory is None:
            return succeed(None)
        return Deferred.fromCoroutine(build.discard(self._reactor, installed.directory))


def can_rerank(model: Model) -> bool:
    """Only rank pooling has a classification head: llama-server scores any other model with noise."""
    from gguf import PoolingType  # on first use, as in gguf_meta: gguf brings numpy

    return _pooling(model) == str(int(PoolingType.RANK))


def can_embed(model: Model) -> bool:
    """Whether the GGUF gives a pooling type other than none (a chat model gives none).

    Without one, llama-server refuses C{/v1/embeddings} ("Pooling type 'none' is not OAI
    compatible"). A model whose GGUF metadata is unknown is let through.
    """
    from gguf import PoolingType

    if not model.config.get("gguf"):
        return True
    return _pooling(model) not in (None, str(int(PoolingType.NONE)))


def _pooling(model: Model) -> str | None:
    """The GGUF's C{<architecture>.pooling_type}, as text; None when it gives none."""
    metadata = model.config.get("gguf") or {}
    architecture = model.config.get("architecture") or metadata.get("general.architecture")
    value = metadata.get(f"{architecture}.pooling_type")
    return None if value is None else str(value)


def main(reactor: Any, *argv: str) -> Deferred[None]:
    """Install the backend as the daemon would, printing each progress report.

    ``[CONFIG] [--variant=VARIANT]``: with a variant, that build only (``make cuda-build``):
    falling back to another is a failure here.
    """
    from mrunner import config

    variant = next((arg.partition("=")[2] for arg in argv if arg.startswith("--variant=")), None)
    config_path = next((arg for arg in argv if not arg.startswith("--")), None)
    settings = config.load(config_path)
    if variant is not None:
        table = {**settings.backend("llama.cpp"), "variant": variant}
        settings = attrs.evolve(settings, backends={**settings.backends, "llama.cpp": table})
    backend = LlamaCppBackend(settings, reactor, fallback=variant is None)

    def done(version: str) -> None:
        print(f"{version} ready: {backend.executable}", flush=True)

    def failed(failure: Failure) -> None:
        failure.trap(build.InstallFailed)
        print(f"Error: {failure.value}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    installing = backend.install(lambda message: print(f"Installing: {message}", flush=True))
    return installing.addCallbacks(done, failed)


if __name__ == "__main__":
    from twisted.internet.task import react

    react(main, sys.argv[1:])
