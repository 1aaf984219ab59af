"""Ask a ``llama-server`` executable what it is: its version, and the devices it can use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from twisted.internet.defer import TimeoutError
from twisted.logger import Logger

from mrunner.backends import build, childprocess
from mrunner.devices import listing
from mrunner.devices.listing import Listed

# "version: 0.5.0-dev (build 1, commit 0c1e570)" now, "version: 4123 (0c1e570)" in older builds.
_VERSION = re.compile(r"version:.*\(.*?\b([0-9a-f]{7,40})\)")

log = Logger()


async def version(reactor: Any, path: Path, name: str) -> str:
    """Run C{path} ``--version``: C{name} and the commit it was built from, else L{build.InstallFailed}."""
    exit = await build.probe(reactor, "llama-server", path, "--version")
    for line in exit.tail:
        if match := _VERSION.search(line):
            return f"{name} {match[1]}"
    return f"{name} (unknown version)"


async def devices(reactor: Any, path: Path) -> list[Listed]:
    """Run C{path} ``--list-devices``: the GPUs it prints; none (and a warning) if it fails or prints
    something else."""
    found = listing.Listing()
    probe = childprocess.run(reactor, [str(path), "--list-devices"], on_line=found.feed)
    probe.addTimeout(build.PROBE_TIMEOUT, reactor)
    try:
        tail = (await probe).tail
    except (childprocess.ChildFailed, OSError, TimeoutError) as e:
        log.warn("{path} --list-devices failed, taking it as no GPUs: {error}", path=path, error=e)
        found, tail = listing.Listing(), ()
    if tail and not found.looks_like_listing():
        log.warn(
            "{path} --list-devices printed no device list, taking it as no GPUs: {output!r:.200}",
            path=path,
            output="\n".join(tail),
        )
    for reason in found.refused:
        log.warn("{path} --list-devices: {reason}", path=path, reason=reason)
    if found.over:
        log.warn(
            "{path} --list-devices listed {over} devices past the first {kept}; only those are used",
            path=path,
            over=found.over,
            kept=listing.MAX_DEVICES,
        )
    return found.devices
