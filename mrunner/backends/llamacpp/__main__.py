"""``python -m mrunner.backends.llamacpp [CONFIG] [--variant=VARIANT]``: install llama-server ahead of
time (L{mrunner.backends.ahead})."""

from __future__ import annotations

import sys
from functools import partial

from mrunner.backends import ahead
from mrunner.backends.llamacpp.backend import LlamaCppBackend

main = partial(ahead.main, LlamaCppBackend)

if __name__ == "__main__":
    from twisted.internet.task import react

    react(main, sys.argv[1:])
