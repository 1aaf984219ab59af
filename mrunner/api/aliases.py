"""Model aliases (C{[aliases]} in tap.conf): a name a client hard-codes, served by a stored model.

A request's model name becomes a stored model's name in one place,
L{stored_name}, called by C{Gateway.begin} for every API's inference routes:
a pure function of (name, aliases, store), so a caller may keep its answer for
as long as the store and the aliases are unchanged. A stored model always wins
over an alias of the same name (a pulled model is never hidden by a line in a
file); such an alias is named in the log at start and at each reload, as is one
whose target is not stored (its requests get a 404 that names the alias and the target).
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.logger import Logger

from mrunner.config import Config
from mrunner.errors import BadRequest, NotFound
from mrunner.interfaces import IModelStore
from mrunner.names import normal_name
from mrunner.values.model import Model


def stored_name(name: str, aliases: Mapping[str, str], store: IModelStore) -> str:
    """The name C{name} is looked up by in C{store}: an alias's target, unless a stored model holds C{name}.

    C{aliases} maps L{normal_name}s to the stored names they stand for.

    @raise NotFound: C{name} is an alias whose target is not in the store; the message names both,
        since the client never wrote the target.
    """
    target = aliases.get(normal_name(name)) if aliases else None
    if target is None or _stored(store, name):
        return name
    try:
        store.resolve(target)
    except NotFound:
        why = f"{_missing(name, target)}; pull it (POST /models/create) or change [aliases]"
        raise NotFound(why, code="model_not_found") from None
    except BadRequest as e:  # an id that more than one model's digest begins with
        raise NotFound(f"alias {name} points to {target}: {e.message}", code="model_not_found") from None
    return target


def _missing(alias: str, target: str) -> str:
    return f"alias {alias} points to {target}, which is not in the store"


def _stored(store: IModelStore, name: str) -> Model | None:
    try:
        return store.resolve(name)
    except (NotFound, BadRequest):
        return None


class Aliases:
    """The aliases in force: replaced whole by a reload (L{configure})."""

    log = Logger()

    def __init__(self, written: Mapping[str, str], store: IModelStore) -> None:
        self._store = store
        self.configure_table(written)

    def configure(self, config: Config) -> None:
        self.configure_table(config.aliases)

    def configure_table(self, written: Mapping[str, str]) -> None:
        #: As written in tap.conf: the names the model lists show.
        self.written = dict(written)
        #: By L{normal_name}: what L{stored_name} looks names up in.
        self.table = {normal_name(alias): target for alias, target in written.items()}
        for alias, target in self.written.items():
            if _stored(self._store, alias) is not None:
                self.log.warn(
                    "alias {alias} is not used: a stored model has that name, and a stored model wins;"
                    " rename the alias in [aliases] or remove the model",
                    alias=alias,
                )
            elif _stored(self._store, target) is None:
                self.log.warn(
                    "{missing}: requests for it get 404 until it is pulled; pull it or change [aliases]",
                    missing=_missing(alias, target),
                    alias=alias,
                )

    def listed(self) -> list[tuple[str, Model]]:
        """(alias, the model it stands for) for each alias that works now: its target stored, its name not."""
        found = [(alias, _stored(self._store, target)) for alias, target in self.written.items()]
        return [
            (alias, model)
            for alias, model in found
            if model is not None and _stored(self._store, alias) is None
        ]
