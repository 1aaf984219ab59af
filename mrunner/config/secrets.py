"""Where the secrets come from: C{MRUNNER_API_KEY}, and each named key's C{key}, C{key_file} or C{key_env}."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from mrunner.config.sections import Config, HTTPConfig, KeyConfig
from mrunner.config.values import ConfigError


def with_environment(config: Config, environ: Mapping[str, str]) -> Config:
    """C{MRUNNER_API_KEY} adds a key, C{MRUNNER_ORIGINS} (comma-separated) adds origins.

    A C{MRUNNER_API_KEY} that is a named key's own is that key, with its name and rights: the one
    given to C{make run} (which starts the daemon and packages SmolLM2 with the same variable) is
    the caller's key, not a second listing of it to refuse (issue 53 N8).
    """
    http = config.http
    origins = [origin.strip() for origin in environ.get("MRUNNER_ORIGINS", "").split(",")]
    if any(origins):
        http = attrs.evolve(http, cors_origins=(*http.cors_origins, *filter(None, origins)))
    keys = _keys_with_secrets(config.keys, environ, http)
    added = environ.get("MRUNNER_API_KEY")
    if added and all(entry.key != added for entry in keys.values()):
        http = attrs.evolve(http, api_keys=(*http.api_keys, added))
    return attrs.evolve(config, http=http, keys=keys)


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
            (http.api_keys, "[http] api_keys"),
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
