"""Model references as Docker Model Runner normalises them: ``smollm2`` is ``ai/smollm2:latest``.

Ollama's names are normalised as Ollama does: ``ollama.com/llama3.2`` and
``registry.ollama.ai/library/llama3.2`` are ``ollama.com/library/llama3.2:latest``.

The grammar is the distribution (OCI) reference grammar, so every name is
either a valid registry reference or a L{BadRequest}. A reference is only ever
a key (in the index, in registry URLs); it never becomes a path on disk.
"""

from __future__ import annotations

import re
from functools import lru_cache

import attrs

from mrunner.docker_config import HUB_HOSTS, is_registry_host
from mrunner.errors import BadRequest
from mrunner.values.model import Reference, names_registry

DEFAULT_NAMESPACE = "ai"
DEFAULT_TAG = "latest"
MAX_LENGTH = 512
DOCKER_HUB = frozenset(HUB_HOSTS)
#: Ollama's registry, by the names Ollama gives it; its models are stored under the first.
OLLAMA = "ollama.com"
OLLAMA_HOSTS = frozenset({OLLAMA, "registry.ollama.ai"})
OLLAMA_NAMESPACE = "library"

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SHORT_ID = re.compile(r"[0-9a-f]{12,64}")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # whitespace and control characters
_TAG = re.compile(r"\w[\w.-]{0,127}", re.ASCII)
_MAX_REPOSITORY = 255


def parse(text: object, what: str = "model name") -> Reference:
    """Normalise C{text} into a L{Reference}.

    @raise BadRequest: C{text} is not a valid model reference; the message says why.
    """
    if not isinstance(text, str) or not text:
        raise BadRequest(f"{what} must be a non-empty string")
    if len(text) > MAX_LENGTH:
        raise BadRequest(f"{what} is longer than {MAX_LENGTH} characters")
    if _CONTROL.search(text):
        raise BadRequest(f"{what} {text!r} contains whitespace or control characters")
    rest, _, digest = text.partition("@")
    if digest and not DIGEST.fullmatch(digest):
        raise BadRequest(f"{what} {text!r}: digest must be sha256: followed by 64 hex digits")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], _check_tag(rest[colon + 1 :], text)
    registry, repository = _split_registry(rest)
    repository = repository.lower()
    if registry in OLLAMA_HOSTS:
        registry = OLLAMA
        repository = repository if "/" in repository else f"{OLLAMA_NAMESPACE}/{repository}"
    if "/" not in repository and not registry:
        repository = f"{DEFAULT_NAMESPACE}/{repository}"
    if len(repository) > _MAX_REPOSITORY or not all(
        _COMPONENT.fullmatch(part) for part in repository.split("/")
    ):
        raise BadRequest(
            f"{what} {text!r} is not a valid reference: use [registry/]namespace/name[:tag],"
            " with lowercase letters, digits and . _ - separators"
        )
    if tag is None and not digest:
        tag = DEFAULT_TAG
    return Reference(registry, repository, tag, digest or None)


@lru_cache(maxsize=256)  # requests repeat names, and parsing one costs more than the rest of a check
def normal_name(name: str) -> str:
    """C{name} as the store knows it (C{smollm2} is C{ai/smollm2:latest}); as given when it is no name."""
    try:
        return str(parse(name))
    except BadRequest:
        return name


def with_tag(ref: Reference, tag: str) -> Reference:
    """C{ref} with the tag C{tag} and no digest.

    @raise BadRequest: C{tag} is not a valid tag.
    """
    return attrs.evolve(ref, tag=_check_tag(tag), digest=None)


def _split_registry(name: str) -> tuple[str, str]:
    first, _, rest = name.partition("/")
    if names_registry(name):
        if not is_registry_host(first):
            raise BadRequest(f"registry {first!r} is not a valid host[:port]")
        return ("" if first.lower() in DOCKER_HUB else first.lower()), rest
    return "", name


def _check_tag(tag: str, text: str | None = None) -> str:
    if not _TAG.fullmatch(tag):
        raise BadRequest(
            f"tag {tag!r}{f' in {text!r}' if text else ''} is not valid: up to 128 letters,"
            " digits, '_', '.' or '-', not starting with '.' or '-'"
        )
    return tag
