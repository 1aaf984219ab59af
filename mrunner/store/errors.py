"""The store's own failures, as the rest of mrunner sees them (its values are in L{mrunner.values.model})."""

from __future__ import annotations

from mrunner.errors import Conflict, MrunnerError


class StoreCorrupt(MrunnerError):
    """A stored manifest or config (or the index) cannot be read; the message names the model."""

    code = "store_corrupt"


class ModelCorrupt(Conflict):
    """A model whose blob is missing or failed its check: it must be pulled or imported again."""

    code = "model_corrupt"
