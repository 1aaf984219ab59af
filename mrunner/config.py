"""The daemon's configuration: built-in defaults < TOML file < command line < MRUNNER_* variables.

Every key is documented in the top-level ``tap.conf``; this module only reads them.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mrunner import durations
from mrunner.errors import BadRequest
from mrunner.store.names import DIGEST, SHORT_ID, parse

DEFAULT_LISTEN = "tcp:12434:interface=127.0.0.1"
DEFAULT_BACKEND = "llama.cpp"
# Top-level keys the environment sets over the file (and under the command line).
ENVIRONMENT = {"home": "MRUNNER_HOME", "listen": "MRUNNER_LISTEN"}

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[kmgt]i?)?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    prefix + suffix: (1024 if "i" in suffix else 1000) ** power
    for power, prefix in enumerate(("", "k", "m", "g", "t"))
    for suffix in (("", "b") if not prefix else ("", "b", "ib", "i"))
}
AUTO_MEMORY_SHARE = 0.8
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def parse_duration(value: object, key: str = "duration") -> float:
    """Seconds from ``30``, ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``; ``-1`` means never."""
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value))
            if match is None:
                raise ValueError
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if not math.isfinite(seconds):
            raise ValueError
    except (ValueError, OverflowError):
        raise ConfigError(f"{key}: expected a duration like '30s', '5m' or -1, got {value!r:.80}") from None
    return seconds


def parse_keep_alive(value: object, key: str = "keep_alive") -> float:
    """A keep-alive duration: negatives and anything past a year mean for ever (-1)."""
    return durations.keep_alive(parse_duration(value, key))


def parse_instances(value: object, key: str = "instances") -> int:
    """A count of runners: a positive integer."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
    return value


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from ``1073741824``, ``"512MiB"``, ``"8GiB"``, ``"2GB"``, or ``"60%"`` of RAM.

    ``"auto"`` is 80% of RAM; 0 is none.
    """
    if value == "auto":
        return int(physical_memory() * AUTO_MEMORY_SHARE)
    percent = _PERCENT.match(str(value))
    if percent is not None and 0 < float(percent.group(1)) <= 100:
        return int(physical_memory() * float(percent.group(1)) / 100)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(str(value))
    if match is None or isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like '8GiB', '80%', 'auto' or 0, got {value!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _duration(default: float) -> Any:
    return attrs.field(default=default, metadata={"parse": parse_duration})


@attrs.frozen
class SchedulerConfig:
    max_runners: int = 4
    max_queue: int = 512
    parallel: int = 4
    keep_alive: float = attrs.field(default=300.0, metadata={"parse": parse_keep_alive})
    load_timeout: float = _duration(600.0)
    stop_grace: float = _duration(10.0)
    install_wait: float = _duration(5.0)
    memory_budget: int = attrs.field(factory=lambda: parse_size("auto"), metadata={"parse": parse_size})
    starvation_seconds: float = _duration(60.0)


@attrs.frozen
class RunnerConfig:
    context_size: int | None = None
    threads: int = 0
    log_max_bytes: int = attrs.field(default=10_000_000, metadata={"parse": parse_size})
    log_keep: int = 3


@attrs.frozen
class ModelConfig:
    """``[models."NAME"]``: what that model's runners start with; None keeps the default."""

    context_size: int | None = None
    keep_alive: float | None = attrs.field(default=None, metadata={"parse": parse_duration})
    pinned: bool = False
    #: Runners of the model at most: another starts when all are busy and it fits beside them.
    instances: int = attrs.field(default=1, metadata={"parse": parse_instances})


@attrs.frozen
class ModelsConfig:
    """``[models]``: models to load at start, in order, and per-model settings by normalised name."""

    preload: tuple[str, ...] = ()
    settings: Mapping[str, ModelConfig] = attrs.field(factory=dict)


@attrs.frozen
class RegistryConfig:
    default: str = "index.docker.io"
    insecure: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
    mirrors: Mapping[str, str] = attrs.field(factory=dict)
    auth: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    max_pulls: int = 2


# Browser pages on this machine: an entry ending in ":*" allows any port.
LOCAL_ORIGINS = (
    "http://localhost",
    "http://localhost:*",
    "http://127.0.0.1",
    "http://127.0.0.1:*",
    "http://[::1]",
    "http://[::1]:*",
)


def _secret() -> Any:
    """A list of keys, kept out of every repr (and so out of every log line)."""
    return attrs.field(default=(), repr=False)


