"""A route cancelled by its client's hang-up lets go of what it read at once, not at the next full
garbage collection.

When a client hangs up, Klein (and L{mrunner.api.door.direct}) cancel the route's Deferred, and the
cancellation is thrown into the route's coroutine. Twisted's coroutine machinery leaves that failure
in a reference cycle with the frames it went through (C{Failure.throwExceptionIntoGenerator}'s frame
holds the failure whose traceback holds that frame), and the frames hold the route's locals: the
request's body, its parsed payload, its prompt. Measured (issue 53 M1): each queued request's 3 to 5
copies of its body stayed after the hang-up until a full collection (1 GB after ten 25 MiB uploads).
Clearing the finished frames' locals once the cancellation leaves the route breaks the cycle.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from inspect import iscoroutine
from typing import Any, TypeVar

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.python.failure import Failure

F = TypeVar("F", bound=Callable[..., Any])


def released(handler: F) -> F:
    """C{handler}, whose coroutine or Deferred, once cancelled, keeps nothing of the frames it ran in."""

    @functools.wraps(handler)
    def route(*args: Any, **kwargs: Any) -> Any:
        result = handler(*args, **kwargs)
        if iscoroutine(result):
            result = ensureDeferred(result)
        if isinstance(result, Deferred):
            result.addErrback(let_go)
        return result

    return route  # type: ignore[return-value]


def let_go(failure: Failure) -> Failure:
    """C{failure}, a cancellation's, with the locals of the frames it went through cleared, and those
    of the frames the failures in them went through (each level of coroutines wraps the cancellation
    in a failure of its own); frames still running are left as they are."""
    if not failure.check(CancelledError):
        return failure
    found, seen = [failure], set()
    while found:
        each = found.pop()
        seen.add(id(each))
        first = tb = getattr(each.value, "__traceback__", None) or each.tb
        while tb is not None:
            held = tb.tb_frame.f_locals.values()
            found += [v for v in held if isinstance(v, Failure) and id(v) not in seen]
            tb = tb.tb_next
        traceback.clear_frames(first)
        each.cleanFailure()
    return failure
