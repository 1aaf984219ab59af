"""Each section's table checked key by key and turned into its typed settings."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mrunner.config.sections import (
    ANONYMOUS,
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
    Scalars,
    SchedulerConfig,
    SourcesConfig,
    StoreConfig,
)
from mrunner.config.values import ConfigError
from mrunner.errors import BadRequest
from mrunner.names import DIGEST, SHORT_ID, parse


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


def build(table: Mapping[str, Any]) -> Config:
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
        "sources": SourcesConfig,
        "responses": ResponsesConfig,
        "gpu": GPUConfig,
        "cluster": ClusterConfig,
        "cache": CacheConfig,
    }
    values: dict[str, Any] = {name: _section(cls, top.pop(name, {}), name) for name, cls in sections.items()}
    values["backends"] = top.pop("backends", {})
    values["models"] = _models(top.pop("models", {}))
    values["aliases"] = _aliases(top.pop("aliases", {}))
    values["keys"] = _keys(top.pop("keys", {}))
    if "home" in top:
        values["home"] = Path(str(top.pop("home"))).expanduser()
    scalars = _section(Scalars, top, "tap.conf")
    values.update(attrs.asdict(scalars))
    return Config(**values)


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
