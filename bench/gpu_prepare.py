"""``python -m bench.gpu_prepare WORK``: mrunner's build of llama-server up to compiling, for the CPU, in
seconds and with no GPU: bench/gpu_device.sh's ``prepare`` step.

The first lent GPU machine's build failed before compiling anything: pip's metadata step
asked for a cmake wheel the bundle lacked, CMake being only in that machine's Python's
``bin`` (issue 50). This runs the build's own parts that could fail so (L{Build.tools},
L{Build.prepare}: where each program is found, the sdist from the bundle with pip seeing
no index, CMake's configure), so a machine, this one in ``make test`` with CMake hidden
from PATH, shows that early, in the step's log.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.python.failure import Failure

from mrunner.backends.build import Build, InstallFailed
from mrunner.backends.llamacpp.source import SOURCE


async def prepare(reactor: Any, work: Path) -> None:
    """The tools the build takes, printed, then the source fetched and configured under C{work}."""
    build = Build(reactor, SOURCE, work / "dest", lambda message: print(message, flush=True))
    tools = build.tools()
    for name, path in tools.items():
        print(f"{name}: {path}", flush=True)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        await build.prepare(Path(scratch), tools)
    print("the source fetched and configured: the build has all it needs but a compiler's time")


def main(reactor: Any, work: str) -> Deferred[None]:
    Path(work).mkdir(parents=True, exist_ok=True)

    def failed(failure: Failure) -> None:
        failure.trap(InstallFailed)
        print(f"Error: {failure.value}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    return ensureDeferred(prepare(reactor, Path(work))).addErrback(failed)


if __name__ == "__main__":
    from twisted.internet.task import react

    react(main, sys.argv[1:])
