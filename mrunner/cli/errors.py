"""Errors the command line reports, and what to do about them."""

from __future__ import annotations

import re

NEAREST = re.compile(r"\(did you mean (\S+)\?\)")  # the daemon's guess in a model_not_found message
START_HINT = "start it with `twistd -n mrunner` (or `make run` in a checkout)"


class CommandError(Exception):
    """A failure told in one line on stderr; the command exits with status 1."""


class DaemonError(CommandError):
    """The daemon refused: its HTTP status, its message and its error code."""

    def __init__(self, status: int, message: str, code: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def explain(error: CommandError, command: str, model: str | None) -> str:
    """The line to show for C{error} met by C{command} on C{model}, with the next step when there is one."""
    if not isinstance(error, DaemonError):
        return str(error)
    if error.code == "model_not_found" and command != "pull" and model:
        near = NEAREST.search(error.message)
        guess = f"did you mean {near.group(1)}? Else " if near else ""
        pull = f"get it with `mrunner pull {model}`"
        return f"model {model} is not here; {guess}{pull} (`mrunner ls` lists what is)"
    if error.code == "registry_unreachable":  # the message says what to do; the status adds nothing
        return error.message
    if error.status == 401:
        return f"{error.message}: pass --api-key KEY or set MRUNNER_API_KEY"
    if error.code == "model_has_several_tags" and model:
        return f"{error.message.split(';')[0]}: `mrunner rm --force {model}` removes it under all of them"
    if error.code == "model_in_use" and model:
        return f"{error.message.split(';')[0]}: `mrunner rm --force {model}` removes it once they end"
    return f"{error.message} (HTTP {error.status})"
