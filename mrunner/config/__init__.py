"""The daemon's configuration: built-in defaults < TOML file < command line < MRUNNER_* variables.

Every key is documented in the top-level ``tap.conf``; this package only reads them. Its
modules, one job each: C{values} (the spellings of durations, sizes and choices), C{sections}
(the typed settings), C{tables} (each section checked key by key), C{secrets} (where keys come
from), C{reading} (which file, merged under the command line and the environment). The names
the rest of mrunner uses are here, so callers import C{mrunner.config}, never a module of it.
"""

from mrunner.config.reading import load
from mrunner.config.sections import (
    ANONYMOUS,
    DEFAULT_BACKEND,
    DEFAULT_LISTEN,
    LOCAL_ORIGINS,
    CacheConfig,
    ClusterConfig,
    Config,
    GPUConfig,
    HTTPConfig,
    HuggingFaceConfig,
    KeyConfig,
    LogConfig,
    ModelConfig,
    ModelsConfig,
    RecordsConfig,
    RegistryConfig,
    ResponsesConfig,
    RunnerConfig,
    SchedulerConfig,
    SourcesConfig,
    StoreConfig,
)
from mrunner.config.values import (
    PRIORITIES,
    ConfigError,
    parse_duration,
    parse_keep_alive,
    parse_size,
    physical_memory,
)

__all__ = [
    "ANONYMOUS",
    "DEFAULT_BACKEND",
    "DEFAULT_LISTEN",
    "LOCAL_ORIGINS",
    "PRIORITIES",
    "CacheConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "GPUConfig",
    "HTTPConfig",
    "HuggingFaceConfig",
    "KeyConfig",
    "LogConfig",
    "ModelConfig",
    "ModelsConfig",
    "RecordsConfig",
    "RegistryConfig",
    "ResponsesConfig",
    "RunnerConfig",
    "SchedulerConfig",
    "SourcesConfig",
    "StoreConfig",
    "load",
    "parse_duration",
    "parse_keep_alive",
    "parse_size",
    "physical_memory",
]
