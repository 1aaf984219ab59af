"""The llama.cpp backend: find or build ``llama-server`` and start it for one model.

``source`` pins the build and where it is kept, ``backend`` is the L{IBackend} that
installs it, ``probes`` asks an executable what it is, ``arguments`` writes a runner's
command line, ``sizing`` estimates its memory; ``python -m mrunner.backends.llamacpp``
(L{__main__}) installs it ahead of time.
"""

from mrunner.backends.llamacpp.backend import LlamaCppBackend

__all__ = ["LlamaCppBackend"]
