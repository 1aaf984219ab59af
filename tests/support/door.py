"""The daemon's front-door table (L{Door}), as its route groups declare it, for tests of the door alone."""

from __future__ import annotations

import shutil
import tempfile
from functools import cache

from twisted.internet.testing import MemoryReactorClock

from mrunner import config as configuration
from mrunner.api.door.declared import Door
from mrunner.api.door.routing import Routes
from mrunner.tap import make_parts


@cache
def daemon_door() -> Door:
    """The door of the routes C{tap.py} serves with the default configuration."""
    home = tempfile.mkdtemp()
    try:
        config = configuration.load(None, overrides={"home": home}, environ={})
        root = make_parts(config, MemoryReactorClock()).site.resource
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert isinstance(root, Routes)
    return root.door
