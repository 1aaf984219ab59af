"""Fail ``make lint`` when a module under mrunner/ or bench/ passes 400 lines or a function 60.

Small modules with one job, and functions that read in one screen, are the house rule (issue 37
point 8); this keeps them from creeping back. A function's size is its ``ast`` node's
``end_lineno - lineno + 1`` (decorators and docstring included). tests/ is exempt: a test module
is a table of named cases, long by design and read one case at a time, and a test's length is its
scenario's. C and JavaScript files (the C relay loop, the page's script) are held to the module
limit alone: without a parser, a count of braces would misread strings and comments, and a
function's size could not be read as surely as ``ast`` reads Python's.
``tools/sizes_allowed.txt`` lists the exceptions, each with its reason: ``PATH`` (the module)
or ``PATH:FUNCTION`` (a function, by name, nested or in a class), ``#``, why.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MODULE_LINES = 400
FUNCTION_LINES = 60
ROOTS = ("mrunner", "bench")
#: The files read: Python (modules and functions), C and JavaScript (modules only).
SUFFIXES = (".py", ".c", ".js")
ALLOWED = Path(__file__).with_name("sizes_allowed.txt")


def allowed(text: str) -> set[str]:
    """The entries of an allow-list; each must say why after ``#``."""
    entries = set()
    for number, line in enumerate(text.splitlines(), 1):
        entry, _, why = line.partition("#")
        if entry.strip():
            if not why.strip():
                raise ValueError(f"line {number}: {entry.strip()} gives no reason after '#'")
            entries.add(entry.strip())
    return entries


def oversized(path: str, source: str) -> Iterator[tuple[str, int, int]]:
    """(entry, lines, limit) for the module and, in Python, each function in it over its limit."""
    lines = len(source.splitlines())
    if lines > MODULE_LINES:
        yield path, lines, MODULE_LINES
    if not path.endswith(".py"):
        return
    functions = [
        node
        for node in ast.walk(ast.parse(source, path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in sorted(functions, key=lambda node: node.lineno):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > FUNCTION_LINES:
            yield f"{path}:{node.name}", length, FUNCTION_LINES


def problems(root: Path, exceptions: set[str]) -> list[str]:
    """One line per size under C{root}'s L{ROOTS} over its limit that the allow-list does not name."""
    return [
        f"{entry}: {lines} lines, over {limit}; split it by job (or add it to {ALLOWED.name} with why)"
        for top in ROOTS
        for path in sorted(p for p in (root / top).rglob("*") if p.suffix in SUFFIXES and p.is_file())
        for entry, lines, limit in oversized(path.relative_to(root).as_posix(), path.read_text())
        if entry not in exceptions
    ]


def main() -> int:
    found = problems(Path("."), allowed(ALLOWED.read_text()))
    print(*found, sep="\n", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
