"""The llama-server flags a client may set through C{_configure}, and the values each takes.

Taken from the pinned llama-server's own parser (llama-cpp-python 0.3.36's
vendored ``common/arg.cpp``): a flag or value it would refuse makes the runner
exit at start, which a client would see as a 500. Only sampling and
performance knobs are here: never a path, a network address or anything that
fetches. llama-server has no ``--flag=value`` form, so each value is its own item.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from mrunner.errors import BadRequest

INT_MAX = 2**31 - 1
# More threads than CPUs only slows llama.cpp down, and 100000 of them kill it.
MAX_THREADS = os.cpu_count() or 1

# A value check returns what the value must be, or None when it is fine.
Value = Callable[[str], str | None]


def integer(low: int, high: int = INT_MAX, *words: str) -> Value:
    def check(value: str) -> str | None:
        if value in words:
            return None
        digits = value.removeprefix("-")
        short = len(digits) <= max(len(str(low)), len(str(high)))  # int() refuses 4,300 digits
        if short and digits.isascii() and digits.isdigit() and low <= int(value) <= high:
            return None
        return f"an integer from {low} to {high}" + "".join(f" or {w!r}" for w in words)

    return check


def number(low: float, high: float = math.inf, *, above: bool = False) -> Value:
    def check(value: str) -> str | None:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if value.isascii() and math.isfinite(x) and (x > low if above else x >= low) and x <= high:
            return None
        bound = f"above {low:g}" if above else f"at least {low:g}"
        return f"a number {bound}" + (f" and at most {high:g}" if high != math.inf else "")

    return check


def choice(*values: str) -> Value:
    return lambda value: None if value in values else "one of " + ", ".join(values)


SWITCH = choice("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1")
CACHE_TYPE = choice("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# Each flag (with its aliases) and its value check; None for a flag that takes no value.
# fmt: off
FLAGS: dict[str, Value | None] = {
    **dict.fromkeys(("--temp", "--temperature"), number(0)),
    "--top-k": integer(0),
    "--top-p": number(0, 1),
    "--min-p": number(0, 1),
    "--repeat-penalty": number(0, above=True),
    "--repeat-last-n": integer(0, 1 << 20),
    **dict.fromkeys(("-s", "--seed"), integer(-1, 2**32 - 1)),
    **dict.fromkeys(("-b", "--batch-size"), integer(1, 1 << 16)),
    **dict.fromkeys(("-ub", "--ubatch-size"), integer(1, 1 << 16)),
    **dict.fromkeys(("-t", "--threads"), integer(-1, MAX_THREADS)),
    **dict.fromkeys(("-tb", "--threads-batch"), integer(-1, MAX_THREADS)),
    **dict.fromkeys(("-fa", "--flash-attn"), SWITCH),
    **dict.fromkeys(("-ctk", "--cache-type-k"), CACHE_TYPE),
    **dict.fromkeys(("-ctv", "--cache-type-v"), CACHE_TYPE),
    **dict.fromkeys(("-ngl", "--gpu-layers", "--n-gpu-layers"), integer(0, INT_MAX, "auto", "all")),
    "--rope-scaling": choice("none", "linear", "yarn"),
    "--rope-freq-base": number(0, above=True),
    "--rope-freq-scale": number(0, above=True),
    **dict.fromkeys(("-n", "--predict", "--n-predict"), integer(-2)),
    **dict.fromkeys(("-cb", "--cont-batching", "-nocb", "--no-cont-batching"), None),
    "--cache-reuse": integer(0),
    "--keep": integer(-1),
    "--reasoning-budget": integer(-1),
    "--reasoning-format": choice("none", "auto", "deepseek", "deepseek-legacy"),
    # the draft model's own settings, for speculative decoding (the draft itself comes from the store)
    **dict.fromkeys(("--spec-draft-n-max", "--spec-draft-n-min"), integer(0)),
    **dict.fromkeys(("--spec-draft-p-min", "--spec-draft-p-split"), number(0, 1)),
    **dict.fromkeys(("-ngld", "--spec-draft-ngl"), integer(0, INT_MAX, "auto", "all")),
    **dict.fromkeys(("-td", "--spec-draft-threads"), integer(-1, MAX_THREADS)),
    **dict.fromkeys(("-ctkd", "--spec-draft-type-k"), CACHE_TYPE),
    **dict.fromkeys(("-ctvd", "--spec-draft-type-v"), CACHE_TYPE),
}
# fmt: on


def runtime_flags(value: object) -> tuple[str, ...]:
    """Flags from a list or a space-separated string: each allowed, each followed by one valid value.

    An empty list is allowed: it clears the flags set before.
    """
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("runtime-flags must be a list of strings", param="runtime_flags")
    tokens = iter(value)
    for token in tokens:
        if token not in FLAGS:
            raise _refused(token)
        check = FLAGS[token]
        if check is None:
            continue
        given = next(tokens, None)
        expected = "a value" if given is None else check(given)
        if expected is not None:
            raise BadRequest(
                f"runtime flag {token} takes {expected}, not {given!r:.40}",
                code="flag_value_not_allowed",
                param="runtime_flags",
            )
    return tuple(value)


def _refused(token: str) -> BadRequest:
    flag, equals, _ = token.partition("=")
    if equals and flag in FLAGS:
        why = f"write {flag}'s value as the next item: llama-server has no {flag}=VALUE form"
    elif token.startswith("-"):
        why = f"runtime flag {flag!r} is not allowed; allowed: {' '.join(sorted(FLAGS))}"
    else:
        why = f"{token!r:.40} is not a flag: each value follows the flag it belongs to"
    return BadRequest(why, code="flag_not_allowed", param="runtime_flags")
