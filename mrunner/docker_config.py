"""Docker's client configuration (C{$DOCKER_CONFIG/config.json}, else C{~/.docker/config.json}), read as
Docker reads it, for the daemon's pulls and pushes and for C{mrunner login}.

For a registry, Docker asks C{credHelpers[registry]}, then C{credsStore}, then
C{auths[registry]}: a base64 C{auth} (``user:password``), or C{username} and
C{password}, or an C{identitytoken} (an OAuth2 refresh token for the registry's
token service). A helper is the program C{docker-credential-NAME}, which this
module names and shapes the messages for; running it is the caller's (the
daemon runs it on the reactor, the CLI as a plain subprocess) and gets only
L{helper_environment}. Secrets live in L{Credential}, whose repr hides them.

Everything here is read from files and programs anyone may have written, so it
is read as hostile: a name is checked before it names a program, JSON nested
too deeply is an error of its source (never a C{RecursionError}), and each
failure is a L{DockerConfigError} that names the source, for the caller to log
and go on to the next one.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import hyperlink

#: Docker keeps Docker Hub's credentials under its index's v1 address, not a host name.
HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")
HUB_KEY = f"https://{HUB_HOSTS[1]}/v1/"
#: What a helper's C{Username} says when its C{Secret} is an identity token.
TOKEN_USERNAME = "<token>"
#: How a helper says it has nothing for a registry: a miss, not a failure.
NOT_FOUND = "credentials not found"

#: A registry's host[:port], as Docker's reference grammar has it.
REGISTRY_HOST = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:.]+\])(?::[0-9]{1,5})?"
)
#: A helper's name: what follows C{docker-credential-}; never a path.
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
#: What a helper is given of its caller's environment: what Docker's own helpers read (pass and GPG,
#: the desktop keyrings over D-Bus, the cloud registries' SDKs), never the caller's other secrets
#: (C{HF_TOKEN}, a named key's C{key_env}).
HELPER_VARIABLES = frozenset(
    (
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM"),
        *("DOCKER_CONFIG", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME"),
        *("DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY"),
        *("GNUPGHOME", "GPG_TTY", "GPG_AGENT_INFO", "PASSWORD_STORE_DIR", "SSL_CERT_FILE", "SSL_CERT_DIR"),
        *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"),
    )
)
HELPER_PREFIXES = ("PASSWORD_STORE_", "AWS_", "AZURE_", "GOOGLE_", "CLOUDSDK_")


@attrs.frozen
class Credential:
    """A registry's credentials; C{token}: C{secret} is an identity (refresh) token, not a password."""

    username: str = attrs.field(repr=False)
    secret: str = attrs.field(repr=False)
    token: bool = False


class DockerConfigError(Exception):
    """config.json cannot be read or a helper's answer cannot be used; the message never holds a secret."""


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    directory = environ.get("DOCKER_CONFIG") or str(Path(environ.get("HOME", "~"), ".docker"))
    return Path(directory).expanduser() / "config.json"


def is_registry_host(host: str) -> bool:
    """Whether C{host} is a registry's host[:port] the HTTP client can address: IDNA labels (no IPv6
    literal), a port up to 65535."""
    if not REGISTRY_HOST.fullmatch(host):
        return False
    try:
        url = hyperlink.URL.from_text(f"https://{host}/").to_uri()
    except ValueError:
        return False
    return url.port is not None and 0 < url.port <= 65535


def _json(data: bytes, source: str) -> Any:
    """C{data} decoded; JSON that is not JSON, or nested too deep for the parser, is C{source}'s error."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        why = "it is nested too deeply" if isinstance(e, RecursionError) else "it is not JSON"
        raise DockerConfigError(f"{source} cannot be read: {why}") from None


def read(path: Path) -> dict[str, Any]:
    """The file's JSON object; an absent file is an empty one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise DockerConfigError(f"{path} cannot be read: {e.strerror or type(e).__name__}") from None
    value = _json(data, str(path))
    if not isinstance(value, dict):
        raise DockerConfigError(f"{path} is not a JSON object")
    return value


def server_key(host: str) -> str:
    """Where Docker files C{host}'s credentials, and what a helper is given: Hub's v1 address, or C{host}."""
    return HUB_KEY if host in HUB_HOSTS else host


