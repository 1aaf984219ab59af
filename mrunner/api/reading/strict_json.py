"""Strict JSON: a request body as llama-server can read it, or a 400 naming what it cannot.

llama-server answers some bodies Python's decoder takes with a 500 (C{NaN},
duplicate keys, UTF-16, lone surrogates, integers past 64 bits, deep nesting):
L{parse_json} refuses them first, naming the field where there is one.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from mrunner.errors import BadRequest

# Deeper than any real request (a tool's JSON schema included), far from the parser's recursion limit.
MAX_DEPTH = 64


def parse_json(body: bytes) -> Any:
    """C{body} as standard JSON in UTF-8: no C{NaN}/C{Infinity}, no duplicate keys, at most L{MAX_DEPTH}
    deep, no lone surrogate in a string or key, no integer past 64 bits.

    Python's decoder takes UTF-16 and UTF-32 bodies, surrogates written raw or as C{\\ud800}, and
    integers of any size; llama-server answers each with a 500, so they are refused here, by field.
    """
    try:
        text = body.decode("utf-8", errors="surrogatepass")  # a raw surrogate is named by its field below
        value = json.loads(text, parse_constant=_constant, parse_float=_float, object_pairs_hook=_unique)
    except _JSONError:
        raise
    except RecursionError:
        raise _too_deep() from None
    except UnicodeDecodeError as e:
        raise BadRequest(
            f"request body is not UTF-8 (byte {e.start}): send JSON encoded as UTF-8", code="invalid_json"
        ) from None
    except ValueError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    # A surrogate comes as an escape (\ud800 to \udfff) or raw (its UTF-8 form starts 0xED): strings
    # are searched for one only when the body has either.
    surrogates = b"\\ud" in body or b"\\uD" in body or b"\xed" in body
    if _unsendable_found(value, surrogates):
        _refuse_unsendable(value)
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
# The widest integers llama-server's JSON reader holds.
_INTEGERS = (-(2**63), 2**64 - 1)


def _refuse_unsendable(value: Any) -> None:
    """Raise, naming the field, at the first string or key with a lone surrogate or integer past 64 bits.

    A surrogate pair in the body's text is one character once decoded, so any surrogate left is lone.
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{_field(key)}" if path else _field(key)
                if _SURROGATE.search(key):
                    raise _unsendable(where, "its name has a lone UTF-16 surrogate")
                stack.append((child, where))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise _unsendable(path, "it has a lone UTF-16 surrogate, which no UTF-8 text can hold")
        elif (
            isinstance(item, int) and not isinstance(item, bool) and not _INTEGERS[0] <= item <= _INTEGERS[1]
        ):
            raise _unsendable(path, "it is an integer past 64 bits")


def _field(key: str) -> str:
    """A key as a field's name in a message: itself, or escaped when it has a surrogate."""
    return json.dumps(key) if _SURROGATE.search(key) else key


def _unsendable(param: str, why: str) -> BadRequest:
    param = param or "(the body)"
    return BadRequest(f"'{param}' cannot be read: {why}", code="invalid_value", param=param)


class _JSONError(BadRequest, ValueError):
    """Raised from inside the decoder's hooks, so it passes through its ValueError handling."""


def _too_deep() -> BadRequest:
    return BadRequest(f"request body is nested more than {MAX_DEPTH} levels deep", code="invalid_json")


def _constant(name: str) -> None:
    raise _JSONError(f"request body is not standard JSON: {name} is not a number", code="invalid_json")


def _float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _JSONError(f"request body has a number out of range: {text:.40}", code="invalid_json")
    return number


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict, unless a key repeats: mrunner and a runner could read different values."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JSONError(
                    f"the key {key!r} appears more than once in an object", code="invalid_json", param=key
                )
            seen.add(key)
    return result


def _unsendable_found(value: Any, surrogates: bool) -> bool:
    """Whether C{value} has an integer past 64 bits or (with C{surrogates}) a lone surrogate; raises
    when it nests more than L{MAX_DEPTH} deep. One pass without recursion, on every body."""
    low, high = _INTEGERS
    stack = [([value], 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if surrogates and any(_SURROGATE.search(key) for key in item):
                return True
            children = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                if depth + 1 > MAX_DEPTH:
                    raise _too_deep()
                stack.append((child, depth + 1))
            elif kind is int:
                if not low <= child <= high:
                    return True
            elif kind is str and surrogates and _SURROGATE.search(child):
                return True
    return False
