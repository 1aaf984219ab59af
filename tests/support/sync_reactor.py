"""A Clock whose thread pool runs work at once, so store code using threads stays synchronous."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorFromThreads, IReactorThreads
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from zope.interface import implementer


class InlinePool:
    """Runs work at once; C{working} is true meanwhile, so a test can tell where code ran."""

    working = False

    def callInThreadWithCallback(
        self, onResult: Callable[[bool, Any], None], f: Callable[..., Any], *a: Any, **kw: Any
    ) -> None:
        InlinePool.working = True
        try:
            result = f(*a, **kw)
        except BaseException:
            onResult(False, Failure())
        else:
            onResult(True, result)
        finally:
            InlinePool.working = False


@implementer(IReactorThreads, IReactorFromThreads)
class SyncThreadsClock(Clock):
    """Time under the test's control; "threads" run inline."""

    def getThreadPool(self) -> InlinePool:
        return InlinePool()

    def callFromThread(self, f: Callable[..., Any], *a: Any, **kw: Any) -> None:
        f(*a, **kw)

    def callInThread(self, f: Callable[..., Any], *a: Any, **kw: Any) -> None:
        f(*a, **kw)

    def suggestThreadPoolSize(self, size: int) -> None:
        pass
