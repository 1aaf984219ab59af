"""The whisper.cpp backend: find or build ``whisper-server`` and start it for one Whisper model.

``source`` pins the build (whisper.cpp vendored in pywhispercpp's sdist, with mrunner's UNIX socket
patch) and where it is kept, ``backend`` is the L{IBackend} that installs it and writes a runner's
command line; ``python -m mrunner.backends.whispercpp`` (L{__main__}) installs it ahead of time.
"""

from mrunner.backends.whispercpp.backend import WhisperCppBackend

__all__ = ["WhisperCppBackend"]
