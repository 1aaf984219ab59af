"""Schemathesis hooks for the fuzz run (tests/real/test_fuzz.py), loaded through SCHEMATHESIS_HOOKS.

They aim generated requests where they can do work: inference and configure
bodies name the test model and the real backend, and pulls go to the test's
own registry (never a host named by a random string). Everything else is as
schemathesis generates it.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

from mrunner.config import ConfigError, parse_keep_alive
from mrunner.errors import BadRequest
from mrunner.names import parse

MODEL = os.environ.get("MRUNNER_FUZZ_MODEL", "ai/tiny")
# _configure restarts runners: it gets a model of its own, so inference keeps a warm one.
CONFIGURED = os.environ.get("MRUNNER_FUZZ_CONFIGURED", "ai/configured")
BACKEND = os.environ.get("MRUNNER_FUZZ_BACKEND", "llama.cpp")
SHORT = 4  # tokens an answer may have


# Names and ids the run must not delete (schemathesis learns them from GET /models).
KEEP = tuple(filter(None, os.environ.get("MRUNNER_FUZZ_KEEP", "").split(",")))


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Not C{GET /logs?follow=true} or C{/engines/requests?follow=true}, which answer until the
    client hangs up (tests/test_cli_parts and test_records cover them), nor a delete of the models
    the run uses."""
    if case.operation.path in ("/logs", "/engines/requests"):
        return str((case.query or {}).get("follow", "")).lower() not in ("true", "1")
    if case.operation.method.upper() == "DELETE" and "name" in (case.path_parameters or {}):
        return not _kept(str(case.path_parameters["name"]))
    return True


def _kept(name: str) -> bool:
    try:
        ref = str(parse(name))
    except BadRequest:
        ref = None
    digits = name.removeprefix("sha256:")
    return any(ref == keep or keep.removeprefix("sha256:").startswith(digits) for keep in KEEP)


def _valid_keep_alive(value: object) -> bool:
    try:
        parse_keep_alive(value)
    except ConfigError:
        return False
    return True


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """Valid values stay valid and invalid ones invalid: only where a request lands changes."""
    if case.path_parameters and "backend" in case.path_parameters:
        case.path_parameters["backend"] = BACKEND
    model = CONFIGURED if case.operation.path.endswith("/_configure") else MODEL
    if case.query and isinstance(case.query.get("model"), str) and case.query["model"].strip():
        case.query["model"] = model
    body = case.body
    if isinstance(body, dict):
        if isinstance(body.get("model"), str) and body["model"].strip():
            body["model"] = model
        if isinstance(body.get("from"), str):
            body["from"] = body["from"].rsplit("/", 1)[-1]  # a repository name at the default registry
        if body.get("keep_alive") is not None and _valid_keep_alive(body["keep_alive"]):
            body["keep_alive"] = "5m"  # 0 would unload the runner after every request
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and SHORT < value < 2**31:
                body[key] = SHORT  # a valid count stays valid; generating to the context's end takes time
        if case.operation.path.endswith("completions") and body.get("max_tokens") is None:
            body["max_tokens"] = SHORT
        if body.get("all") is True:
            body["all"] = False  # unloading every runner is tested elsewhere, and reloads cost time
    return case
