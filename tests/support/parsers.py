"""The front door's two head parsers ([http] head_parser): door tests run with each."""

from __future__ import annotations

from typing import TypeVar

Case = TypeVar("Case", bound=type)


def with_twisted_heads(case: Case) -> Case:
    """C{case} again, with twisted.web's own parser reading request heads instead of httptools."""
    name = f"{case.__name__}TwistedHeads"
    # Named in the case's module, as `trial -j` finds a test by its module and class names.
    attributes = {"head_parser": "twisted", "__module__": case.__module__, "__qualname__": name}
    return type(name, (case,), attributes)  # type: ignore[return-value]


def http_setting(text: str, key: str, value: str) -> str:
    """The config C{text} with C{[http] KEY = "VALUE"}, in its C{[http]} table or a new one."""
    setting = f'{key} = "{value}"\n'
    if "[http]\n" in text:
        return text.replace("[http]\n", "[http]\n" + setting, 1)
    return f"{text}\n[http]\n{setting}"
