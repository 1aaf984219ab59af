"""What each model's runner starts with: C{tap.conf}'s C{[models."NAME"]}, changed by C{_configure}."""

from __future__ import annotations

from typing import Any

from mrunner.config import Config
from mrunner.errors import NotFound
from mrunner.interfaces import IModelStore
from mrunner.values import ModelSettings
from mrunner.values.backend import RunnerSettings
from mrunner.values.model import Model


class Configured:
    """The settings in force for each (backend, model): the file's, with C{_configure}'s over them.

    C{config} is replaced whole by a reload; what C{_configure} set stays.
    """

    def __init__(self, config: Config, store: IModelStore) -> None:
        self.config = config
        self._store = store
        self._set: dict[tuple[str, str], ModelSettings] = {}

    def model(self, backend: str, model: Model) -> ModelSettings:
        """C{[models."NAME"]} from C{tap.conf}, overridden by what C{_configure} set."""
        configured = self._set.get((backend, model.id), ModelSettings())
        files = self.config.models.settings
        entry = next((files[tag] for tag in model.tags if tag in files), None)
        if entry is None:
            return configured
        base = ModelSettings(
            context_size=entry.context_size, keep_alive=entry.keep_alive, pinned=entry.pinned
        )
        return configured.over(base)

    def set(self, backend: str, model: Model, settings: ModelSettings) -> None:
        """Keep C{settings} (what C{_configure} was given) over what was set for C{model} before."""
        key = (backend, model.id)
        self._set[key] = settings.over(self._set.get(key, ModelSettings()))

    def runner(self, configured: ModelSettings) -> RunnerSettings:
        """How a runner with C{configured} starts: those settings, the config's defaults for the rest."""
        return RunnerSettings(
            context_size=self.context_size(configured),
            parallel=self.config.scheduler.parallel,
            threads=self.config.runner.threads,
            flags=configured.flags or (),
            draft=self._draft(configured.draft_model),
        )

    def context_size(self, configured: ModelSettings) -> int | None:
        return configured.context_size or self.config.runner.context_size

    def _draft(self, name: str | None) -> Model | None:
        """The draft model named in the settings, if any (it must still be in the store)."""
        if not name:
            return None
        try:
            return self._store.resolve(name)
        except NotFound:
            raise NotFound(
                f"draft model {name} is not in the store; pull it, or configure the model without it",
                code="draft_model_not_found",
            ) from None

    def keep_alive(self, configured: ModelSettings) -> float:
        default = self.config.scheduler.keep_alive
        return default if configured.keep_alive is None else configured.keep_alive

    def instances(self, model: Model) -> int:
        """C{[models."NAME"] instances}: how many runners of C{model} may serve at once."""
        files = self.config.models.settings
        return next((files[tag].instances for tag in model.tags if tag in files), 1)

    def shown(self, configured: ModelSettings) -> dict[str, Any]:
        """The parts of C{configured} that C{GET /engines/_configure} shows as they are in force."""
        return {
            "runtime_flags": list(configured.flags or ()),
            "keep_alive": self.keep_alive(configured),
            "pinned": bool(configured.pinned),
            "speculative": {"draft_model": configured.draft_model or None},
        }
