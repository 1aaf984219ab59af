"""Tiny GGUF models that the real llama-server loads and runs in milliseconds.

Random weights (fixed seed), a SentencePiece-style vocabulary with all 256
byte tokens, ChatML control tokens and a ChatML chat template. The weights are
shaped so that every generated token is a plain word: dimension 0 of the
residual stream is a constant that no layer writes, and the output rows of
control and byte tokens weigh it heavily negative. Replies are therefore
valid UTF-8 text of exactly ``max_tokens`` tokens (``finish_reason`` is
``"length"``), which keeps tests that read them simple and gives benchmarks
streams of a known length whose cost is nearly all HTTP.
"""

from __future__ import annotations

import os

import gguf
import numpy as np

EMBED = 64
HEADS = 4
LAYERS = 2
FFN = 128
CONTEXT = 4096

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
_TEXT = """
    the of and to in is it you that he was for on are with as I his they be at one have this
    from or had by hot word but what some we can out other were all there when up use your how
    said an each she which do their time if will way about many then them write would like so
    these her long make thing see him two has look more day could go come did number sound no
    most people my over know water than call first who may down side been now find hello model
    runner twisted llama token test reply
"""
_WORDS = _TEXT.split()


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = list(_CONTROL)
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (len(_CONTROL) - 1)
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-"]
    pieces += [f"▁{word}" for word in _WORDS]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SentencePiece merges the highest-scoring pieces first: longer words win.
    scores = [0.0] * (len(_CONTROL) + 256) + [float(len(piece)) for piece in pieces]
    return tokens, scores, [int(t) for t in types]


def _write_metadata(
    writer: gguf.GGUFWriter,
    arch: str,
    pooling: gguf.PoolingType,
    context: int,
    vocabulary: tuple[list[str], list[float], list[int]],
) -> None:
    """The model's shape, its tokenizer and its chat template: what llama-server reads before the tensors."""
    tokens, scores, types = vocabulary
    writer.add_name(f"tiny-{arch}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(context)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_pooling_type(pooling)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(pooling == gguf.PoolingType.RANK)
    writer.add_chat_template(CHATML)


def _write(
    path: str | os.PathLike[str],
    arch: str,
    pooling: gguf.PoolingType,
    seed: int,
    shard_tensors: int = 0,
    context: int = CONTEXT,
) -> None:
    tokens, scores, types = _vocabulary()
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(os.fspath(path), arch, split_max_tensors=shard_tensors)
    _write_metadata(writer, arch, pooling, context, (tokens, scores, types))

    embedding = weights(len(tokens), EMBED)
    embedding[:, 0] = 1.0
    output = weights(len(tokens), EMBED)
    output[: len(_CONTROL) + 256, 0] = -10.0
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", ones(EMBED))
    writer.add_tensor("output.weight", output)
    for layer in range(LAYERS):
        blk = f"blk.{layer}"
        for name, tensor in (
            ("attn_norm", ones(EMBED)),
            ("attn_q", weights(EMBED, EMBED)),
            ("attn_k", weights(EMBED, EMBED)),
            ("attn_v", weights(EMBED, EMBED)),
            ("attn_output", weights(EMBED, EMBED)),
            ("ffn_norm", ones(EMBED)),
            ("ffn_gate", weights(FFN, EMBED)),
            ("ffn_up", weights(FFN, EMBED)),
            ("ffn_down", weights(EMBED, FFN)),
        ):
            if name in ("attn_output", "ffn_down"):
                tensor[0, :] = 0.0  # keep dimension 0 of the residual stream constant
            writer.add_tensor(f"{blk}.{name}.weight", tensor)
        if arch == "qwen3":
            writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(EMBED // HEADS))
            writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(EMBED // HEADS))
    if pooling == gguf.PoolingType.RANK:
        # Qwen3 rerankers end in a softmax over ("yes", "no"); the score is P(yes).
        writer.add_classifier_output_labels(["yes", "no"])
        writer.add_tensor("cls.output.weight", weights(2, EMBED) * 50)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_llama(
    path: str | os.PathLike[str], seed: int = 0, shard_tensors: int = 0, context: int = CONTEXT
) -> None:
    """A chat, completion and embedding model (llama architecture, mean pooling), ~0.5 MB.

    With C{shard_tensors}, a split model of that many tensors a file, named as
    llama.cpp's ``gguf-split`` names shards (``tiny.gguf`` → ``tiny-00001-of-00010.gguf``, ...).
    C{context} is the context it says it was trained for, all llama-server gives a request.
    """
    _write(path, "llama", gguf.PoolingType.MEAN, seed, shard_tensors, context)


#: The tiny projector's images: 32 x 32 pixels in 8 x 8 patches, 16 image tokens.
IMAGE_SIZE = 32
PATCH = 8
VISION_EMBED = 32


def write_tiny_mmproj(path: str | os.PathLike[str], seed: int = 0) -> None:
    """A vision projector for L{write_tiny_llama}'s model: llama.cpp's ``clip`` with a LLaVA MLP.

    A two-block vision transformer over 8 x 8 patches of a 32 x 32 image, then
    a two-layer MLP into the language model's 64-dimensional embeddings; random
    weights, so it "sees" nothing, but llama-server loads it with ``--mmproj``
    and runs every image through it.
    """
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    patches = (IMAGE_SIZE // PATCH) ** 2
    writer = gguf.GGUFWriter(os.fspath(path), "clip")
    writer.add_name("tiny-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    for key, value in (
        ("image_size", IMAGE_SIZE),
        ("patch_size", PATCH),
        ("embedding_length", VISION_EMBED),
        ("feed_forward_length", 2 * VISION_EMBED),
        ("block_count", 2),
        ("projection_dim", EMBED),
        ("attention.head_count", 2),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_tensor("v.patch_embd.weight", weights(VISION_EMBED, 3, PATCH, PATCH))
    writer.add_tensor("v.position_embd.weight", weights(patches, VISION_EMBED))
    for block in range(2):
        blk = f"v.blk.{block}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{blk}.{name}.weight", weights(VISION_EMBED, VISION_EMBED))
            writer.add_tensor(f"{blk}.{name}.bias", np.zeros(VISION_EMBED, dtype=np.float32))
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"{blk}.{norm}.weight", np.ones(VISION_EMBED, dtype=np.float32))
            writer.add_tensor(f"{blk}.{norm}.bias", np.zeros(VISION_EMBED, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_up.weight", weights(2 * VISION_EMBED, VISION_EMBED))
        writer.add_tensor(f"{blk}.ffn_down.weight", weights(VISION_EMBED, 2 * VISION_EMBED))
    writer.add_tensor("mm.0.weight", weights(EMBED, VISION_EMBED))
    writer.add_tensor("mm.0.bias", np.zeros(EMBED, dtype=np.float32))
    writer.add_tensor("mm.2.weight", weights(EMBED, EMBED))
    writer.add_tensor("mm.2.bias", np.zeros(EMBED, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_reranker(path: str | os.PathLike[str], seed: int = 0) -> None:
    """A reranker: qwen3 architecture, rank pooling, a two-label ``cls.output`` head.

    Scores are in (0, 1). llama-server also "reranks" with a model that has no
    such head when started with ``--reranking``, but its scores are meaningless.
    """
    _write(path, "qwen3", gguf.PoolingType.RANK, seed)
