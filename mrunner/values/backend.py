"""Values that pass between the scheduler and a backend: the modes a runner serves, how it starts."""

from __future__ import annotations

import attrs

from mrunner.values import Placement
from mrunner.values.model import Model

COMPLETION = "completion"
EMBEDDING = "embedding"
RERANKING = "reranking"
#: Speech to text (and translation to English) by a Whisper model's runner.
TRANSCRIPTION = "transcription"
MODES = (COMPLETION, EMBEDDING, RERANKING, TRANSCRIPTION)
#: The backend that serves Whisper models (their weights' media type is C{store.artifact.WHISPER}).
WHISPER_CPP = "whisper.cpp"


def default_use(model: Model, backend: str) -> tuple[str, str]:
    """The backend and mode that serve C{model} where nothing names them (a preload): a Whisper
    model's are whisper.cpp's transcription, any other's C{backend}'s completion."""
    return (WHISPER_CPP, TRANSCRIPTION) if model.config.get("format") == "whisper" else (backend, COMPLETION)


@attrs.frozen
class RunnerSettings:
    """How one runner is started: defaults from the config, changed by ``_configure``."""

    context_size: int | None = None
    parallel: int = 1
    threads: int = 0
    flags: tuple[str, ...] = ()
    #: A smaller model of the same vocabulary that drafts tokens for speculative decoding.
    draft: Model | None = None
    #: Where its layers go (the policy's plan); None on a machine without GPUs, as before them.
    placement: Placement | None = None


@attrs.frozen
class Command:
    """A runner's command line; ``env`` ``None`` inherits the daemon's environment."""

    executable: str
    args: tuple[str, ...]
    env: dict[str, str] | None = None
