"""The index of tags (``index.json``: manifest digest → tags), and the names that resolve through it.

The index is the store's only mutable file: rewritten whole (temp file,
fsync, rename) and owned by the reactor thread, so a reader never sees half
of it. A name is a tag (normalised as Docker Model Runner does), a manifest
digest, or a short id (a digest's first hex digits); a mistyped tag is
answered with the stored tag closest to it.

An index that cannot be read (empty, cut short, not JSON, nested past Python's
recursion limit, a directory) or that is gone is not a reason to stop: the damaged
one is moved aside, and the index is rebuilt from the manifests the store holds,
their tags lost (the manifests never carried them), with a warning saying how to
name them again. An index the daemon may not read is a start error: it may be whole.

A C{name@digest} finds the model only when C{name} is one of that model's names:
the digest alone would let the name say anything, and a key's model list could be
fooled by it.
"""

from __future__ import annotations

import difflib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import attrs
from twisted.logger import Logger

from mrunner.errors import BadRequest, Conflict, NotFound
from mrunner.names import DIGEST, SHORT_ID, parse
from mrunner.store.blobs import fsync_dir
from mrunner.store.errors import StoreCorrupt
from mrunner.values.model import Reference

NEAR = 0.8  # how alike a missing name and a stored tag must be to suggest it (difflib's ratio)
# Names remembered with the digest they found; past this many the memory starts afresh.
REMEMBERED = 1024

Tags = dict[str, list[str]]  # manifest digest -> tags


class _Damaged(Exception):
    """What is wrong with an index file that was read."""


