"""The prompt cache as C{[cache]} says, its folder opened: what the daemon's wiring builds."""

from __future__ import annotations

from typing import Any

from mrunner.cache.calls import RunnerCalls
from mrunner.cache.store import CacheStore
from mrunner.cache.turns import OwnerOf, PromptCache, Told, untold
from mrunner.config import Config
from mrunner.daemon.startup import StartupError
from mrunner.proxy.pool import RunnerPool

#: Seconds the prompt cache waits for a runner's answer to a slot or template call.
CALL_TIMEOUT = 10.0


def prompt_cache(
    config: Config, reactor: Any, pool: RunnerPool, owner_of: OwnerOf, told: Told = untold
) -> PromptCache | None:
    """The prompt cache, None when it is off; a folder it cannot make ends the start with one line.

    C{told}: who keeps where each turn's cached prompt came from (the requests' records).

    Its saves fit in half the stop's grace, so a runner they delay is still stopped, not killed.
    """
    settings = config.cache
    if not settings.enabled:
        return None
    folder = settings.path(config.home)
    store = CacheStore(folder, settings.max_bytes, settings.max_age, reactor.seconds, settings.min_tokens)
    try:
        store.open()
    except OSError as e:
        raise StartupError(f"[cache] folder {folder}: {e.strerror}") from None
    save_timeout = min(settings.save_timeout, config.scheduler.stop_grace / 2)
    calls = RunnerCalls(pool, reactor, max(save_timeout, CALL_TIMEOUT))
    cache = PromptCache(store, calls, reactor, save_timeout, owner_of, told)
    cache.configure(config)
    return cache
