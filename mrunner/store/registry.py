"""A client for the distribution (OCI) HTTP API v2, on treq.

It knows registries, not models: where a repository lives (mirrors, plain
HTTP only for hosts the config marks insecure), how to authenticate (Docker
Hub's Bearer token flow and basic auth), and which status means what. It
streams: callers get unbuffered responses and never hold a blob in memory.
A registry that sends nothing for C{read_timeout} seconds is given up
(L{mrunner.store.stall}).

A registry names its token service (the Bearer realm), so the realm is
distrusted: HTTPS only (or a host marked insecure), no redirects, an answer of
at most L{MAX_TOKEN_ANSWER} bytes, and a token that is a valid header value.

What a pull or push earns (a token, the basic credentials that served) lives
with its L{Repository}, which each operation gets afresh: the credentials are
read at each pull or push, so a logout or a changed config.json counts at the
next one, as it does for C{docker}.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import attrs
from treq.client import HTTPClient
from twisted.internet.error import ConnectError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool, ResponseNeverReceived
from twisted.web.iweb import IResponse

from mrunner.config import RegistryConfig
from mrunner.docker_config import Credential
from mrunner.errors import BadGateway, MrunnerError, NotFound
from mrunner.names import DOCKER_HUB, OLLAMA_HOSTS
from mrunner.store.artifact import MANIFEST_TYPES
from mrunner.store.clientpool import QuietPool
from mrunner.store.credentials import Credentials
from mrunner.store.stall import READ_TIMEOUT, Timeout, answer, discard, read_limited
from mrunner.values.model import Reference

MAX_MANIFEST = 4 * 1024 * 1024
MAX_TOKEN_ANSWER = 64 * 1024
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
#: A token goes out in an Authorization header: visible ASCII only (RFC 6750's b64token is narrower).
_TOKEN = re.compile(r"[\x21-\x7e]+")
#: What a user can do when a registry cannot be reached at all.
OFFLINE_HINT = (
    "check the network, or use a registry that can be reached (a mirror in [registry] mirrors, or a"
    " local one: `mrunner pull localhost:5000/NAME`), or make the model from a GGUF file:"
    " `mrunner package --gguf FILE NAME`"
)


class Unauthorized(MrunnerError):
    """The registry refused our credentials, or wants some and the config has none."""

    status = 401
    type = "authentication_error"
    code = "registry_unauthorized"


def registry_error(message: str, code: str = "registry_error") -> BadGateway:
    return BadGateway(message, code=code)


def unreachable(what: str, error: Exception, hint: str = OFFLINE_HINT) -> BadGateway:
    """No answer at all (DNS, connection): distinct, so a client can fall back on its local copy."""
    return registry_error(f"{what} is unreachable ({_reason(error)}): {hint}", code="registry_unreachable")


@attrs.frozen
class Repository:
    """A repository at one registry endpoint, ``{base}/v2/{name}/...``, for one pull or push.

    C{auth} holds the Authorization header that operation earned, by scope
    (C{""}: basic credentials, for every scope).
    """

    host: str
    base: str
    name: str
    auth: dict[str, bytes] = attrs.field(factory=dict, eq=False, repr=False)

    def url(self, path: str) -> str:
        return f"{self.base}/v2/{self.name}/{path}"


class RegistryClient:
    """Talks to registries for pulls and pushes."""

    log = Logger()

    def __init__(
        self,
        config: RegistryConfig,
        reactor: IReactorTime,
        http: HTTPClient | None = None,
        read_timeout: float = READ_TIMEOUT,
        credentials: Credentials | None = None,
    ) -> None:
        self._config = config
        self._credentials = credentials or Credentials(config.auth)
        self.timeout = Timeout(reactor, read_timeout)
        if http is None:
            self._pool: HTTPConnectionPool | None = QuietPool(reactor)
            http = HTTPClient(Agent(reactor, pool=self._pool))
        else:
            self._pool = None
        self._http = http

    def close(self) -> Any:
        """Close idle connections (at shutdown, and so tests leave a clean reactor)."""
        return self._pool.closeCachedConnections() if self._pool else None

    def repositories(self, ref: Reference, pull: bool = True) -> list[Repository]:
        """Where to find C{ref}: its mirror first (pulls only), then the registry itself; fresh for each
        operation, which keeps what it earns in them. Ollama's names go to C{[registry] ollama}."""
        host = ref.registry or self._config.default
        if host in OLLAMA_HOSTS:
            host = self._config.ollama
        hosts = [host]
        mirror = self._config.mirrors.get(host) or (
            self._config.mirrors.get("docker.io") if host in DOCKER_HUB else None
        )
        if pull and mirror:
            hosts.insert(0, mirror)
        return [Repository(h, self._base(h), ref.repository) for h in hosts]

    def _base(self, host: str) -> str:
        if "://" in host:
            return host.rstrip("/")
        if host in DOCKER_HUB:
            host = "registry-1.docker.io"
        scheme = "http" if self._insecure(host) else "https"
        return f"{scheme}://{host}"

    def _insecure(self, host: str) -> bool:
        hostname = urlsplit(f"//{host}").hostname or host
        return (
            host in self._config.insecure
            or hostname in self._config.insecure
            or (f"[{hostname}]" in self._config.insecure)
        )

    async def request(
        self,
        method: str,
        repo: Repository,
        path: str,
        *,
        actions: str = "pull",
        headers: Mapping[str, str] | None = None,
        body: Callable[[], Any] | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> IResponse:
        """Send a request, answering one auth challenge; an unbuffered response in C{expect}.

        C{path} is relative to the repository, or an absolute URL the registry gave
        (an upload location). C{body} makes the request body afresh, so it can be
        sent again after a challenge.

        @raise Unauthorized: the registry still says 401 after authenticating.
        @raise NotFound: 404 (and 404 is not expected).
        @raise BadGateway: unreachable, or any other unexpected status.
        """
        url = urljoin(repo.url(""), path)
        scope = f"repository:{repo.name}:{actions}"
        response = await self._send(method, url, repo, scope, headers, body)
        if response.code == 401:
            challenge = response.headers.getRawHeaders(b"www-authenticate", [b""])[0]
            await discard(response, f"registry {repo.host}", self.timeout)
            await self._authenticate(repo, scope, challenge.decode("latin-1"))
            response = await self._send(method, url, repo, scope, headers, body)
        if response.code in expect:
            return response
        what = f"{method} {urlsplit(url).path}"
        detail = await _error_detail(response, self.timeout)
        if response.code in (401, 403):
            raise Unauthorized(
                f"registry {repo.host} refused {actions} access to {repo.name}{detail};"
                f" check [registry.auth] in tap.conf, or `mrunner login {repo.host}`"
            )
        if response.code == 404:
            raise NotFound(f"{repo.host} has no {what}{detail}", code="not_in_registry")
        raise registry_error(f"registry {repo.host} answered {response.code} to {what}{detail}")

    async def _send(
        self,
        method: str,
        url: str,
        repo: Repository,
        scope: str,
        headers: Mapping[str, str] | None,
        body: Callable[[], Any] | None,
    ) -> IResponse:
        sent: dict[bytes | str, bytes | str] = {k: v for k, v in (headers or {}).items()}
        auth = repo.auth.get(scope) or repo.auth.get("")
        if auth and urlsplit(url).netloc == urlsplit(repo.base).netloc:
            sent["Authorization"] = auth
        sending = self._http.request(
            method, url, headers=sent, data=body() if body else None, unbuffered=True
        )
        try:
            if body is None:
                response = await answer(sending, f"registry {repo.host}", self.timeout)
            else:  # an upload is answered once all of it is sent, which takes as long as it takes
                response = await sending
        except (ConnectError, DNSLookupError, ResponseNeverReceived) as e:
            raise unreachable(f"registry {repo.host}", e) from None
        return response

    async def _authenticate(self, repo: Repository, scope: str, challenge: str) -> None:
        """Answer C{WWW-Authenticate}: fetch a Bearer token, or use basic credentials."""
        scheme, _, params_text = challenge.partition(" ")
        params = dict(_CHALLENGE_PARAM.findall(params_text))
        credential = await self._credentials.find(repo.host)
        basic = _basic(credential) if credential and not credential.token else None
        if scheme.lower() == "basic":
            if basic is None:
                raise Unauthorized(
                    f"registry {repo.host} wants a username and password; add"
                    f' [registry.auth."{repo.host}"] to tap.conf, or `mrunner login {repo.host}`'
                )
            repo.auth[""] = basic
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise Unauthorized(f"registry {repo.host} sent an unusable challenge {challenge!r}")
        query = {"service": params.get("service", ""), "scope": params.get("scope", scope)}
        realm = params["realm"]
        self._check_realm(repo, realm)
        token = await self._fetch_token(repo, realm, {k: v for k, v in query.items() if v}, credential, basic)
        repo.auth[scope] = b"Bearer " + token.encode("ascii")
        self.log.debug("token for {scope} at {host} from {realm}", scope=scope, host=repo.host, realm=realm)

    def _check_realm(self, repo: Repository, realm: str) -> None:
        """Refuse a token service that is not a URL, or is plain http on a host not in [registry] insecure."""
        try:
            realm_url = urlsplit(realm)
        except ValueError:  # an unclosed IPv6 bracket, say
            raise registry_error(
                f"registry {repo.host} names a token service {realm[:200]!r} that is not a URL"
            ) from None
        if not (
            realm_url.scheme == "https" or (realm_url.scheme == "http" and self._insecure(realm_url.netloc))
        ):
            raise registry_error(
                f"registry {repo.host} names the token service {realm[:200]!r}, which is neither https"
                " nor on a host in [registry] insecure; refusing to send a request there"
            )

    async def _fetch_token(
        self,
        repo: Repository,
        realm: str,
        query: dict[str, str],
        credential: Credential | None,
        basic: bytes | None,
    ) -> str:
        """A Bearer token from C{realm}: for an identity token by OAuth2's refresh, else by GET."""
        headers: dict[bytes | str, bytes | str] = {}
        if basic:
            headers["Authorization"] = basic
        if credential and credential.token:  # Docker's identity token: OAuth2's refresh token, POSTed
            form = {**query, "grant_type": "refresh_token", "refresh_token": credential.secret}
            sending = self._http.post(
                realm, data=form | {"client_id": "mrunner"}, allow_redirects=False, unbuffered=True
            )
        else:
            sending = self._http.get(
                _with_query(realm, query), headers=headers, allow_redirects=False, unbuffered=True
            )
        try:
            response = await answer(sending, f"token service {realm}", self.timeout)
            data = await read_limited(
                response, MAX_TOKEN_ANSWER, f"the answer of token service {realm}", self.timeout
            )
        except (ConnectError, DNSLookupError, ResponseNeverReceived) as e:
            raise unreachable(f"token service {realm}", e) from None
        if response.code in (401, 403):
            raise Unauthorized(f"token service {realm} refused the credentials for {repo.host}")
        try:
            value = json.loads(data)
            token = value.get("token") or value.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if response.code != 200 or not isinstance(token, str):
            raise registry_error(f"token service {realm} answered {response.code} without a token")
        if not _TOKEN.fullmatch(token):
            raise registry_error(
                f"token service {realm} answered a token that cannot be sent in a header (it must be"
                " visible ASCII, without spaces)"
            )
        return token

    # The v2 API

    async def manifest(self, repo: Repository, reference: str) -> bytes:
        """The manifest bytes for a tag or digest (at most 4 MiB)."""
        response = await self.request(
            "GET", repo, f"manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        return await read_limited(
            response, MAX_MANIFEST, f"the manifest of {repo.name} from {repo.host}", self.timeout
        )

    async def blob(self, repo: Repository, digest: str, offset: int = 0) -> IResponse:
        """The blob's body from C{offset}: 206 when the range was honoured, 200 for all of it."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        return await self.request("GET", repo, f"blobs/{digest}", headers=headers, expect=(200, 206, 416))

    async def has_blob(self, repo: Repository, digest: str) -> bool:
        response = await self.request("HEAD", repo, f"blobs/{digest}", actions="pull,push", expect=(200, 404))
        await discard(response, f"registry {repo.host}", self.timeout)
        return response.code == 200

    async def upload_blob(self, repo: Repository, digest: str, body: Callable[[], Any]) -> None:
        """Monolithic upload: POST for an upload URL, then PUT the bytes with their digest."""
        started = await self.request("POST", repo, "blobs/uploads/", actions="pull,push", expect=(202,))
        await discard(started, f"registry {repo.host}", self.timeout)
        location = started.headers.getRawHeaders(b"location", [b""])[0].decode("latin-1")
        if not location:
            raise registry_error(f"registry {repo.host} started an upload without a Location")
        url = _with_query(urljoin(repo.url("blobs/uploads/"), location), {"digest": digest})
        response = await self.request(
            "PUT",
            repo,
            url,
            actions="pull,push",
            headers={"Content-Type": "application/octet-stream"},
            body=body,
            expect=(201, 204),
        )
        await discard(response, f"registry {repo.host}", self.timeout)

    async def put_manifest(self, repo: Repository, reference: str, manifest: bytes, media_type: str) -> None:
        response = await self.request(
            "PUT",
            repo,
            f"manifests/{reference}",
            actions="pull,push",
            headers={"Content-Type": media_type},
            body=lambda: manifest,
            expect=(201, 200),
        )
        await discard(response, f"registry {repo.host}", self.timeout)


def _with_query(url: str, query: Mapping[str, str]) -> str:
    """C{url} with C{query} added to the query it may already have."""
    return url + ("&" if "?" in url else "?") + urlencode(query)


def _basic(credential: Credential) -> bytes:
    pair = f"{credential.username}:{credential.secret}".encode()
    return b"Basic " + base64.b64encode(pair)


async def _error_detail(response: IResponse, timeout: Timeout) -> str:
    """``: <message>`` from the registry's ``{"errors": [...]}`` body, if it has one."""
    try:
        value = json.loads(await read_limited(response, 64 * 1024, "error body", timeout))
        message = value["errors"][0]["message"]
    except Exception:  # any body at all: the status says enough
        return ""
    return f": {str(message)[:300]}"


def _reason(error: Exception) -> str:
    reasons = getattr(error, "reasons", None)
    reason = str(reasons[0].value) if reasons else str(error)
    return reason.rstrip(".") or type(error).__name__
