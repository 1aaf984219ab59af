"""Values of settings: durations, sizes, counts and choices read from their TOML spellings."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import attrs

from mrunner.values import durations

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[kmgt]i?)?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    prefix + suffix: (1024 if "i" in suffix else 1000) ** power
    for power, prefix in enumerate(("", "k", "m", "g", "t"))
    for suffix in (("", "b") if not prefix else ("", "b", "ib", "i"))
}
AUTO_MEMORY_SHARE = 0.8
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def parse_duration(value: object, key: str = "duration") -> float:
    """Seconds from ``30``, ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``; ``-1`` means never."""
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value))
            if match is None:
                raise ValueError
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if not math.isfinite(seconds):
            raise ValueError
    except (ValueError, OverflowError):
        raise ConfigError(f"{key}: expected a duration like '30s', '5m' or -1, got {value!r:.80}") from None
    return seconds


def parse_keep_alive(value: object, key: str = "keep_alive") -> float:
    """A keep-alive duration: negatives and anything past a year mean for ever (-1)."""
    return durations.keep_alive(parse_duration(value, key))


def parse_instances(value: object, key: str = "instances") -> int:
    """A count of runners: a positive integer."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
    return value


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from ``1073741824``, ``"512MiB"``, ``"8GiB"``, ``"2GB"``, or ``"60%"`` of RAM.

    ``"auto"`` is 80% of RAM; 0 is none.
    """
    if value == "auto":
        return int(physical_memory() * AUTO_MEMORY_SHARE)
    percent = _PERCENT.match(str(value))
    if percent is not None and 0 < float(percent.group(1)) <= 100:
        return int(physical_memory() * float(percent.group(1)) / 100)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(str(value))
    if match is None or isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like '8GiB', '80%', 'auto' or 0, got {value!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def duration(default: float) -> Any:
    """A settings field in seconds, written as a duration in the file."""
    return attrs.field(default=default, metadata={"parse": parse_duration})


def parse_wait(value: object, key: str) -> float:
    """A duration that cannot be "never": ``0`` and up."""
    seconds = parse_duration(value, key)
    if seconds < 0:
        raise ConfigError(f"{key}: expected a duration of 0 or more, got {value!r}")
    return seconds


def parse_factor(value: object, key: str) -> float:
    """A number of 0 or more (``1``, ``0.5``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ConfigError(f"{key}: expected a number of 0 or more, got {value!r}")
    return float(value)


def secret() -> Any:
    """A list of keys, kept out of every repr (and so out of every log line)."""
    return attrs.field(default=(), repr=False)


def one_of(*choices: str) -> Callable[[object, str], str]:
    """The parser of a key that takes one of C{choices}."""

    def parse(value: object, key: str) -> str:
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


def parse_gpu_devices(value: object, key: str) -> str | tuple[str, ...]:
    """``"auto"`` (every GPU the build lists), ``"none"`` (the CPU only), or a list of ids (``["CUDA0"]``)."""
    if value in ("auto", "none"):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(item, str) and item for item in value):
        return tuple(value)
    raise ConfigError(f"{key}: expected 'auto', 'none' or a list of device ids like ['CUDA0'], got {value!r}")


def parse_device_budget(value: object, key: str) -> int | float:
    """A share of each device's memory (``"90%"``, as a float 0.9) or bytes (``"20GiB"``, an int)."""
    percent = _PERCENT.match(str(value))
    if percent is not None and 0 < float(percent.group(1)) <= 100 and not isinstance(value, bool):
        return float(percent.group(1)) / 100
    if value == "auto":
        raise ConfigError(f"{key}: expected a size like '20GiB' or a share like '90%', got 'auto'")
    return parse_size(value, key)


PRIORITIES = ("high", "normal", "low")


def _limit(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{key}: expected a whole number, 0 for no limit, got {value!r}")
    return value


def text(value: object, key: str) -> str:
    """A non-empty string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string")
    return value.strip()


def folder(value: object, key: str) -> str:
    """A folder's path, C{~} expanded where it is used; C{""} means none."""
    if not isinstance(value, str):
        raise ConfigError(f'{key}: expected a folder\'s path as a string, or "" for none')
    return value.strip()


def limit_field() -> Any:
    """A settings field counting a limit; 0, the default, is none."""
    return attrs.field(default=0, metadata={"parse": _limit})