def one_of(*choices: str) -> Callable[[object, str], str]:
    """The parser of a key that takes one of C{choices}."""

    def parse(value: object, key: str) -> str:
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


@attrs.frozen
class HTTPConfig:
    """The front door: who may call, from which page, and what a connection may cost."""

    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = LOCAL_ORIGINS
    api_keys: tuple[str, ...] = _secret()
    admin_api_keys: tuple[str, ...] = _secret()
    max_load_bytes: int = attrs.field(default=64 * 2**30, metadata={"parse": parse_size})
    max_connections: int = 512
    max_followers: int = 64
    header_timeout: float = _duration(10.0)
    min_body_rate: int = attrs.field(default=1024, metadata={"parse": parse_size})
    idle_timeout: float = _duration(60.0)
    drain_timeout: float = _duration(30.0)
    head_parser: str = attrs.field(default="httptools", metadata={"parse": one_of("httptools", "twisted")})


@attrs.frozen
class HuggingFaceConfig:
    """Where ``hf.co/...`` pulls go; C{HF_ENDPOINT} and C{HF_TOKEN} override it. The token is never shown."""

    endpoint: str = "https://huggingface.co"
    token: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class StoreConfig:
    partial_max_age: float = _duration(7 * 24 * 3600.0)
    read_timeout: float = _duration(60.0)


@attrs.frozen
class ResponsesConfig:
    """The Responses API's store of responses (memory only)."""

    ttl: float = _duration(3600.0)
    max_count: int = 1000
    max_bytes: int = attrs.field(default=64 * 1024 * 1024, metadata={"parse": parse_size})


@attrs.frozen
class RecordsConfig:
    """``[records]``: the request records C{GET /engines/requests} shows."""

    enabled: bool = True
    per_model: int = 50
    max_bytes: int = attrs.field(default=32 * 1024 * 1024, metadata={"parse": parse_size})
    max_body: int = attrs.field(default=256 * 1024, metadata={"parse": parse_size})


@attrs.frozen
class LogConfig:
    """``[log]``: how the daemon writes its own log (logs/daemon.log)."""

    format: str = attrs.field(default="text", metadata={"parse": one_of("text", "json")})


def parse_gpu_devices(value: object, key: str) -> str | tuple[str, ...]:
    """``"auto"`` (every GPU the build lists), ``"none"`` (the CPU only), or a list of ids (``["CUDA0"]``)."""
    if value in ("auto", "none"):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(item, str) and item for item in value):
        return tuple(value)
    raise ConfigError(f"{key}: expected 'auto', 'none' or a list of device ids like ['CUDA0'], got {value!r}")


def parse_device_budget(value: object, key: str) -> int | float:
    """A share of each device's memory (``"90%"``, as a float 0.9) or bytes (``"20GiB"``, an int)."""
    percent = _PERCENT.match(str(value))
    if percent is not None and 0 < float(percent.group(1)) <= 100 and not isinstance(value, bool):
        return float(percent.group(1)) / 100
    if value == "auto":
        raise ConfigError(f"{key}: expected a size like '20GiB' or a share like '90%', got 'auto'")
    return parse_size(value, key)


@attrs.frozen
class GPUConfig:
    """``[gpu]``: which GPUs runners may use, and how much of each (default 90% of its memory)."""

    devices: str | tuple[str, ...] = attrs.field(default="auto", metadata={"parse": parse_gpu_devices})
    memory_budget: int | float = attrs.field(default=0.9, metadata={"parse": parse_device_budget})


PRIORITIES = ("high", "normal", "low")


