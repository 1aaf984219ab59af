"""The two relays ([http] relay): C{MRUNNER_TEST_RELAY} runs every daemon the tests start on one.

C{MRUNNER_TEST_RELAY=twisted trial tests.real...} serves each stream of those tests with the Twisted
relay (L{mrunner.proxy.relay}) instead of the default fast one, so one suite checks both paths
(``make test`` runs the relay-sensitive modules so). A config that names its relay keeps it: a test
of one path says which.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from tests.support.parsers import http_setting

RELAY = os.environ.get("MRUNNER_TEST_RELAY")


def with_test_relay(config: Path) -> None:
    """Set C{[http] relay} in the daemon's C{config} to C{MRUNNER_TEST_RELAY}, when that is set.

    Not where the file names a relay already, nor where it is not TOML (a test of a broken file).
    """
    if RELAY is None or not config.is_file():
        return
    text = config.read_text()
    try:
        http = tomllib.loads(text).get("http", {})
    except tomllib.TOMLDecodeError:
        return
    if "relay" not in http:
        config.write_text(http_setting(text, "relay", RELAY))
