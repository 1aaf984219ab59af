"""The daemon's HTTP API as blocking calls, and the errors a person can act on.

Blocking calls serve a terminal program better than a reactor here: the chat
reads lines with C{input()} (line editing, history), and Ctrl-C arrives as
C{KeyboardInterrupt} wherever the program waits, which is how an answer is
stopped: closing the connection makes the daemon stop the generation.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import Any

from mrunner.address import advertised, home_of
from mrunner.cli.errors import START_HINT, CommandError, DaemonError

DEFAULT_HOST = "http://127.0.0.1:12434"


def find_host(explicit: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """C{--host}, else C{$MRUNNER_HOST}, else where the daemon of C{$MRUNNER_HOME} says it listens,
    else the default address, but only when nothing names a home.

    @raise CommandError: C{$MRUNNER_HOME} is set, or its C{run/daemon.json} names a daemon that is
        gone, and no daemon runs there: the default address may be another daemon with another
        store, which an C{rm} or C{unload} must not act on.
    """
    host = explicit or environ.get("MRUNNER_HOST")
    if host:
        return host
    home = home_of(environ)
    said = advertised(home)
    if said is not None:
        return str(said["url"])
    after = f"{START_HINT}, or point --host / MRUNNER_HOST at another daemon"
    if home.address.exists():
        raise CommandError(
            f"the mrunner daemon of {home.root} is not running (it was stopped or killed: the process"
            f" its {home.address.relative_to(home.root)} names has ended): {after}"
        )
    if environ.get("MRUNNER_HOME"):
        raise CommandError(f"no mrunner daemon is running for MRUNNER_HOME={home.root}: {after}")
    return DEFAULT_HOST


def model_path(name: str, action: str = "") -> str:
    """C{/models/NAME[/action]}: a name keeps its slashes, colons and C{@}."""
    return f"/models/{urllib.parse.quote(name, safe='/:@')}{action}"


class Daemon:
    """The daemon at C{host} (C{http://HOST:PORT}; a bare C{HOST:PORT} means http; C{unix:PATH} a socket).

    With C{api_key}, every request carries it as C{Authorization: Bearer KEY}; with C{cacert}, an
    C{https} daemon's certificate is checked against that file (a self-signed one, say) rather
    than the system's authorities (which C{SSL_CERT_FILE} also replaces).
    """

    def __init__(self, host: str, api_key: str | None = None, cacert: str | None = None) -> None:
        if host.startswith("unix:"):
            self.url = host
            self._base = "http://localhost"
            self._opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), _UNIXHandler(host[5:])
            )
        else:
            self.url = self._base = (host if "://" in host else f"http://{host}").rstrip("/")
            self._opener = urllib.request.build_opener(
                *([urllib.request.HTTPSHandler(context=_trusting(cacert))] if cacert else [])
            )
        self._api_key = api_key

    def open(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> http.client.HTTPResponse:
        """Send a request (C{body} as JSON, or raw C{data}); the open response, or a L{CommandError}."""
        headers = dict(headers or {})
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self._base + path, data, headers, method=method)
        try:
            response: http.client.HTTPResponse = self._opener.open(request)
        except urllib.error.HTTPError as e:
            with e:
                raise _refusal(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (http.client.HTTPException, OSError) as e:
            raise self._unreachable(e) from None
        return response

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """The decoded JSON answer to a request."""
        with self.open(method, path, body, **kw) as response:
            return json.loads(read(response) or b"null")

    def ndjson(self, method: str, path: str, body: Any = None) -> Iterator[dict[str, Any]]:
        """The JSON objects of a streamed NDJSON answer, as they arrive."""
        with self.open(method, path, body) as response:
            for line in lines(response):
                if line.strip():
                    yield _json_line(line)

    def has(self, path: str) -> bool:
        """Whether C{GET path} finds something (a 404 says no; other refusals are errors)."""
        try:
            self.call("GET", path)
        except DaemonError as e:
            if e.status == 404:
                return False
            raise
        return True

    def _unreachable(self, reason: object) -> CommandError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return CommandError(
                f"the mrunner daemon at {self.url} sent a certificate this client does not trust"
                f" ({reason.verify_message}): give its certificate (or the authority that signed it)"
                " with --cacert FILE, MRUNNER_CACERT=FILE or SSL_CERT_FILE=FILE"
            )
        if isinstance(reason, http.client.RemoteDisconnected) and self.url.startswith("http://"):
            return CommandError(
                f"the daemon at {self.url} hung up without an answer: if it listens with TLS (an ssl:"
                f" endpoint), its address is {self.url.replace('http://', 'https://', 1)}"
            )
        return CommandError(
            f"cannot reach the mrunner daemon at {self.url} ({reason}): {START_HINT},"
            " or point --host / MRUNNER_HOST at it"
        )


def _trusting(cacert: str) -> ssl.SSLContext:
    """A TLS context that trusts the certificates in the file C{cacert}, and no others."""
    try:
        return ssl.create_default_context(cafile=cacert)
    except (OSError, ssl.SSLError) as e:
        raise CommandError(f"cannot read the certificates in --cacert {cacert}: {e}") from None


def _json_line(line: bytes) -> dict[str, Any]:
    """One line of an NDJSON answer; a L{CommandError} (not a traceback) if it is not JSON."""
    try:
        value: dict[str, Any] = json.loads(line)
    except ValueError:
        text = line.decode(errors="replace").strip()
        raise CommandError(f"the daemon sent a line that is not JSON: {text[:200]!r}") from None
    return value


class _UNIXConnection(http.client.HTTPConnection):
    """HTTP over the UNIX socket at C{path} (a daemon listening on C{unix:PATH})."""

    def __init__(self, path: str, host: str, **kw: Any) -> None:
        super().__init__(host, **kw)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if isinstance(self.timeout, int | float):  # else urllib's "no timeout given" marker
            self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class _UNIXHandler(urllib.request.HTTPHandler):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_UNIXConnection, self._path), req)


def read(response: http.client.HTTPResponse) -> bytes:
    """The whole body; a L{CommandError} if the daemon hangs up first."""
    try:
        return response.read()
    except (http.client.HTTPException, OSError) as e:
        raise CommandError(f"the daemon closed the connection mid-answer: {e!r}") from None


def lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The body line by line as it arrives; a L{CommandError} if the daemon hangs up first."""
    while True:
        try:
            line = response.readline()
        except (http.client.HTTPException, OSError) as e:
            raise CommandError(f"the daemon closed the connection mid-answer: {e!r}") from None
        if not line:
            return
        yield line


def _refusal(status: int, body: bytes) -> DaemonError:
    """The daemon's OpenAI-shaped error C{{"error": {"message", "code"}}}, or its raw text."""
    try:
        error = json.loads(body)["error"]
        return DaemonError(status, str(error["message"]), error.get("code"))
    except (ValueError, KeyError, TypeError):
        text = body.decode(errors="replace").strip() or http.client.responses.get(status, "")
        return DaemonError(status, f"HTTP {status}: {text}", None)
