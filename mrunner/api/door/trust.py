"""Who may call the daemon: the Host, Origin, API key and body-size rules of the front door.

Pure decisions over a request's line and headers, made before its body is
read; L{mrunner.api.door.site} applies them to connections. Each check raises the
refusal the client is told about, in the order DESIGN.md gives: Host, Origin,
key, then size. A L{Trust} is built once per configuration, so the checks on
the proxy path are set lookups and one cached Host parse.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Sequence
from functools import lru_cache
from urllib.parse import unquote_to_bytes

import attrs
from twisted.web.http_headers import Headers

from mrunner.api.door.callers import OPEN, Caller, key_caller
from mrunner.api.door.declared import AdminRules, Door, Who
from mrunner.config import Config
from mrunner.errors import BadRequest, Forbidden, PayloadTooLarge, Unauthorized
from mrunner.teams.members import KeyRing, Member

LOOPBACK_NAMES = frozenset({b"localhost", b"127.0.0.1", b"[::1]"})
READING = frozenset({b"GET", b"HEAD"})
_LISTEN_FIELDS = re.compile(r"(?<!\\):")


class Trust:
    """The front-door rules of one configuration; a new configuration builds a new one.

    C{door}: what the routes declare of themselves. Routes that manage models or control runners
    (C{door.admin}): with admin_api_keys set, only those keys reach them. Reading is not managing:
    any key may GET /models (the routes show it the models it may use) and /engines/usage (its
    own). A browser's navigation carries no key: the page's files (and / that sends a browser
    there) are open (C{door.open_paths}), and the page asks for a key when the API answers 401.
    """

    def __init__(self, config: Config, door: Door):
        http = config.http
        self.door = door
        self._admin = door.admin
        self.http = http
        hosts = {host_name(_lower_ascii(host)) for host in http.allowed_hosts}
        listening = listen_host(config.listen)
        if listening is not None:
            hosts.add(listening)
        self._hosts = LOOPBACK_NAMES | hosts
        self.host_allowed = lru_cache(maxsize=256)(self._host_allowed)
        self._any_origin = "*" in http.cors_origins
        self._origins = frozenset(_lower_ascii(o) for o in http.cors_origins if not o.endswith(":*"))
        self._origin_hosts = frozenset(_lower_ascii(o[:-2]) for o in http.cors_origins if o.endswith(":*"))
        # With api_keys alone, they reach every route; admin_api_keys alone guard only the admin
        # routes; with both, an admin key reaches every route too.
        keys = tuple(key.encode() for key in http.api_keys)
        admin = tuple(key.encode() for key in http.admin_api_keys)
        # Named keys ([keys."NAME"]) make a key needed on every route: anonymous ones still work.
        self._members = KeyRing(config.keys)
        self._open_metrics = config.cluster.open_metrics
        metrics = {door.metrics} if self._open_metrics and door.metrics is not None else set()
        self._open = door.open_paths | metrics
        self._keys = keys + admin if keys or self._members else ()
        self._admin_keys = admin or keys
        self._limits = door.limits(http)
        self._default_limit = config.max_request_bytes
        self._smallest_limit = min([self._default_limit, *self._limits.values()])

    def origin(self, headers: Headers, via_socket: bool) -> bytes | None:
        """The request's allowed C{Origin}, None when it sends none; raises a refused Host or Origin.

        A UNIX socket is no browser's target, so its requests skip the Host check.
        """
        if not via_socket:
            self._check_host(headers.getRawHeaders(b"host"))
        return self._check_origin(headers.getRawHeaders(b"origin"))

    def check_key(self, method: bytes, target: bytes, headers: Headers, origin: bytes | None) -> Caller:
        """Who sent the request; raise unless it carries a key that reaches C{target}, if keys are on.

        A browser's preflight never carries a key, so it needs none. A named key's
        caller carries its rules (L{Member}), which L{mrunner.teams.admission} applies.
        """
        if not self._admin_keys and not self._members:
            return OPEN
        presented = presented_key(headers)
        member = self._members.find(presented)
        preflight = origin is not None and method == b"OPTIONS"
        if member is not None:
            if not preflight:
                _check_member(method, route_path(target), member, self._open, self._admin)
            return key_caller(presented, member.admin, member)
        path = route_path(target)
        if not preflight:
            self._check_key(method, path, presented)
        found = key_caller(presented, presented is not None and _matches(presented, self._admin_keys))
        if self._open_metrics and path.rstrip(b"/") == self.door.metrics and not self._valid(presented):
            return attrs.evolve(found, load_signals_only=True)
        return found

    def _valid(self, presented: bytes | None) -> bool:
        return presented is not None and _matches(presented, self._keys + self._admin_keys)

    def body_limit(self, target: bytes, length: int | None) -> int:
        """The most bytes the body of a request to C{target} may carry; raises when C{length} is over it."""
        if length is not None and length <= self._smallest_limit:
            return self._smallest_limit
        path = route_path(target)
        limit = self._limits.get(path.rstrip(b"/")) or self._limits.get(
            backends(path.rstrip(b"/")), self._default_limit
        )
        if length is not None and length > limit:
            where = path.decode(errors="replace")
            raise PayloadTooLarge(f"request body is {length} bytes; {where} takes at most {limit}")
        return limit

    def _check_host(self, hosts: Sequence[bytes] | None) -> None:
        if hosts is None or len(hosts) != 1:
            raise BadRequest("the request must carry exactly one Host header", code="bad_host")
        if not self.host_allowed(hosts[0]):
            raise Forbidden(
                f"Host {hosts[0].decode(errors='replace')!r} is not served here: mrunner answers loopback"
                " names and its listen address (a guard against DNS rebinding); add the name to"
                " [http] allowed_hosts to serve it",
                code="host_not_allowed",
            )

    def _host_allowed(self, host: bytes) -> bool:
        name = host_name(host.lower())
        if name in self._hosts:
            return True
        try:
            return ipaddress.ip_address(name.strip(b"[]").decode()).is_loopback
        except (ValueError, UnicodeDecodeError):
            return False

    def _check_origin(self, origins: Sequence[bytes] | None) -> bytes | None:
        if origins is None:
            return None
        origin = origins[0]
        if len(origins) == 1 and (self._any_origin or self._origin_allowed(origin.lower())):
            return origin
        raise Forbidden(
            f"Origin {origin.decode(errors='replace')!r} may not use mrunner; add it to"
            " [http] cors_origins or MRUNNER_ORIGINS to allow its pages",
            code="origin_not_allowed",
        )

    def _origin_allowed(self, origin: bytes) -> bool:
        if origin in self._origins:
            return True
        host, colon, port = origin.rpartition(b":")
        return bool(colon) and port.isdigit() and host in self._origin_hosts

    def _check_key(self, method: bytes, path: bytes, presented: bytes | None) -> None:
        if path.rstrip(b"/") in self._open:
            return
        admin = is_admin(method, path, self._admin)
        keys = self._admin_keys if admin else self._keys
        if not keys and not self._members:
            return
        if presented is None:
            raise Unauthorized(
                "this mrunner requires an API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
            )
        if not _matches(presented, keys):
            if admin and _matches(presented, self._keys):
                raise Forbidden(
                    "this route manages models or runners: it takes only a key from [http] admin_api_keys",
                    code="admin_key_required",
                )
            raise Unauthorized("the API key is not valid for this mrunner")


def _check_member(
    method: bytes, path: bytes, member: Member, open_paths: frozenset[bytes], admin: AdminRules
) -> None:
    if not member.admin and path.rstrip(b"/") not in open_paths and is_admin(method, path, admin):
        raise Forbidden(
            f"this route manages models or runners: key {member.name!r} is not an admin key"
            " (admin = true in its [keys] table)",
            code="admin_key_required",
        )


def presented_key(headers: Headers) -> bytes | None:
    """The key a client sends the way OpenAI's (C{Bearer}) or Anthropic's (C{x-api-key}) clients do."""
    authorization = headers.getRawHeaders(b"authorization")
    if authorization:
        scheme, _, credentials = authorization[0].partition(b" ")
        if scheme.lower() == b"bearer" and credentials.strip():
            return credentials.strip()
    api_key = headers.getRawHeaders(b"x-api-key")
    return api_key[0].strip() if api_key else None


def _matches(presented: bytes, keys: tuple[bytes, ...]) -> bool:
    """Compare against every key, each in constant time, so timing tells nothing about which matched."""
    return any([hmac.compare_digest(presented, key) for key in keys])


def host_name(host: bytes) -> bytes:
    """C{host} without its port: C{localhost:80} is C{localhost}, C{[::1]:80} is C{[::1]}."""
    if host.startswith(b"["):
        return host[: host.index(b"]") + 1] if b"]" in host else host
    name, colon, _ = host.rpartition(b":")
    return name if colon and b":" not in name else host


def route_path(target: bytes) -> bytes:
    """The path the router sees for a request target: no query, percent-decoded."""
    return unquote_to_bytes(target.partition(b"?")[0])


def backends(path: bytes) -> bytes:
    """C{path} as a route declares it for any backend: C{/engines/NAME/...} is C{/engines/<backend>/...}."""
    if not path.startswith(b"/engines/"):
        return path
    segments = path.split(b"/")
    return b"/".join([*segments[:2], b"<backend>", *segments[3:]])


def is_admin(method: bytes, path: bytes, admin: AdminRules) -> bool:
    """Whether C{method} on C{path} manages models or controls runners (C{/models/*} but its reading,
    C{/logs}, unload, configure), as C{admin} has the routes declare it."""
    segments = path.strip(b"/").split(b"/")
    first = segments[0]
    area = admin.areas.get(first)
    if area is not None:
        return area is Who.ADMIN or method not in READING
    if first == b"engines":
        return not admin.engines.isdisjoint(segments[1:3])
    return first == b"api" and len(segments) > 1 and segments[1] in admin.ollama


def listen_host(listen: str) -> bytes | None:
    """The C{Host} a client names the daemon by when it listens on one address, as C{interface=}."""
    for field in _LISTEN_FIELDS.split(listen):
        if field.startswith("interface="):
            address = field.removeprefix("interface=").replace("\\:", ":")
            if address in ("", "0.0.0.0", "::"):
                return None
            return (f"[{address}]" if ":" in address else address).lower().encode()
    return None


def beyond_loopback(listen: str) -> bool:
    """Whether C{listen} is a TCP or TLS port that other machines may reach."""
    kind = listen.partition(":")[0]
    if kind not in ("tcp", "tcp6", "ssl"):
        return False
    host = listen_host(listen)
    if host is None:
        return True  # all interfaces
    try:
        return not ipaddress.ip_address(host.strip(b"[]").decode()).is_loopback
    except ValueError:
        return host != b"localhost"


def _lower_ascii(text: str) -> bytes:
    return text.lower().encode("ascii", errors="replace")
