"""Which stored models a named key may use and see, decided on the model a name resolves to.

A key's C{models} (names or glob patterns) are matched against the names the
stored model has (its tags) and its digest, never against the string a client
sent: a C{name@digest}, a short id or a digest may name a model by anything
but its names (issue 35, A1). Every view of models and runners asks L{may_use}
too, so a key sees only the models it may use (A17).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from mrunner.errors import NotFound
from mrunner.interfaces import IModelStore
from mrunner.names import normal_name
from mrunner.teams.members import Member
from mrunner.values import RunnerSnapshot
from mrunner.values.model import Model


def may_use(member: Member | None, model: Model) -> bool:
    """Whether C{member} (None: a key without a name, or none) may use C{model}, by any of its names."""
    if member is None or not member.models:
        return True
    return any(member.may_use(name) for name in (*model.tags, model.id))


def check_usable(member: Member | None, store: IModelStore, name: str) -> None:
    """Raise unless C{member} may use the stored model C{name} resolves to; nothing is looked up for a
    key without a model list (the scheduler finds the model, or says it is missing).

    A limited key learns nothing of models it may not use: one that exists and one
    that does not are the same 403 when the name is not in its list, and a 404 says
    nothing of the store's other names (its "did you mean").

    @raise Forbidden: the key may not use that model (or that name).
    @raise NotFound: no stored model has the name.
    """
    if member is None or not member.models:
        return
    try:
        model = store.resolve(name)
    except NotFound:
        if not member.may_use(normal_name(name)):
            raise member.refusal(normal_name(name)) from None
        raise NotFound(f"model {normal_name(name)} not found locally", code="model_not_found") from None
    if not may_use(member, model):
        raise member.refusal(normal_name(name))


def visible(member: Member | None, models: Iterable[Model]) -> list[Model]:
    """The models of C{models} that C{member} may use, in their order."""
    return [model for model in models if may_use(member, model)]


def visible_runners(
    member: Member | None, store: IModelStore, runners: Iterable[RunnerSnapshot]
) -> list[RunnerSnapshot]:
    """The runners of the models C{member} may use; a runner of a model deleted meanwhile is an admin's."""
    runners = list(runners)
    if member is None or not member.models:
        return runners
    allowed = {model.id for model in visible(member, store.list())}
    return [runner for runner in runners if runner.model_id in allowed]


def visible_name(member: Member | None, name: str) -> bool:
    """Whether C{member} may see a model known only by C{name} (a preload that failed)."""
    return member is None or member.may_use(normal_name(name))


def visible_disk_usage(member: Member | None, store: IModelStore) -> int:
    """The store's bytes as C{member} may see them: all of it, or for a key with a model list the files
    of the models it may use, each file once, so C{df} tells nothing of the others (issue 53, N13)."""
    if member is None or not member.models:
        return store.disk_usage()
    files = {
        os.path.realpath(path)
        for model in visible(member, store.list())
        for path in (*model.weights, *model.files.values())
    }
    return sum(_size(path) for path in files)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # removed meanwhile
        return 0