def _limit(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{key}: expected a whole number, 0 for no limit, got {value!r}")
    return value


def _text(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string")
    return value.strip()


def _limit_field() -> Any:
    return attrs.field(default=0, metadata={"parse": _limit})


@attrs.frozen
class KeyConfig:
    """``[keys."NAME"]``: a named key, what it may use and how much (0: no limit); the key is never shown.

    The key comes from C{key}, else the file C{key_file}, else the environment variable C{key_env}.
    """

    key: str | None = attrs.field(default=None, repr=False, metadata={"parse": _text})
    key_file: str | None = attrs.field(default=None, metadata={"parse": _text})
    key_env: str | None = attrs.field(default=None, metadata={"parse": _text})
    models: tuple[str, ...] = ()
    admin: bool = False
    requests_per_minute: int = _limit_field()
    tokens_per_minute: int = _limit_field()
    tokens_per_day: int = _limit_field()
    max_concurrent: int = _limit_field()
    priority: str = attrs.field(default="normal", metadata={"parse": one_of(*PRIORITIES)})


@attrs.frozen
class ClusterConfig:
    """``[cluster]``: how the node shows itself to a router in front of several daemons."""

    metric_names: bool = True
    #: /metrics without a key, for a router's scraper that cannot send one (the endpoint picker).
    open_metrics: bool = False


@attrs.frozen
class Config:
    listen: str = DEFAULT_LISTEN
    home: Path = attrs.field(factory=lambda: Path("~/.mrunner").expanduser())
    default_backend: str = DEFAULT_BACKEND
    max_request_bytes: int = 10 * 1024 * 1024
    scheduler: SchedulerConfig = SchedulerConfig()
    runner: RunnerConfig = RunnerConfig()
    registry: RegistryConfig = RegistryConfig()
    http: HTTPConfig = HTTPConfig()
    store: StoreConfig = StoreConfig()
    huggingface: HuggingFaceConfig = HuggingFaceConfig()
    responses: ResponsesConfig = ResponsesConfig()
    backends: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    models: ModelsConfig = ModelsConfig()
    records: RecordsConfig = RecordsConfig()
    log: LogConfig = LogConfig()
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    gpu: GPUConfig = GPUConfig()
    keys: Mapping[str, KeyConfig] = attrs.field(factory=dict, repr=False)
    cluster: ClusterConfig = ClusterConfig()
    source: Path | None = attrs.field(default=None, eq=False)  # the file read, logged at start
    unread: tuple[Path, ...] = attrs.field(default=(), eq=False)  # other tap.conf files, not read

    def backend(self, name: str) -> Mapping[str, Any]:
        """The ``[backends."name"]`` table, empty when absent."""
        return self.backends.get(name, {})


def _section(cls: type, table: Mapping[str, Any], where: str) -> Any:
    known = {field.name: field for field in attrs.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}")
        default = known[key].default
        parse = known[key].metadata.get("parse")
        if parse is not None:
            value = parse(value, f"{where}.{key}")
        elif isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ConfigError(f"{where}.{key}: expected a list of strings, got a {type(value).__name__}")
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
        elif isinstance(default, int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
        elif key == "context_size" and value is not None and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{where}.{key}: expected a positive integer, got {value!r}")
        values[key] = value
    return cls(**values)


def load(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read the config file (``path``, else ./tap.conf, else the home's tap.conf) and apply overrides.

    C{overrides} are the command line's options: they win over C{MRUNNER_HOME} and
    C{MRUNNER_LISTEN}, which win over the file (a variable set long ago must not silently beat
    the C{--home} typed now), and the home so chosen is where its tap.conf is looked for.
    Without C{path}, the other file of the two, when it exists, is not read: C{unread} names
    it, for the log at start.
    """
    options = {k: v for k, v in (overrides or {}).items() if v is not None}
    environment = {key: environ[name] for key, name in ENVIRONMENT.items() if name in environ}
    home = Path(options.get("home") or environment.get("home") or "~/.mrunner").expanduser()
    found = [Path("tap.conf"), home / "tap.conf"]
    if path and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist")
    candidates = [Path(path)] if path else found
    table: dict[str, Any] = {}
    source = None
    for candidate in candidates:
        if candidate.is_file():
            with candidate.open("rb") as f:
                try:
                    table = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    raise ConfigError(f"{candidate}: {e}") from None
                _check_commands(candidate.absolute(), os.fstat(f.fileno()), table)
            source = candidate.absolute()
            break
    unread = tuple(
        dict.fromkeys(p.absolute() for p in found if p.is_file() and not _same(p.absolute(), source))
    )
    if path:
        unread = ()  # chosen with --config: the others are not read on purpose
    table.update(environment)
    table.update(options)
    return _with_environment(attrs.evolve(_config(table), source=source, unread=unread), environ)


def _same(a: Path, b: Path | None) -> bool:
    try:
        return b is not None and a.samefile(b)
    except OSError:
        return False


def _check_commands(path: Path, stat: os.stat_result, table: Mapping[str, Any]) -> None:
    """Refuse C{[backends.X] command} (a program the daemon runs) from a file another user could have written.

    ./tap.conf is read from wherever the daemon starts, so its owner and mode are what vouch for it.
    """
    backends = table.get("backends")
    commands = (
        [name for name, t in backends.items() if isinstance(t, dict) and "command" in t]
        if isinstance(backends, dict)
        else []
    )
    if not commands:
        return
    why = None
    if stat.st_uid != os.getuid():
        why = f"it is owned by uid {stat.st_uid}, not by this user ({os.getuid()})"
    elif stat.st_mode & 0o002:
        why = "other users can write it"
    if why:
        raise ConfigError(
            f"{path}: refusing [backends.{commands[0]}] command, a program mrunner would run, because {why};"
            f" fix it with chown/chmod o-w, or remove the command"
        )


def _with_environment(config: Config, environ: Mapping[str, str]) -> Config:
    """C{MRUNNER_API_KEY} adds a key, C{MRUNNER_ORIGINS} (comma-separated) adds origins."""
    http = config.http
    if environ.get("MRUNNER_API_KEY"):
        http = attrs.evolve(http, api_keys=(*http.api_keys, environ["MRUNNER_API_KEY"]))
    origins = [origin.strip() for origin in environ.get("MRUNNER_ORIGINS", "").split(",")]
    if any(origins):
        http = attrs.evolve(http, cors_origins=(*http.cors_origins, *filter(None, origins)))
    return attrs.evolve(config, http=http, keys=_keys_with_secrets(config.keys, environ, http))


def _keys_with_secrets(
    keys: Mapping[str, KeyConfig], environ: Mapping[str, str], http: HTTPConfig
) -> dict[str, KeyConfig]:
    """Each named key with its C{key} read from C{key_file} or C{key_env} when it names one there.

    A key is in one place only: the front door finds a named key first, so one also in
    C{[http] admin_api_keys} (or C{api_keys}) would quietly take that key's rights away.
    """
    resolved: dict[str, KeyConfig] = {}
    for name, entry in keys.items():
        secret = _secret_of(name, entry, environ)
        if any(other.key == secret for other in resolved.values()):
            raise ConfigError(f"keys.{name}: its key is another named key's too; give each its own")
        for listed, where in (
            (http.admin_api_keys, "[http] admin_api_keys (admin = true makes a named key an admin)"),
            (http.api_keys, "[http] api_keys (or MRUNNER_API_KEY)"),
        ):
            if secret in listed:
                raise ConfigError(
                    f"keys.{name}: its key is also in {where}; a key is named or listed, not both:"
                    " remove it from one, or give each its own"
                )
        resolved[name] = attrs.evolve(entry, key=secret)
    return resolved


def _secret_of(name: str, entry: KeyConfig, environ: Mapping[str, str]) -> str:
    """The key of C{[keys."NAME"]}: C{key}, else C{key_file}'s content, else C{key_env}'s value."""
    if entry.key is not None:
        return entry.key
    if entry.key_file is not None:
        secret = _read_key_file(name, entry.key_file)
        if not secret:
            raise ConfigError(f"keys.{name}.key_file: {entry.key_file} is empty; write the key in it")
        return secret
    if entry.key_env is not None:
        secret = environ.get(entry.key_env, "").strip()
        if not secret:
            state = "empty" if entry.key_env in environ else "not set"
            raise ConfigError(
                f"keys.{name}: key_env {entry.key_env} is {state}; set it in the daemon's environment"
                " (or give the key as key or key_file)"
            )
        return secret
    raise ConfigError(f"keys.{name}: give the key as key, key_file or key_env")


def _read_key_file(name: str, key_file: str) -> str:
    """The key in C{key_file}; refused when users outside its owner and group may read or write it.

    Read from the descriptor whose mode was checked, so the file checked is the file read.
    """
    try:
        with Path(key_file).expanduser().open() as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & 0o006:
                raise ConfigError(
                    f"keys.{name}.key_file: {key_file} has mode {mode & 0o777:04o}: other users can"
                    f" {'read' if mode & 0o004 else 'write'} it; chmod 600 it (or 640 for a group)"
                )
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"keys.{name}.key_file: cannot read {key_file}: {getattr(e, 'strerror', e)}") from e


def _config(table: Mapping[str, Any]) -> Config:
    top = dict(table)
    sections = {
        "scheduler": SchedulerConfig,
        "runner": RunnerConfig,
        "registry": RegistryConfig,
        "records": RecordsConfig,
        "log": LogConfig,
        "http": HTTPConfig,
        "store": StoreConfig,
        "huggingface": HuggingFaceConfig,
        "responses": ResponsesConfig,
        "gpu": GPUConfig,
        "cluster": ClusterConfig,
    }
    values: dict[str, Any] = {name: _section(cls, top.pop(name, {}), name) for name, cls in sections.items()}
    values["backends"] = top.pop("backends", {})
    values["models"] = _models(top.pop("models", {}))
    values["aliases"] = _aliases(top.pop("aliases", {}))
    values["keys"] = _keys(top.pop("keys", {}))
    if "home" in top:
        values["home"] = Path(str(top.pop("home"))).expanduser()
    scalars = _section(_Scalars, top, "tap.conf")
    values.update(attrs.asdict(scalars))
    return Config(**values)


@attrs.frozen
class _Scalars:
    listen: str = DEFAULT_LISTEN
    default_backend: str = DEFAULT_BACKEND
    max_request_bytes: int = 10 * 1024 * 1024


def _models(table: Mapping[str, Any]) -> ModelsConfig:
    """``[models]``: ``preload`` is a list of names; every sub-table is one model's settings."""

    def name(text: object, key: str) -> str:
        try:
            return str(parse(text))
        except BadRequest as e:
            raise ConfigError(f"{key}: {e.message}") from None

    preload = table.get("preload", [])
    if not isinstance(preload, list):
        raise ConfigError(f"models.preload: expected a list of model names, got {preload!r}")
    settings = {}
    for key, value in table.items():
        if key == "preload":
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f'models.{key}: expected a table of settings ([models."{key}"]) or preload')
        settings[name(key, f"models.{key}")] = _section(ModelConfig, value, f"models.{key}")
    return ModelsConfig(tuple(name(item, "models.preload") for item in preload), settings)


def _aliases(table: object) -> dict[str, str]:
    """``[aliases]``: ``"gpt-4o-mini" = "ai/smollm2"``; an alias is a valid model name, one per
    normalised name; its target a model name (normalised), digest or id (kept, as the store reads
    them), never another alias."""
    if not isinstance(table, Mapping):
        raise ConfigError(
            f'aliases: expected a table of names ("gpt-4o-mini" = "ai/smollm2"), got {table!r:.80}'
        )
    aliases: dict[str, str] = {}
    spelled: dict[str, str] = {}  # normalised name: the alias as written
    for alias, target in table.items():
        try:
            normal = str(parse(alias, "alias"))
            aliases[alias] = _alias_target(target)
        except BadRequest as e:
            raise ConfigError(f"aliases.{alias}: {e.message}") from None
        if normal in spelled:
            raise ConfigError(
                f"aliases.{alias}: {alias!r} and {spelled[normal]!r} are one name ({normal}); keep one"
            )
        spelled[normal] = alias
    for alias, target in aliases.items():
        if target in spelled:
            raise ConfigError(f"aliases.{alias}: {target} is itself an alias; name a stored model")
    return aliases


def _alias_target(target: object) -> str:
    """What an alias stands for: a model's digest or id as given, else its normalised name.

    A digest or id normalised as a name would be a repository no store has (C{ai/sha256:...}).
    """
    if not isinstance(target, str):
        raise BadRequest(f"expected a model name, digest or id, got {target!r:.80}")
    if DIGEST.fullmatch(target) or SHORT_ID.fullmatch(target):
        return target
    if target.startswith("sha256:"):
        raise BadRequest(f"digest {target!r:.80} is not sha256: followed by 64 lowercase hex digits")
    return str(parse(target, "model name"))


#: A name usage and metrics give requests that no named key made.
ANONYMOUS = "anonymous"


def _keys(table: object) -> dict[str, KeyConfig]:
    """``[keys."NAME"]``: named keys; their secrets are found by L{_keys_with_secrets}."""
    if not isinstance(table, Mapping):
        raise ConfigError('keys: expected tables of named keys ([keys."alice"])')
    keys = {}
    for name, value in table.items():
        if not isinstance(value, Mapping):
            raise ConfigError(f'keys.{name}: expected a table ([keys."{name}"] with key = "...")')
        if name == ANONYMOUS or not re.fullmatch(r"[\w.@-]{1,64}", name):
            raise ConfigError(
                f"keys.{name}: a key's name is 1-64 letters, digits, '_', '.', '@' or '-', not {ANONYMOUS!r}"
            )
        keys[name] = _section(KeyConfig, value, f"keys.{name}")
    return keys
