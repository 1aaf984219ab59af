"""From a resolved request to what the loader needs: the model's files checked, the install waited
for, the runner's settings and memory estimate, and the fit checked when a load is needed."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mrunner.errors import ContextExceeded
from mrunner.interfaces import IBackend, IModelStore
from mrunner.runners.request import LoadRequest
from mrunner.scheduling.configured import Configured
from mrunner.scheduling.fitting import check_fits, fits
from mrunner.scheduling.installer import Installer
from mrunner.scheduling.loader import Loader
from mrunner.scheduling.slots import SlotNotes, fitted_slots
from mrunner.values import ContextSize, RunnerKey
from mrunner.values.backend import COMPLETION, RunnerSettings
from mrunner.values.model import Model
from mrunner.values.request import Resolved

#: llama-server's flags that set the context size: a model given one in its flags has it fixed.
CONTEXT_FLAGS = {"-c", "--ctx-size"}


@attrs.define
class Requests:
    """Builds the loader's L{LoadRequest}s, taking the resolved request as it is."""

    _backends: Mapping[str, IBackend]
    _store: IModelStore
    _installer: Installer
    _loader: Loader
    _configured: Configured
    _slot_notes: SlotNotes = attrs.field(factory=SlotNotes)

    async def build(self, asked: Resolved, install_wait: float | None) -> LoadRequest:
        """What the loader needs for C{asked}: the backend installed, the model's files checked
        before a load, the settings and estimate, and (for a load) whether it fits at all."""
        backend, model = asked.backend, asked.model
        # The store checks a model's files (sizes; digests once since start) before a load,
        # not on every request a runner already holding the model serves.
        runner = self._loader.runners.get(RunnerKey(backend, model.id, asked.mode))
        if model.problem is not None or runner is None:
            runner = None
            model = await self._store.ready(model)
        await self._installer.wait(backend, install_wait)
        configured = self._configured.model(backend, model)
        settings = self._configured.runner(configured)
        if settings.draft is not None and runner is None:
            await self._store.ready(settings.draft)
        if runner is None:
            await self._check_length(asked, model, settings)
        request = LoadRequest(
            RunnerKey(backend, model.id, asked.mode),
            model,
            settings,
            self._configured.keep_alive(configured) if asked.keep_alive is None else asked.keep_alive,
            sets_keep_alive=asked.keep_alive is not None,
            pinned=bool(configured.pinned),
            instances=self._configured.instances(model),
            conversation=asked.conversation,
        )
        if runner is not None and runner.request.asked == settings:  # the same estimate, already made
            old = runner.request
            return attrs.evolve(
                request,
                settings=old.settings,
                memory=old.memory,
                footprint=old.footprint,
                context=old.context,
            )
        request = self.estimated(attrs.evolve(request, context=self._context_left(backend, model, settings)))
        gpus, budget = self._loader.gpus, self._configured.config.scheduler.memory_budget
        request = fitted_slots(request, self.estimated, lambda r: fits(r, gpus, budget))
        if runner is None:  # a load: whether it could fit at all, before it queues for one
            check_fits(request, gpus, budget)
            self._slot_notes(request, self._backends[backend].context(model, request.settings).in_force)
        return request

    def estimated(self, request: LoadRequest) -> LoadRequest:
        """C{request} with the memory and footprint its backend estimates for its settings."""
        backend, mode = self._backends[request.key.backend], request.key.mode
        return attrs.evolve(
            request,
            memory=backend.memory(request.model, mode, request.settings),
            footprint=backend.footprint(request.model, mode, request.settings),
        )

    async def _check_length(self, asked: Resolved, model: Model, settings: RunnerSettings) -> None:
        """Refuse, before a runner starts for it, a completion at least as long as its context, which
        that runner would refuse once loaded; the count is a floor (L{IModelStore.fewest_tokens}), taken
        only for texts of as many bytes, and a model whose flags set the context is left to its runner.

        @raise ContextExceeded: the request could never fit one whole context.
        """
        if asked.mode != COMPLETION or _sets_context(settings):
            return
        context = self._backends[asked.backend].context(model, settings).in_force
        texts = asked.texts()
        if not context or sum(len(text.encode("utf-8")) for text in texts) < context:
            return
        # Counted past the context, so the refusal says how far (the walk stops at four contexts).
        tokens = await self._store.fewest_tokens(model, texts, 4 * context)
        if tokens is not None and tokens >= context:
            raise ContextExceeded(tokens, context, at_least=True)

    def _context_left(self, backend: str, model: Model, settings: RunnerSettings) -> ContextSize | None:
        """The context a runner of C{model} gets when no one fixed its size (not its settings, its
        flags nor a choice in its config), which a load out of device memory may halve; else None."""
        if settings.context_size or model.chosen_context or _sets_context(settings):
            return None
        return self._backends[backend].context(model, settings)


def _sets_context(settings: RunnerSettings) -> bool:
    """Whether the settings' llama-server flags fix the context size themselves."""
    return any(flag.partition("=")[0] in CONTEXT_FLAGS for flag in settings.flags)
