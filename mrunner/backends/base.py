"""Values that pass between the scheduler and a backend."""

from __future__ import annotations

import attrs

from mrunner.store.model import Model

COMPLETION = "completion"
EMBEDDING = "embedding"
RERANKING = "reranking"
MODES = (COMPLETION, EMBEDDING, RERANKING)


@attrs.frozen
class RunnerSettings:
    """How one runner is started: defaults from the config, changed by ``_configure``."""

    context_size: int | None = None
    parallel: int = 1
    threads: int = 0
    flags: tuple[str, ...] = ()
    #: A smaller model of the same vocabulary that drafts tokens for speculative decoding.
    draft: Model | None = None


@attrs.frozen
class Command:
    """A runner's command line; ``env`` ``None`` inherits the daemon's environment."""

    executable: str
    args: tuple[str, ...]
    env: dict[str, str] | None = None


@attrs.frozen
class ContextSize:
    """A runner's context: what its settings ask for, and what each request really gets.

    llama-server gives a request at most the model's trained context
    (C{<arch>.context_length}), whatever C{--ctx-size} says, and says so only
    in its own log: C{in_force} is that smaller number, which a person must see.
    """

    asked: int | None = None
    in_force: int | None = None

    @property
    def capped(self) -> bool:
        return self.asked is not None and self.in_force is not None and self.in_force < self.asked

    def note(self, model: str) -> str | None:
        """What a person is told when the context in force is smaller than the one asked for."""
        if not self.capped:
            return None
        return (
            f"context_size {self.asked} for {model} is more than the model will give: each request"
            f" gets at most {self.in_force} tokens (the context it was trained for)"
        )
