"""``python -m mrunner.backends.<backend> [CONFIG] [--variant=VARIANT]``: install a built backend ahead
of time, printing progress, so the first request does not wait for a build (``make backend``,
``make cuda-build``)."""

from __future__ import annotations

import sys
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mrunner.backends import build
from mrunner.backends.built import BuiltBackend


def main(kind: type[BuiltBackend], reactor: Any, *argv: str) -> Deferred[None]:
    """Install the backend C{kind} as the daemon would, printing each progress report.

    ``[CONFIG] [--variant=VARIANT]``: with a variant, that build only (``make cuda-build``):
    falling back to another is a failure here.
    """
    from mrunner import config

    variant = next((arg.partition("=")[2] for arg in argv if arg.startswith("--variant=")), None)
    config_path = next((arg for arg in argv if not arg.startswith("--")), None)
    settings = config.load(config_path)
    if variant is not None:
        table = {**settings.backend(kind.name), "variant": variant}
        settings = attrs.evolve(settings, backends={**settings.backends, kind.name: table})
    backend = kind(settings, reactor, fallback=variant is None)

    def done(version: str) -> None:
        print(f"{version} ready: {backend.executable}", flush=True)

    def failed(failure: Failure) -> None:
        failure.trap(build.InstallFailed)
        print(f"Error: {failure.value}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    installing = backend.install(lambda message: print(f"Installing: {message}", flush=True))
    return installing.addCallbacks(done, failed)
