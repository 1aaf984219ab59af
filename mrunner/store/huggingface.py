"""Hugging Face repositories as model sources: ``hf.co/{org}/{repo}[:{quant}]``, on treq.

The Hub's documented HTTP API: ``GET {endpoint}/api/models/{repo}/revision/main?blobs=true``
lists a commit's files with the sha256 of each LFS file, and
``GET {endpoint}/{repo}/resolve/{commit}/{path}`` serves one (usually by a
redirect to a CDN host). The token (``HF_TOKEN``, else ``[huggingface] token``)
goes to the endpoint's own host only: redirects are followed here, one hop at
a time, and a hop to any other host goes without it. The token is never logged.

Names from the request are a validated reference (no ``..``, no ``/`` beyond
``org/repo``); file names from the Hub are checked segment by segment before
they become part of a URL, and never become paths on disk (blobs are named by
digest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import attrs
from treq.client import HTTPClient
from twisted.internet.error import ConnectError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.client import ResponseNeverReceived
from twisted.web.iweb import IResponse

from mrunner.config import HuggingFaceConfig
from mrunner.errors import BadRequest, MrunnerError, NotFound
from mrunner.store.artifact import parse_rfc3339
from mrunner.store.registry import registry_error, unreachable
from mrunner.store.stall import READ_TIMEOUT, Timeout, answer, discard, read_limited
from mrunner.values.model import Reference

HUB_HOSTS = frozenset({"hf.co", "huggingface.co"})
HUB = "hf.co"
DEFAULT_QUANT = "Q4_K_M"
MAX_LISTING = 16 * 1024 * 1024
MAX_REDIRECTS = 5
_REACH = "check the network, or point HF_ENDPOINT (or [huggingface] endpoint) at a hub that can be reached"
#: What a user can do when the Hub cannot be reached at all (a registry's mirrors do not apply to it).
OFFLINE_HINT = f"{_REACH}, or make the model from a GGUF file: `mrunner package --gguf FILE NAME`"
#: The same for a repository of whisper.cpp's models, whose files are not GGUF (L{offline_hint}).
WHISPER_OFFLINE_HINT = (
    f"{_REACH}, or make the model from a whisper.cpp file (ggml-*.bin): `mrunner package --whisper FILE NAME`"
)

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# The last quantization-looking part of a file name: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, UD-Q4_K_XL...
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d+(?:_[A-Za-z0-9]+)*|T?Q\d_\d|B?F16|F32|MXFP4(?:_MOE)?))(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def offline_hint(repo: str) -> str:
    """The way out for C{repo} offline: with the Hub unreachable, its name is all there is to go on,
    and a whisper.cpp repository (``ggerganov/whisper.cpp``) holds models packaged with C{--whisper}."""
    return WHISPER_OFFLINE_HINT if "whisper" in repo.lower() else OFFLINE_HINT


class HubRefused(MrunnerError):
    """The Hub wants a token for this repository, or refused the one given."""

    status = 401
    type = "authentication_error"
    code = "hub_unauthorized"


class HubForbidden(HubRefused):
    status = 403
    type = "permission_error"
    code = "hub_forbidden"


def is_hub(ref: Reference) -> bool:
    return ref.registry in HUB_HOSTS


def hub_reference(ref: Reference) -> Reference:
    """C{ref} under its canonical host: ``huggingface.co/...`` is stored as ``hf.co/...``."""
    return attrs.evolve(ref, registry=HUB)


@attrs.frozen
class HubFile:
    """A file of a repository at one commit; C{sha256} is the Hub's LFS digest (hex), if LFS."""

    path: str
    size: int
    sha256: str | None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@attrs.frozen
class Revision:
    commit: str
    modified: int
    files: tuple[HubFile, ...]


@attrs.frozen
class Selection:
    """What a pull takes: the weights (one file or a whole shard set, in order) and a projector."""

    quant: str
    weights: tuple[HubFile, ...]
    mmproj: HubFile | None = None


