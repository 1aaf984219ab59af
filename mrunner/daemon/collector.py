"""The cyclic garbage collector's settings for the daemon: what it built at start frozen, young ones rarer.

Everything imported and built before the reactor runs lives as long as the
daemon: frozen, it stays out of every collection, which would otherwise
traverse it again and again. Then the youngest generation is collected every
L{YOUNG} allocations rather than Python's 700. A thousand streams open at once
hold some 70,000 objects that live as long as their answers (ten seconds in
the bench's scenario 5), so nearly all a collection traverses is alive: at
700, young collections came every few requests, promoted what they found,
and the older generations traversed it all again, for about one piece of
cyclic garbage a stream; 7% of the daemon's CPU there (0.62 s of GC for 5,000
streams, 0.19 s at L{YOUNG}), the peak RSS the same. Cyclic garbage still
goes within L{YOUNG} allocations: a few MB at most.
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
