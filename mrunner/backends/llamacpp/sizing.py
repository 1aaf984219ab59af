"""How much memory a llama-server of a model needs, and how llama.cpp places it over devices."""

from __future__ import annotations

import os

import attrs

from mrunner.values import ContextSize, Footprint
from mrunner.values.backend import RunnerSettings
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
#: Model files llama-server loads beside the weights (the vision projector), by role.
LOADED_FILES = ("mmproj",)


def context_size(model: Model, settings: RunnerSettings) -> int:
    """The ``--ctx-size`` a runner gets: the context in force (L{context_in_force}).

    Never llama-server's own default (0, the model's training context), which
    can be 128k tokens and many GiB of KV cache; the memory estimate needs this
    number too.
    """
    return context_in_force(model, settings).in_force or DEFAULT_CONTEXT_SIZE


def pool_size(model: Model, settings: RunnerSettings) -> int:
    """The runner's KV pool in tokens: a whole context (L{context_size}) for each of its slots.

    A context size is what one request may use. With one pool of C cells for P
    slots, two requests of 5,000 tokens on an 8,192 context both got llama-server's
    500 "Context size has been exceeded" (issue 49); with P x C cells, each slot
    capped at C (``--kv-unified-per-slot``), the slots never run out of room.
    """
    return context_size(model, settings) * max(1, settings.parallel)


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
    - KV cache: f16 keys and values of every layer for the pool
      (L{pool_size}: a whole context per slot);
    - compute buffers, reserved for one micro-batch of ``UBATCH`` tokens: the
      f16 attention mask (``UBATCH`` x pool) plus activations, about
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

    context = pool_size(model, settings)
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


def files_size(model: Model) -> int:
    """Bytes of the files a runner loads: every weights shard and the projector (0 for a missing one)."""
    paths = [*model.weights, *(model.files[role] for role in LOADED_FILES if role in model.files)]
    return sum(os.path.getsize(path) if os.path.exists(path) else 0 for path in paths)
