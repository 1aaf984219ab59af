"""Hugging Face repositories of whisper.cpp's models (``hf.co/ggerganov/whisper.cpp`` and those
shaped like it: ``ggml-<size>[-<quantisation>].bin`` files at the top): the file a tag names.

The tag is the name between ``ggml-`` and ``.bin``: ``hf.co/ggerganov/whisper.cpp:tiny.en`` is
``ggml-tiny.en.bin``, ``:large-v3-turbo-q5_0`` is ``ggml-large-v3-turbo-q5_0.bin``; no tag (or
``latest``) is ``base``, or the only model there is. whisper.cpp's test files, voice-activity
models and Core ML encoders beside them are not models to pull.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mrunner.errors import BadRequest, NotFound
from mrunner.store.huggingface import HubFile

_GGML = re.compile(r"ggml-(?P<tag>[A-Za-z0-9._-]+)\.bin", re.IGNORECASE)
_NOT_MODELS = ("for-tests", "silero", "encoder")
DEFAULT = "base"


def models(files: Iterable[HubFile]) -> dict[str, HubFile]:
    """The repository's Whisper models by tag: its top-level ``ggml-*.bin`` files, less the others."""
    found: dict[str, HubFile] = {}
    for f in files:
        match = _GGML.fullmatch(f.path)
        if match and not any(word in f.path.lower() for word in _NOT_MODELS):
            found[match["tag"]] = f
    return found


def select(repo: str, files: Iterable[HubFile], tag: str | None) -> HubFile | None:
    """The model C{tag} names; None in a repository with no Whisper model (a GGUF one, say).

    @raise BadRequest: no tag where there are several models and no C{base}.
    @raise NotFound: no model of that tag; the message lists those there are.
    """
    found = models(files)
    if not found:
        return None
    tags = sorted(found)
    if tag in (None, "latest"):
        if DEFAULT in found or len(found) == 1:
            return found.get(DEFAULT) or found[tags[0]]
        raise BadRequest(
            f"hf.co/{repo} has several Whisper models; name one as hf.co/{repo}:SIZE,"
            f" one of: {', '.join(tags)}",
            code="quant_required",
        )
    chosen = next((found[t] for t in tags if t.lower() == str(tag).lower()), None)
    if chosen is None:
        raise NotFound(
            f"hf.co/{repo} has no ggml-{tag}.bin; available: {', '.join(tags)}", code="quant_not_found"
        )
    return chosen
