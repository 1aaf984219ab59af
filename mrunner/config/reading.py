"""The file read: which tap.conf, merged under the command line and the MRUNNER_* variables."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mrunner.config.secrets import with_environment
from mrunner.config.sections import Config
from mrunner.config.tables import build
from mrunner.config.values import ConfigError

# Top-level keys the environment sets over the file (and under the command line).
ENVIRONMENT = {"home": "MRUNNER_HOME", "listen": "MRUNNER_LISTEN"}


def load(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read the config file (``path``, else ./tap.conf, else the home's tap.conf) and apply overrides.

    C{overrides} are the command line's options: they win over C{MRUNNER_HOME} and
    C{MRUNNER_LISTEN}, which win over the file (a variable set long ago must not silently beat
    the C{--home} typed now), and the home so chosen is where its tap.conf is looked for.
    Without C{path}, the other file of the two, when it exists, is not read: C{unread} names
    it, for the log at start.
    """
    options = {k: v for k, v in (overrides or {}).items() if v is not None}
    environment = {key: environ[name] for key, name in ENVIRONMENT.items() if name in environ}
    home = Path(options.get("home") or environment.get("home") or "~/.mrunner").expanduser()
    found = [Path("tap.conf"), home / "tap.conf"]
    if path and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist")
    candidates = [Path(path)] if path else found
    table: dict[str, Any] = {}
    source = None
    for candidate in candidates:
        if candidate.is_file():
            with candidate.open("rb") as f:
                try:
                    table = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    raise ConfigError(f"{candidate}: {e}") from None
                _check_commands(candidate.absolute(), os.fstat(f.fileno()), table)
            source = candidate.absolute()
            break
    unread = tuple(
        dict.fromkeys(p.absolute() for p in found if p.is_file() and not _same(p.absolute(), source))
    )
    if path:
        unread = ()  # chosen with --config: the others are not read on purpose
    table.update(environment)
    table.update(options)
    return with_environment(attrs.evolve(build(table), source=source, unread=unread), environ)


def _same(a: Path, b: Path | None) -> bool:
    try:
        return b is not None and a.samefile(b)
    except OSError:
        return False


def _check_commands(path: Path, stat: os.stat_result, table: Mapping[str, Any]) -> None:
    """Refuse C{[backends.X] command} (a program the daemon runs) from a file another user could have written.

    ./tap.conf is read from wherever the daemon starts, so its owner and mode are what vouch for it.
    """
    backends = table.get("backends")
    commands = (
        [name for name, t in backends.items() if isinstance(t, dict) and "command" in t]
        if isinstance(backends, dict)
        else []
    )
    if not commands:
        return
    why = None
    if stat.st_uid != os.getuid():
        why = f"it is owned by uid {stat.st_uid}, not by this user ({os.getuid()})"
    elif stat.st_mode & 0o002:
        why = "other users can write it"
    if why:
        raise ConfigError(
            f"{path}: refusing [backends.{commands[0]}] command, a program mrunner would run, because {why};"
            f" fix it with chown/chmod o-w, or remove the command"
        )
