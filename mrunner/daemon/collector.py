"""The cyclic garbage collector's settings for the daemon: what it built at start frozen, young ones rarer.

Everything imported and built before the reactor runs lives as long as the
daemon: frozen, it stays out of every collection, which would otherwise
traverse it again and again. Then the youngest generation is collected every
L{YOUNG} allocations rather than Python's 700. A thousand streams open at once
hold some 70,000 objects that live as long as their answers (ten seconds in
the bench's scenario 5), and leave no cyclic garbage (none past start-up's,
under C{gc.DEBUG_SAVEALL}): at 700, young collections came every few
requests, traversed live objects only, promoted them, and the older
generations traversed them all again. There: 0.62 s of collection for 5,000
streams at 700 (some 5% of the daemon's CPU), 0.16 to 0.19 s at L{YOUNG}, the
peak RSS the same. Cyclic garbage, where a request makes some (an error's
traceback), still goes within L{YOUNG} allocations: a few MB at most.
"""

from __future__ import annotations

import gc

#: Allocations (less deallocations) between collections of the youngest generation.
YOUNG = 10_000


def settle() -> None:
    """Freeze what exists now, and collect the youngest generation every L{YOUNG} allocations."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