def _host_of(key: str) -> str:
    """C{https://host:5000/v1/} or C{host:5000} as C{host:5000}, as Docker matches C{auths} keys."""
    if key == HUB_KEY:
        return HUB_HOSTS[1]
    return urlsplit(key if "://" in key else f"//{key}").netloc or key


def _entry(table: object, host: str) -> tuple[str, Any] | None:
    if not isinstance(table, dict):
        return None
    key = server_key(host)
    if key in table:
        return key, table[key]
    want = _host_of(key)
    return next(((k, v) for k, v in table.items() if _host_of(k) == want), None)


def helper_for(config: Mapping[str, Any], host: str) -> str | None:
    """The helper Docker asks for C{host}: its C{credHelpers} entry, else C{credsStore}; None for none.

    @raise DockerConfigError: the entry is not a helper's name (a path, say), so no program is run.
    """
    entry = _entry(config.get("credHelpers"), host)
    where = f"credHelpers[{entry[0]!r}]" if entry else "credsStore"
    name = entry[1] if entry else config.get("credsStore")
    if name is None or name == "":
        return None
    if not isinstance(name, str) or not _HELPER_NAME.fullmatch(name):
        raise DockerConfigError(
            f"{where} is {str(name)[:80]!r}, which is not a credential helper's name (letters, digits,"
            " '.', '_', '+', '-'; no path): no helper is run"
        )
    return name


def helper_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What of C{environ} a helper gets (L{HELPER_VARIABLES}, L{HELPER_PREFIXES}); C{PATH} keeps only its
    absolute directories, so a helper is never found relative to the working directory."""
    kept = {k: v for k, v in environ.items() if k in HELPER_VARIABLES or k.startswith(HELPER_PREFIXES)}
    if "PATH" in kept:
        kept["PATH"] = os.pathsep.join(d for d in kept["PATH"].split(os.pathsep) if os.path.isabs(d))
    return kept


def stored(config: Mapping[str, Any], host: str) -> Credential | None:
    """C{host}'s C{auths} entry, when it holds credentials (not just a helper's placeholder)."""
    found = _entry(config.get("auths"), host)
    entry = found[1] if found else None
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
        return Credential(str(entry.get("username") or ""), entry["identitytoken"], token=True)
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            username, colon, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise DockerConfigError(
                f"the auth of {found[0] if found else host} is not base64 of user:password"
            ) from None
        return Credential(username, password) if colon else None
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credential(entry["username"], entry["password"])
    return None


def program(helper: str) -> str:
    return f"docker-credential-{helper}"


def helper_answer(output: bytes) -> Credential:
    """A helper's C{get} answer: C{{"ServerURL", "Username", "Secret"}}."""
    value = _json(output, "its answer")
    try:
        username, secret = value["Username"], value["Secret"]
    except (KeyError, TypeError):
        raise DockerConfigError('its answer is not {"Username", "Secret"} JSON') from None
    if not isinstance(username, str) or not isinstance(secret, str):
        raise DockerConfigError("its answer's Username and Secret are not strings")
    if username == TOKEN_USERNAME:
        return Credential("", secret, token=True)
    return Credential(username, secret)


def helper_store_input(host: str, credential: Credential) -> bytes:
    """What C{docker-credential-NAME store} reads on its standard input."""
    username = TOKEN_USERNAME if credential.token else credential.username
    return json.dumps(
        {"ServerURL": server_key(host), "Username": username, "Secret": credential.secret}
    ).encode()


def is_miss(output: bytes) -> bool:
    """Whether a helper that failed said it has nothing for the registry."""
    return NOT_FOUND in output.decode("utf-8", "replace").lower()


def with_auth(config: dict[str, Any], host: str, credential: Credential | None) -> dict[str, Any]:
    """C{config} with C{host}'s C{auths} entry set as C{docker login} sets it (a helper's: no secret), or
    removed (C{credential} None), as C{docker logout} does."""
    auths = dict(config.get("auths") or {})
    found = _entry(auths, host)
    if found:
        del auths[found[0]]
    if credential is not None:
        pair = f"{credential.username}:{credential.secret}".encode()
        auths[server_key(host)] = {"auth": base64.b64encode(pair).decode()} if credential.secret else {}
    return {**config, "auths": auths}


def write(path: Path, config: Mapping[str, Any]) -> None:
    """Replace the file whole (a temporary file renamed), readable by its owner only, as Docker does."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        json.dump(config, f, indent="\t")
        f.write("\n")
    os.replace(temporary, path)
