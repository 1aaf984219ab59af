"""Which of mrunner's modules reach a library's private names, read from their source.

A name is private when it starts with one underscore. A module reaches one when
it imports one from Twisted (or names a private Twisted module), when a class
with a base from outside mrunner overrides, reads or writes one that is not
declared in mrunner (in a class body or an C{__init__}), or when it reads one
on another object that no mrunner class declares. tests/unit/test_twisted_privates.py
pins the result, so a new reach shows where it happens.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

PRIVATE = re.compile(r"^_[^_]")
PRIVATE_MODULE = re.compile(r"^twisted(\.\w+)*\._\w+")
#: (module, name) of a class, as its module names it.
Key = tuple[str, str]


def _declared(node: ast.ClassDef) -> set[str]:
    """The names a class declares: its body's, and what its C{__init__} sets on C{self}."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            names |= {
                n.attr
                for n in ast.walk(item)
                if isinstance(n, ast.Attribute) and _on_self(n) and isinstance(n.ctx, ast.Store)
            }
        targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
        names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def _on_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


class Package:
    """The source of one package: every module's tree and every class's declarations and bases."""

    def __init__(self, root: Path):
        name = root.name
        self.trees = {
            ".".join((name, *path.relative_to(root).with_suffix("").parts)).removesuffix(
                ".__init__"
            ): ast.parse(path.read_text())
            for path in sorted(root.rglob("*.py"))
        }
        self.classes: dict[Key, tuple[set[str], list[Key]]] = {}
        for module, tree in self.trees.items():
            imported = {
                alias.asname or alias.name: (node.module, alias.name)
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                for alias in node.names
            }
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[(module, node.name)] = (
                        _declared(node),
                        [_base(b, module, imported) for b in node.bases],
                    )
        self.declared = set().union(*(declared for declared, _ in self.classes.values()))

    def lineage(self, key: Key) -> tuple[set[str], set[str]]:
        """The names C{key}'s class and its mrunner ancestors declare, and those its outside bases have."""
        if key not in self.classes:
            try:
                return set(), set(dir(getattr(importlib.import_module(key[0]), key[1])))
            except (ImportError, AttributeError):
                return set(), set()
        declared, bases = self.classes[key]
        outside: set[str] = set()
        for base in bases:
            more, theirs = self.lineage(base)
            declared, outside = declared | more, outside | theirs
        return declared, outside

    def reaches(self) -> Iterator[tuple[str, str]]:
        """(module, name) for each private name of a library a module reaches."""
        for module, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("twisted"):
                    parts = (node.module or "").split(".")
                    for alias in node.names:
                        if PRIVATE.match(alias.name) or any(PRIVATE.match(part) for part in parts):
                            yield module, alias.name
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if PRIVATE_MODULE.match(node.value):
                        yield module, node.value
                elif isinstance(node, ast.Attribute) and PRIVATE.match(node.attr):
                    on_other = not (_on_self(node) or isinstance(node.value, ast.Call))
                    if on_other and node.attr not in self.declared:
                        yield module, node.attr
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    yield from self._class_reaches(module, node)

    def _class_reaches(self, module: str, node: ast.ClassDef) -> Iterator[tuple[str, str]]:
        declared, outside = self.lineage((module, node.name))
        if not outside:
            return
        for item in node.body:  # an override of a private method or attribute
            names = [item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            names += [target.id for target in targets if isinstance(target, ast.Name)]
            yield from ((module, name) for name in names if PRIVATE.match(name) and name in outside)
        for n in ast.walk(node):
            if not (isinstance(n, ast.Attribute) and PRIVATE.match(n.attr)):
                continue
            inherited = isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "super"
            if inherited or (_on_self(n) and (n.attr not in declared or n.attr in outside)):
                yield module, n.attr


def _base(base: ast.expr, module: str, imported: dict[str, tuple[str, str]]) -> Key:
    """Where a class's base is defined: C{Name} (imported or the module's own) or C{module.Name}."""
    if isinstance(base, ast.Name):
        return imported.get(base.id, (module, base.id))
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        source = imported.get(base.value.id)
        return (f"{source[0]}.{source[1]}" if source else base.value.id), base.attr
    return module, ast.unparse(base)


def private_reaches(root: Path) -> dict[str, set[str]]:
    """By module, the library private names the modules under C{root} reach."""
    found: dict[str, set[str]] = {}
    for module, name in Package(root).reaches():
        found.setdefault(module, set()).add(name)
    return found
