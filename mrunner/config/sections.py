"""The typed settings: one frozen class per ``tap.conf`` section, with its documented defaults."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mrunner.config.values import (
    PRIORITIES,
    duration,
    folder,
    limit_field,
    one_of,
    parse_device_budget,
    parse_duration,
    parse_factor,
    parse_gpu_devices,
    parse_instances,
    parse_keep_alive,
    parse_size,
    parse_wait,
    secret,
    text,
)

DEFAULT_LISTEN = "tcp:12434:interface=127.0.0.1"
DEFAULT_BACKEND = "llama.cpp"
#: A name usage and metrics give requests that no named key made.
ANONYMOUS = "anonymous"


@attrs.frozen
class SchedulerConfig:
    max_runners: int = 4
    max_queue: int = 512
    parallel: int = 4
    keep_alive: float = attrs.field(default=300.0, metadata={"parse": parse_keep_alive})
    load_timeout: float = duration(600.0)
    stop_grace: float = duration(10.0)
    install_wait: float = duration(5.0)
    memory_budget: int = attrs.field(factory=lambda: parse_size("auto"), metadata={"parse": parse_size})
    starvation_seconds: float = duration(60.0)
    #: How waiters for different models share the runners (L{mrunner.scheduling.patience}).
    order: str = attrs.field(default="loaded", metadata={"parse": one_of("loaded", "fifo")})
    max_wait: float = attrs.field(default=15.0, metadata={"parse": parse_wait})
    min_serve: float = attrs.field(default=1.0, metadata={"parse": parse_factor})


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
    #: Its saved prompt states serve every key's requests, not only the key's that made them
    #: (a runner started after a reload takes a change).
    share_cache: bool = False


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
    #: Where ``ollama.com/...`` and ``registry.ollama.ai/...`` pulls go: a host, or a URL.
    ollama: str = "registry.ollama.ai"


# Browser pages on this machine: an entry ending in ":*" allows any port.
LOCAL_ORIGINS = (
    "http://localhost",
    "http://localhost:*",
    "http://127.0.0.1",
    "http://127.0.0.1:*",
    "http://[::1]",
    "http://[::1]:*",
)


@attrs.frozen
class HTTPConfig:
    """The front door: who may call, from which page, and what a connection may cost."""

    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = LOCAL_ORIGINS
    api_keys: tuple[str, ...] = secret()
    admin_api_keys: tuple[str, ...] = secret()
    max_load_bytes: int = attrs.field(default=64 * 2**30, metadata={"parse": parse_size})
    max_connections: int = 512
    max_followers: int = 64
    header_timeout: float = duration(10.0)
    min_body_rate: int = attrs.field(default=1024, metadata={"parse": parse_size})
    idle_timeout: float = duration(60.0)
    drain_timeout: float = duration(30.0)
    head_parser: str = attrs.field(default="httptools", metadata={"parse": one_of("httptools", "twisted")})
    relay: str = attrs.field(default="fast", metadata={"parse": one_of("fast", "twisted")})


@attrs.frozen
class HuggingFaceConfig:
    """Where ``hf.co/...`` pulls go; C{HF_ENDPOINT} and C{HF_TOKEN} override it. The token is never shown."""

    endpoint: str = "https://huggingface.co"
    token: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class SourcesConfig:
    """``[sources]``: where other tools keep the models mrunner finds and imports without a copy.

    None: the tool's own variable (C{OLLAMA_MODELS}, C{HF_HUB_CACHE} or C{HF_HOME}, C{LLAMA_CACHE}), else
    its default folder; C{""} turns that source off.
    """

    ollama: str | None = attrs.field(default=None, metadata={"parse": folder})
    huggingface: str | None = attrs.field(default=None, metadata={"parse": folder})
    lmstudio: str | None = attrs.field(default=None, metadata={"parse": folder})
    llamacpp: str | None = attrs.field(default=None, metadata={"parse": folder})


@attrs.frozen
class StoreConfig:
    partial_max_age: float = duration(7 * 24 * 3600.0)
    read_timeout: float = duration(60.0)


@attrs.frozen
class ResponsesConfig:
    """The Responses API's store of responses (memory only)."""

    ttl: float = duration(3600.0)
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


