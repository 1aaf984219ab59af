"""The ``llama-server`` command line of a runner: its model's files, its settings, its placement."""

from __future__ import annotations

from pathlib import Path

from mrunner.backends.llamacpp.sizing import context_size, pool_size
from mrunner.errors import BadRequest
from mrunner.values import Placement
from mrunner.values.backend import COMPLETION, EMBEDDING, RERANKING, Command, RunnerSettings
from mrunner.values.model import Model

#: Model files llama-server loads beside the weights, by role, and the flag that names each.
FILE_FLAGS = {"mmproj": "--mmproj", "chat_template": "--chat-template-file"}

_MODE_FLAGS = {
    COMPLETION: (),
    EMBEDDING: ("--embeddings",),
    RERANKING: ("--embeddings", "--reranking"),
}


def command(
    executable: str,
    model: Model,
    mode: str,
    socket: str,
    settings: RunnerSettings,
    slot_states: Path | None = None,
    cache_ram: int = 0,
) -> Command:
    """C{executable} (``llama-server``) serving C{model} in C{mode} on the UNIX socket C{socket}.

    The model's projector and chat template layers are passed as ``--mmproj``
    and ``--chat-template-file``; a split model is opened at its first shard;
    a draft model in the settings as ``--model-draft``; the prompt caches' flags
    (L{cache_args}) before the model's own flags, which still win.

    A context size is what one request may use: the slots share one pool
    (``--kv-unified``) of a whole context each (L{pool_size}), and
    ``--kv-unified-per-slot`` caps each slot at that context, so no slot can take
    another's room and llama-server never answers "Context size has been exceeded".
    """
    if not socket.endswith(".sock"):
        raise ValueError(f"llama-server listens on a UNIX socket only if it ends in .sock: {socket}")
    args = [
        *("--model", model.gguf, "--host", socket, "--alias", model.name),
        *("--ctx-size", str(pool_size(model, settings)), "--parallel", str(settings.parallel)),
        *("--kv-unified", "--kv-unified-per-slot", str(context_size(model, settings))),
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
    if model.config.get("format") == "whisper":
        raise BadRequest(
            f"model {model.name} is a Whisper model: it turns speech into text"
            " (POST /v1/audio/transcriptions), which llama.cpp does not serve",
            code="model_is_whisper",
        )
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
    args += [*cache_args(mode, slot_states, cache_ram), *_MODE_FLAGS[mode], *settings.flags]
    return Command(executable, tuple(args))


def cache_args(mode: str, slot_states: Path | None, cache_ram: int) -> list[str]:
    """The prompt caches' flags: ``--slot-save-path`` (mrunner's, L{mrunner.cache}: a completion
    runner's slots saved before a planned stop) and ``--cache-ram`` (llama-server's own, in RAM:
    8 GiB by default and counted nowhere; mrunner counts C{cache_ram} bytes in the runner's memory,
    and 0 turns it off, and ``--cache-idle-slots`` with it, which would otherwise clear the idle
    slots on each new request and leave nothing in them to reuse or save).
    """
    args = ["--cache-ram", str(cache_ram // 2**20)]
    if slot_states is not None and mode == COMPLETION:
        args += ["--slot-save-path", str(slot_states)]
    return args


def placement_args(placement: Placement, draft: bool = False) -> list[str]:
    """The flags that put a runner's layers where the plan says: ``--device`` lists the GPUs it
    uses, ``-ngl`` counts the layers they hold, ``--tensor-split`` shares them out.

    ``--fit off``: the pinned llama-server otherwise changes every unset
    argument to fit the memory free when it starts, which another runner may
    be about to take; mrunner has done the arithmetic against its budgets, so
    two runners never plan for the same free memory. A flag of the model's
    own ``runtime_flags`` comes later and still wins. The runner serves at
    llama-server's default verbosity: the pinned build prints each device's
    buffers only at ``-lv 4``, which also logs every request (64 streams of
    256 tokens: 11,251 lines against 615; 7.7 MB for 49,000 tokens on an
    H200), so NVML's reading of the runner's process measures its use of
    each GPU instead (issue 48); an out-of-memory error prints at any level.
    """
    devices = [device for device, _ in placement.layers]
    args = ["--fit", "off", "--device", ",".join(devices) or "none"]
    args += ["--n-gpu-layers", str(placement.gpu_layers)]
    if len(devices) > 1:
        args += ["--tensor-split", ",".join(str(n) for _, n in placement.layers)]
    if draft:
        args += ["--gpu-layers-draft", "0"]
    return args


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
