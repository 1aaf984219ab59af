"""``python -m mrunner.backends.llamacpp [CONFIG] [--variant=VARIANT]``: install llama-server ahead of
time, printing progress, so the first request does not wait for a build (``make backend``,
``make cuda-build``)."""

from __future__ import annotations

import sys
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mrunner.backends import build
from mrunner.backends.llamacpp.backend import LlamaCppBackend


def main(reactor: Any, *argv: str) -> Deferred[None]:
    """Install the backend as the daemon would, printing each progress report.

    ``[CONFIG] [--variant=VARIANT]``: with a variant, that build only (``make cuda-build``):
    falling back to another is a failure here.
    """
    from mrunner import config

    variant = next((arg.partition("=")[2] for arg in argv if arg.startswith("--variant=")), None)
    config_path = next((arg for arg in argv if not arg.startswith("--")), None)
    settings = config.load(config_path)
    if variant is not None:
        table = {**settings.backend("llama.cpp"), "variant": variant}
        settings = attrs.evolve(settings, backends={**settings.backends, "llama.cpp": table})
    backend = LlamaCppBackend(settings, reactor, fallback=variant is None)

    def done(version: str) -> None:
        print(f"{version} ready: {backend.executable}", flush=True)

    def failed(failure: Failure) -> None:
        failure.trap(build.InstallFailed)
        print(f"Error: {failure.value}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    installing = backend.install(lambda message: print(f"Installing: {message}", flush=True))
    return installing.addCallbacks(done, failed)


if __name__ == "__main__":
    from twisted.internet.task import react

    react(main, sys.argv[1:])
