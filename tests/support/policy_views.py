"""A runner as the policy sees it, for the tests of the plan and of fitting."""

from __future__ import annotations

import attrs

from mrunner.scheduling.policy import State


@attrs.frozen
class Runner:
    state: State = State.READY
    in_use: int = 0
    parallel: int = 1
    finished_at: float = 0.0
    memory: int = 0
    pinned: bool = False
    loaded_at: float = 0.0
    load_seconds: float = 0.0
    served: int = 0