def quant_of(path: str) -> str | None:
    """The quantization a GGUF file's name says (``Q4_K_M``), upper-case; None if it says none."""
    stem = _SHARD.sub("", path.rsplit("/", 1)[-1])
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def select(repo: str, files: Iterable[HubFile], tag: str | None) -> Selection:
    """Pick the files of C{tag}'s quantization (C{None} or ``latest``: Q4_K_M, else the only one).

    @raise BadRequest: no GGUF at all (safetensors only, say), several quants and no
        choice, or an incomplete shard set.
    @raise NotFound: no file of the quant asked for; the message lists those there are.
    """
    files = list(files)
    ggufs = [f for f in files if f.path.lower().endswith(".gguf")]
    projectors = [f for f in ggufs if "mmproj" in f.name.lower()]
    groups: dict[str, list[HubFile]] = {}
    for f in ggufs:
        if f not in projectors:
            groups.setdefault(quant_of(f.path) or f.path, []).append(f)
    if not groups:
        raise _no_gguf(repo, files)
    wanted = None if tag in (None, "latest") else str(tag)
    quants = sorted(groups)
    if wanted is None:
        chosen = next(
            (q for q in quants if q.upper() == DEFAULT_QUANT), quants[0] if len(quants) == 1 else None
        )
        if chosen is None:
            raise BadRequest(
                f"hf.co/{repo} has no {DEFAULT_QUANT} file and several others; name one as"
                f" hf.co/{repo}:QUANT, one of: {', '.join(quants)}",
                code="quant_required",
            )
    else:
        chosen = next((q for q in quants if q.lower() == wanted.lower()), None)
        if chosen is None:
            raise NotFound(
                f"hf.co/{repo} has no {wanted} GGUF file; available: {', '.join(quants)}",
                code="quant_not_found",
            )
    return Selection(chosen, _shard_set(repo, groups[chosen]), _projector(projectors, chosen))


def _shard_set(repo: str, files: list[HubFile]) -> tuple[HubFile, ...]:
    """One file, or the shards of one split set in order; several of one quant take the first set."""
    single = [f for f in files if not _SHARD.search(f.name)]
    if single:
        return (sorted(single, key=lambda f: f.path)[0],)
    first = sorted(files, key=lambda f: f.path)[0]
    count = int(_SHARD.search(first.name)[2])  # type: ignore[index]  # every file here matched
    prefix = first.path[: _SHARD.search(first.path).start()]  # type: ignore[union-attr]
    by_name = {f.path.lower(): f for f in files}
    shards = [by_name.get(f"{prefix}-{n:05d}-of-{count:05d}.gguf".lower()) for n in range(1, count + 1)]
    missing = [n for n, shard in enumerate(shards, 1) if shard is None]
    if missing:
        raise BadRequest(
            f"hf.co/{repo}: the split model {first.path} lacks shard(s) {missing} of {count}",
            code="incomplete_shards",
        )
    return tuple(shard for shard in shards if shard is not None)


def _projector(projectors: list[HubFile], quant: str) -> HubFile | None:
    """The repository's projector: of the weights' quant, else F16, else BF16, else the first."""
    ordered = sorted(projectors, key=lambda f: f.path)
    for want in (quant, "F16", "BF16"):
        match = next((f for f in ordered if quant_of(f.path) == want), None)
        if match is not None:
            return match
    return ordered[0] if ordered else None


def _no_gguf(repo: str, files: Sequence[HubFile]) -> BadRequest:
    formats = sorted({f.name.rsplit(".", 1)[-1] for f in files if f.name.endswith((".safetensors", ".bin"))})
    what = f"only {' and '.join(formats)} weights" if formats else "no GGUF file"
    return BadRequest(
        f"hf.co/{repo} has {what}; mrunner runs GGUF models (llama.cpp). GGUF conversions are"
        " usually published as separate repositories, often named …-GGUF: pull one of those",
        code="no_gguf",
    )


def parse_revision(repo: str, data: bytes) -> Revision:
    """The Hub's ``revision`` answer: commit, last change and files with their LFS sha256.

    @raise BadGateway: not the shape the Hub documents, or a file name that would
        leave the repository in a URL.
    """
    try:
        value = json.loads(data)
        commit = value["sha"]
        siblings = value["siblings"]
        files = tuple(_hub_file(entry) for entry in siblings)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise registry_error(f"the Hub's listing of {repo} is not in the documented shape") from None
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise registry_error(f"the Hub names {str(commit)[:80]!r} as the commit of {repo}")
    modified = value.get("lastModified")
    return Revision(commit, parse_rfc3339(modified) if isinstance(modified, str) else 0, files)


