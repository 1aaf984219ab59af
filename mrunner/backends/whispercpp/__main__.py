"""``python -m mrunner.backends.whispercpp [CONFIG] [--variant=VARIANT]``: install whisper-server ahead of
time (L{mrunner.backends.ahead})."""

from __future__ import annotations

import sys
from functools import partial

from mrunner.backends import ahead
from mrunner.backends.whispercpp.backend import WhisperCppBackend

main = partial(ahead.main, WhisperCppBackend)

if __name__ == "__main__":
    from twisted.internet.task import react

    react(main, sys.argv[1:])