class Index:
    """The stored models' manifest digests and their tags, in C{root}/index.json.

    C{manifests} lists the digests of the stored manifests whose blobs are all there: what a
    missing or damaged index is rebuilt from.
    """

    log = Logger()

    def __init__(self, root: Path, manifests: Callable[[], Iterable[str]] = tuple) -> None:
        self._root = root
        self.path = root / "index.json"
        for temp in root.glob("index.*.tmp"):  # a crash between write and rename
            temp.unlink()
        self._tags = self._read(manifests)
        self._digests = self._by_tag()
        self._found: dict[str, str] = {}

    def __iter__(self) -> Iterator[str]:
        """The stored models' manifest digests."""
        return iter(self._tags)

    def __contains__(self, digest: object) -> bool:
        return digest in self._tags

    def tags(self, digest: str) -> list[str]:
        return self._tags[digest]

    def size(self) -> int:
        """Bytes the index file occupies."""
        return self.path.stat().st_size if self.path.exists() else 0

    # Names

    def lookup(self, name: str) -> str:
        """The manifest digest of the model C{name} (a tag, a digest, or a short id).

        A name found is remembered until the tags change: every inference request
        looks its model up, and parsing the name was 3% of the daemon's CPU on small
        chats (py-spy).
        """
        found = self._found.get(name) if isinstance(name, str) else None
        if found is None:
            found = self._lookup(name)
            if len(self._found) >= REMEMBERED:
                self._found = {}
            self._found[name] = found
        return found

    def _lookup(self, name: str) -> str:
        if isinstance(name, str) and DIGEST.fullmatch(name):
            return self.known(name, name)
        if isinstance(name, str) and SHORT_ID.fullmatch(name):
            matches = [d for d in self._tags if d.removeprefix("sha256:").startswith(name)]
            if len(matches) > 1:
                raise BadRequest(f"model id {name} is ambiguous: give more digits")
            if matches:
                return matches[0]
        ref = parse(name)
        if ref.digest:
            return self._named(ref, self.known(ref.digest, name), name)
        return self.known(self._digests.get(str(ref), ""), str(ref))

    def _named(self, ref: Reference, digest: str, name: str) -> str:
        """C{digest}, when the name in C{ref} (with its tag, if it has one) is one of that model's tags.

        @raise NotFound: it is not, said of C{name}.
        """
        wanted = str(attrs.evolve(ref, digest=None))
        for tag in self._tags[digest]:
            if tag == wanted or (ref.tag is None and tag.rpartition(":")[0] == wanted):
                return digest
        raise NotFound(
            f"model {name} not found locally: no model named {wanted} has the digest {digest}"
            f" (a model pulled by digest has no name: give the digest alone)",
            code="model_not_found",
        )

    def known(self, digest: str, name: str) -> str:
        """C{digest}, when it is a stored model's.

        @raise NotFound: it is not, said of C{name}.
        """
        if digest not in self._tags:
            raise NotFound(
                f"model {name} not found locally{self._nearest(name)}; pull it first (POST /models/create)",
                code="model_not_found",
            )
        return digest

    def _nearest(self, name: str) -> str:
        """C{" (did you mean TAG?)"} for the stored tag closest to a mistyped C{name}, else nothing."""
        close = difflib.get_close_matches(name, list(self._digests), n=1, cutoff=NEAR)
        return f" (did you mean {close[0]}?)" if close else ""

    def deletion(self, name: str, force: bool = False) -> tuple[str, bool]:
        """The digest a delete of C{name} acts on, and whether it removes the whole model (not just
        the tag C{name}, as C{docker rmi} does while another name holds the model).

        @raise Conflict: C{name} is the id of a model with several tags and C{force} is false.
        """
        digest = self.lookup(name)
        tags = self._tags[digest]
        if len(tags) < 2:
            return digest, True
        if _is_tag(name) and str(parse(name)) in tags:
            return digest, False
        if not force:
            raise Conflict(
                f"model {name} is tagged {', '.join(tags)}; remove one of those names, or delete with"
                " force=true to remove all of them",
                code="model_has_several_tags",
            )
        return digest, True

    # Changes, each saved before it returns

    def retag(self, digest: str, tag: str | None) -> None:
        """Store the model C{digest}, named C{tag} when one is given (moving it if it was elsewhere)."""
        tags = {d: [t for t in names if t != tag] for d, names in self._tags.items()}
        tags.setdefault(digest, [])
        if tag:
            tags[digest].append(tag)
        self._save(tags)

    def untag(self, tag: str) -> None:
        self._save({d: [t for t in names if t != tag] for d, names in self._tags.items()})

    def remove(self, digest: str) -> list[str]:
        """Forget the model C{digest}; its tags, which went with it."""
        tags = dict(self._tags)
        removed = tags.pop(digest)
        self._save(tags)
        return removed

    # The file

    def _by_tag(self) -> dict[str, str]:
        return {tag: digest for digest, tags in self._tags.items() for tag in tags}

    def _read(self, manifests: Callable[[], Iterable[str]]) -> Tags:
        try:
            return self._load()
        except FileNotFoundError:
            problem, aside = "is missing", None
        except PermissionError as e:
            raise StoreCorrupt(
                f"cannot read {self.path} ({e.strerror}): give it to the user the daemon runs as"
            ) from None
        except (OSError, _Damaged) as e:
            problem = str(e) if isinstance(e, _Damaged) else f"cannot be read ({e.strerror})"
            aside = self._set_aside(problem)
        tags: Tags = {digest: [] for digest in manifests()}
        if tags or aside:
            self._save(tags)
            self.log.warn(
                "{path} {problem}{moved}; rebuilt from the {count} model manifests in the store, without"
                " tags (the index alone holds them): see them with `mrunner ls` and name each again with"
                " `mrunner tag ID NAME`",
                path=self.path,
                problem=problem,
                moved=f" (moved to {aside})" if aside else "",
                count=len(tags),
            )
        return tags

    def _load(self) -> Tags:
        try:
            value = json.loads(self.path.read_bytes())
        except (ValueError, RecursionError):  # RecursionError: "[" nested past the interpreter's limit
            raise _Damaged("is not valid JSON") from None
        models = value.get("models") if isinstance(value, dict) else None
        if not isinstance(models, dict) or not all(
            DIGEST.fullmatch(digest) and isinstance(tags, list) and all(isinstance(tag, str) for tag in tags)
            for digest, tags in models.items()
        ):
            raise _Damaged("is not a model index")
        return {digest: list(tags) for digest, tags in models.items()}

    def _set_aside(self, problem: str) -> Path:
        """Move the damaged index out of the way, kept for a person to look at; where it went."""
        aside = self.path.with_name(f"index.json.damaged-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            raise StoreCorrupt(
                f"{self.path} {problem} and cannot be moved aside ({e.strerror}): move it away, and"
                " the index is rebuilt from the model manifests at the next start"
            ) from None
        return aside

    def _save(self, tags: Tags) -> None:
        temp = self.path.with_name(f"index.{uuid.uuid4().hex}.tmp")
        with open(temp, "wb") as f:
            f.write(json.dumps({"version": 1, "models": tags}, indent=1).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, self.path)
        fsync_dir(self._root)
        self._tags = tags
        self._digests = self._by_tag()
        self._found = {}


def _is_tag(name: str) -> bool:
    """Whether C{name} is a tag, not a digest or a short id."""
    if DIGEST.fullmatch(name) or SHORT_ID.fullmatch(name):
        return False
    return not parse(name).digest