def _hub_file(entry: Mapping[str, Any]) -> HubFile:
    path, size, lfs = entry["rfilename"], entry.get("size", 0), entry.get("lfs") or {}
    if not isinstance(path, str) or not safe_path(path):
        raise registry_error(f"the Hub lists a file named {str(path)[:200]!r}, which mrunner will not fetch")
    sha = lfs.get("sha256") if isinstance(lfs, dict) else None
    size = lfs.get("size", size) if sha else size
    if not isinstance(size, int) or size < 0:
        raise TypeError("size")
    return HubFile(path, size, sha if isinstance(sha, str) and _SHA256.fullmatch(sha) else None)


def safe_path(path: str) -> bool:
    """Whether a file name from the Hub stays inside its repository in a URL."""
    parts = path.split("/")
    return len(path) <= 1024 and all(
        part not in ("", ".", "..") and "\\" not in part and all(0x20 < ord(c) != 0x7F for c in part)
        for part in parts
    )


class HubClient:
    """The Hub's HTTP API for pulls; holds the endpoint and the token."""

    log = Logger()

    def __init__(
        self,
        config: HuggingFaceConfig,
        http: HTTPClient,
        environ: Mapping[str, str],
        clock: IReactorTime,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.endpoint = (environ.get("HF_ENDPOINT") or config.endpoint).rstrip("/")
        self._token = environ.get("HF_TOKEN") or config.token
        self._http = http
        self.timeout = Timeout(clock, read_timeout)

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).netloc

    async def revision(self, repo: str) -> Revision:
        """The files of C{repo}'s main branch, with their sha256."""
        response = await self._get(f"/api/models/{repo}/revision/main?blobs=true", repo)
        listing = await read_limited(response, MAX_LISTING, f"the Hub's listing of {repo}", self.timeout)
        return parse_revision(repo, listing)

    async def open(self, repo: str, revision: Revision, file: HubFile, offset: int = 0) -> IResponse:
        """C{file}'s body at the commit listed, from C{offset} (206) or whole (200); 416 passes through."""
        path = "/".join(quote(part, safe="") for part in file.path.split("/"))
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        return await self._get(f"/{repo}/resolve/{revision.commit}/{path}", repo, headers, (200, 206, 416))

    async def _get(
        self,
        path: str,
        repo: str,
        headers: Mapping[str, str] | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> IResponse:
        url = self.endpoint + path
        for _ in range(MAX_REDIRECTS + 1):
            sent: dict[bytes | str, bytes | str] = {"User-Agent": "mrunner"}
            sent.update(headers or {})
            host = urlsplit(url).netloc
            if self._token and host == self.host:  # never to a CDN or another host
                sent["Authorization"] = f"Bearer {self._token}"
            try:
                response = await answer(
                    self._http.get(url, headers=sent, allow_redirects=False, unbuffered=True),
                    host,
                    self.timeout,
                )
            except (ConnectError, DNSLookupError, ResponseNeverReceived) as e:
                raise unreachable(f"Hugging Face endpoint {self.host}", e, offline_hint(repo)) from None
            location = response.headers.getRawHeaders(b"location", [b""])[0].decode("latin-1")
            if response.code in (301, 302, 303, 307, 308) and location:
                await discard(response, host, self.timeout)
                url = urljoin(url, location)
                if urlsplit(url).scheme not in ("http", "https"):
                    raise registry_error(f"the Hub redirected {repo} to {url[:200]!r}")
                continue
            if response.code in expect:
                return response
            await discard(response, host, self.timeout)
            raise self._error(repo, response)
        raise registry_error(f"the Hub redirected {repo} more than {MAX_REDIRECTS} times")

    def _error(self, repo: str, response: IResponse) -> MrunnerError:
        code = response.headers.getRawHeaders(b"x-error-code", [b""])[0].decode("latin-1")
        token = "HF_TOKEN (or [huggingface] token in tap.conf)"
        if response.code == 404 or (code == "RepoNotFound" and not self._token):
            private = "" if self._token else f"; if it is private, set {token}"
            return NotFound(f"hf.co/{repo} was not found on {self.host}{private}", code="model_not_found")
        if response.code in (401, 403):
            cls = HubForbidden if response.code == 403 else HubRefused
            if self._token:
                return cls(
                    f"{self.host} refused the token in {token} for hf.co/{repo}: it may be gated (accept"
                    " its terms on its page with the account of that token) or the token lacks access"
                )
            return cls(f"hf.co/{repo} is gated or private: set {token} to a token with access to it")
        return registry_error(f"{self.host} answered {response.code} for hf.co/{repo}")