@attrs.frozen
class GPUConfig:
    """``[gpu]``: which GPUs runners may use, and how much of each (default 90% of its memory)."""

    devices: str | tuple[str, ...] = attrs.field(default="auto", metadata={"parse": parse_gpu_devices})
    memory_budget: int | float = attrs.field(default=0.9, metadata={"parse": parse_device_budget})


@attrs.frozen
class KeyConfig:
    """``[keys."NAME"]``: a named key, what it may use and how much (0: no limit); the key is never shown.

    The key comes from C{key}, else the file C{key_file}, else the environment variable C{key_env}.
    """

    key: str | None = attrs.field(default=None, repr=False, metadata={"parse": text})
    key_file: str | None = attrs.field(default=None, metadata={"parse": text})
    key_env: str | None = attrs.field(default=None, metadata={"parse": text})
    models: tuple[str, ...] = ()
    admin: bool = False
    requests_per_minute: int = limit_field()
    tokens_per_minute: int = limit_field()
    tokens_per_day: int = limit_field()
    max_concurrent: int = limit_field()
    priority: str = attrs.field(default="normal", metadata={"parse": one_of(*PRIORITIES)})


@attrs.frozen
class ClusterConfig:
    """``[cluster]``: how the node shows itself to a router in front of several daemons."""

    metric_names: bool = True
    #: /metrics without a key, for a router's scraper that cannot send one (the endpoint picker).
    open_metrics: bool = False


@attrs.frozen
class CacheConfig:
    """``[cache]``: llama.cpp slot states saved before a planned stop and restored for the turn they begin.

    C{folder} (default C{$MRUNNER_HOME/cache}); C{max_bytes}: the disk budget, the least recently
    used state going first; C{max_age}: no state is kept longer; C{min_tokens}: a slot holding fewer
    is not saved; C{save_timeout}: the most a stop waits for its runner's saves; C{runner_ram}:
    llama-server's own prompt cache in RAM (C{--cache-ram}) per runner, counted in its memory.
    """

    enabled: bool = True
    folder: str | None = attrs.field(default=None, metadata={"parse": text})
    max_bytes: int = attrs.field(default=20 * 2**30, metadata={"parse": parse_size})
    max_age: float = duration(7 * 24 * 3600.0)
    min_tokens: int = 256
    save_timeout: float = duration(5.0)
    runner_ram: int = attrs.field(default=0, metadata={"parse": parse_size})

    def path(self, home: Path) -> Path:
        return Path(self.folder).expanduser() if self.folder else home / "cache"


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
    sources: SourcesConfig = SourcesConfig()
    responses: ResponsesConfig = ResponsesConfig()
    backends: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    models: ModelsConfig = ModelsConfig()
    records: RecordsConfig = RecordsConfig()
    log: LogConfig = LogConfig()
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    gpu: GPUConfig = GPUConfig()
    keys: Mapping[str, KeyConfig] = attrs.field(factory=dict, repr=False)
    cluster: ClusterConfig = ClusterConfig()
    cache: CacheConfig = CacheConfig()
    source: Path | None = attrs.field(default=None, eq=False)  # the file read, logged at start
    unread: tuple[Path, ...] = attrs.field(default=(), eq=False)  # other tap.conf files, not read

    def backend(self, name: str) -> Mapping[str, Any]:
        """The ``[backends."name"]`` table, empty when absent."""
        return self.backends.get(name, {})


@attrs.frozen
class Scalars:
    listen: str = DEFAULT_LISTEN
    default_backend: str = DEFAULT_BACKEND
    max_request_bytes: int = 10 * 1024 * 1024
