"""What a whisper.cpp ggml model file is: its hyperparameters, size, parameters and languages, read
from its header and tensor table (the weights are skipped, not read), or why it is not one.

The layout is whisper.cpp's own (``whisper_model_load``): the magic ``ggml`` as a little-endian
C{uint32}, eleven C{int32} hyperparameters, the mel filters, the vocabulary, then each tensor's
header and data. No other model format is read; a file that is another one is named in the refusal.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

import attrs

from mrunner.errors import BadRequest
from mrunner.store.gguf_meta import format_parameters
from mrunner.values.sizes import format_size

MAGIC = b"lmgg"  # 0x67676d6c little-endian
HPARAMS = (
    "n_vocab",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
    "n_mels",
    "ftype",
)
#: ggml's file types (C{ggml_ftype}) whisper.cpp reads, by the name a quantisation goes by.
FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1"}
#: Bytes per block and elements per block of each tensor type (C{ggml_type}) those files hold.
_TYPES = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32)}
#: Whisper's sizes by their encoder's layer count.
SIZES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}
#: English-only models have this vocabulary; multilingual ones more (51865, or 51866 for large-v3).
ENGLISH_VOCAB = 51864
_FACTOR = 1000  # GGML_QNT_VERSION_FACTOR: ftype carries the quantisation version in its thousands
_MAX_TENSORS = 4096
_OTHERS = (
    (b"GGUF", "a GGUF file (a language model: `mrunner package FILE NAME` without --whisper)"),
    (b"PK\x03\x04", "a ZIP archive (a PyTorch checkpoint? whisper.cpp's convert-pt-to-ggml.py converts it)"),
    (b"RIFF", "a RIFF file (audio? it is transcribed, not stored)"),
    (b"\x89HDF", "an HDF5 file"),
)


class NotWhisper(BadRequest):
    """A file given as a Whisper model that is not one; the message says what it is."""

    code = "invalid_whisper_model"


@attrs.frozen
class WhisperInfo:
    """A Whisper model's facts, and the config a Docker Model Runner style config blob keeps of them."""

    hparams: dict[str, int]
    parameters: int
    size: int

    @property
    def quantization(self) -> str:
        ftype = self.hparams["ftype"] % _FACTOR
        return FTYPES.get(ftype, f"ftype {ftype}")

    @property
    def languages(self) -> str:
        """C{en} for an English-only model, else C{multilingual}."""
        return "en" if self.hparams["n_vocab"] == ENGLISH_VOCAB else "multilingual"

    def config(self) -> dict[str, Any]:
        return {
            "format": "whisper",
            "architecture": "whisper",
            "quantization": self.quantization,
            "parameters": format_parameters(self.parameters),
            "size": format_size(self.size),
            "whisper": {
                **self.hparams,
                "type": SIZES.get(self.hparams["n_audio_layer"], "custom"),
                "languages": self.languages,
            },
        }


def is_whisper(head: bytes) -> bool:
    """Whether a file starting with C{head} is a whisper.cpp ggml model."""
    return head[:4] == MAGIC


def what(head: bytes) -> str:
    """What a file that starts with C{head} is, as far as its first bytes tell."""
    if not head:
        return "empty"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return "a safetensors file (whisper.cpp's models/convert-h5-to-ggml.py converts Hugging Face weights)"
    return next((name for magic, name in _OTHERS if head.startswith(magic)), "not a whisper.cpp ggml model")


def read(path: str | os.PathLike[str]) -> WhisperInfo:
    """The header and tensor table of the model at C{path} (blocking: a thread's job)."""
    with open(path, "rb") as f:
        head = f.read(4 + 4 * len(HPARAMS))
        if not is_whisper(head):
            raise NotWhisper(f"not a Whisper model: the file is {what(head)}")
        if len(head) < 4 + 4 * len(HPARAMS):
            raise NotWhisper("not a Whisper model: the file ends inside its header")
        hparams = dict(zip(HPARAMS, struct.unpack_from(f"<{len(HPARAMS)}i", head, 4), strict=True))
        if hparams["ftype"] % _FACTOR not in FTYPES or min(hparams.values()) < 0 or hparams["n_vocab"] < 1:
            raise NotWhisper(f"not a Whisper model whisper.cpp reads: its header says {hparams}")
        _skip_filters_and_vocab(f)
        parameters = _tensors(f)
        return WhisperInfo(hparams, parameters, f.seek(0, os.SEEK_END))


def _ints(f: BinaryIO, count: int, fmt: str = "i") -> tuple[int, ...]:
    data = f.read(4 * count)
    if len(data) != 4 * count:
        raise NotWhisper("not a whole Whisper model: the file is cut short")
    return struct.unpack(f"<{count}{fmt}", data)


def _skip(f: BinaryIO, count: int) -> None:
    at = f.tell()
    if f.seek(at + count) > os.fstat(f.fileno()).st_size:
        raise NotWhisper("not a whole Whisper model: the file is cut short")


def _skip_filters_and_vocab(f: BinaryIO) -> None:
    n_mel, n_fft = _ints(f, 2)
    _skip(f, 4 * n_mel * n_fft)
    (words,) = _ints(f, 1)
    for _ in range(words):
        (length,) = _ints(f, 1, "I")
        _skip(f, length)


def _tensors(f: BinaryIO) -> int:
    """The parameters of every tensor to the file's end, each one's header read and its data skipped."""
    size, parameters = os.fstat(f.fileno()).st_size, 0
    for _ in range(_MAX_TENSORS):
        if f.tell() == size:
            return parameters
        dims, name_length, kind = _ints(f, 3)
        if not 0 < dims <= 4 or kind not in _TYPES or not 0 < name_length <= 256:
            raise NotWhisper(
                f"not a Whisper model whisper.cpp reads: a tensor of {dims} dimensions, type {kind}"
            )
        elements = 1
        for n in _ints(f, dims):
            elements *= n
        block_bytes, block = _TYPES[kind]
        _skip(f, name_length + elements // block * block_bytes)
        parameters += elements
    raise NotWhisper(f"not a Whisper model: over {_MAX_TENSORS} tensors")
