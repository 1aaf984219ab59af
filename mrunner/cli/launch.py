"""C{mrunner launch TOOL}: start a coding agent or chat UI already pointed at the daemon.

Each tool is told the daemon's address and a model the way it reads them
(environment variables, and for some a flag), and the key given with
C{--api-key} / C{$MRUNNER_API_KEY} when the daemon wants one (a placeholder
otherwise: the tools refuse to start without one). C{--env} prints those
variables instead, for any tool, as lines a shell can C{eval}. The tool
replaces this process (C{exec}), so its exit status is the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
from collections.abc import Callable, Mapping

import attrs

from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError

#: What the tools are given as a key when the daemon asks for none.
NO_KEY = "mrunner"

Env = dict[str, str]


@attrs.frozen
class Tool:
    """A tool: its program, how to install it, its environment and its arguments for (url, model, key)."""

    program: str
    install: str
    env: Callable[[str, str, str], Env]
    argv: Callable[[str, str], list[str]] = lambda url, model: []


def _openai(url: str, model: str, key: str) -> Env:
    """The variables OpenAI's clients (and most tools built on them) read."""
    return {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_BASE": f"{url}/v1", "OPENAI_API_KEY": key}


def _claude(url: str, model: str, key: str) -> Env:
    return {
        "ANTHROPIC_BASE_URL": f"{url}/anthropic",
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
    }


def _opencode(url: str, model: str, key: str) -> Env:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "mrunner",
        "options": {"baseURL": f"{url}/v1", "apiKey": key},
        "models": {model: {"name": model}},
    }
    return {"OPENCODE_CONFIG_CONTENT": json.dumps({"provider": {"mrunner": provider}})}


def _openwebui(url: str, model: str, key: str) -> Env:
    return {
        "OPENAI_API_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": key,
        "ENABLE_OLLAMA_API": "false",
        "DEFAULT_MODELS": model,
    }


def _codex_argv(url: str, model: str) -> list[str]:
    provider = "model_providers.mrunner"
    return [
        "-c", 'model_provider="mrunner"',
        "-c", f'{provider}.name="mrunner"',
        "-c", f'{provider}.base_url="{url}/v1"',
        "-c", f'{provider}.env_key="OPENAI_API_KEY"',
        "--model", model,
    ]  # fmt: skip


TOOLS: Mapping[str, Tool] = {
    "claude": Tool("claude", "npm install -g @anthropic-ai/claude-code", _claude),
    "codex": Tool("codex", "npm install -g @openai/codex", _openai, _codex_argv),
    "opencode": Tool(
        "opencode",
        "npm install -g opencode-ai",
        _opencode,
        lambda url, model: ["--model", f"mrunner/{model}"],
    ),
    "aider": Tool(
        "aider",
        "python -m pip install aider-install && aider-install",
        _openai,
        lambda url, model: ["--model", f"openai/{model}"],
    ),
    "openwebui": Tool(
        "open-webui", "python -m pip install open-webui", _openwebui, lambda url, model: ["serve"]
    ),
}


def environment(tool: str, url: str, model: str, key: str) -> Env:
    """What C{tool} is started with; for a tool mrunner does not know, what OpenAI's and Anthropic's
    clients and Ollama's read."""
    known = TOOLS.get(tool)
    if known is not None:
        return known.env(url, model, key)
    return {**_openai(url, model, key), **_claude(url, model, key), "OLLAMA_HOST": url}


def launch(context: Context, args: argparse.Namespace) -> None:
    url = context.daemon.url
    if url.startswith("unix:"):
        raise CommandError(f"launch needs the daemon on TCP: {args.tool} cannot reach a socket ({url})")
    model = args.model or _first_model(context)
    env = environment(args.tool, url, model, args.api_key or NO_KEY)
    if args.env:
        for name, value in env.items():
            context.out.print(f"export {name}={shlex.quote(value)}", markup=False, soft_wrap=True)
        return
    tool = TOOLS.get(args.tool)
    if tool is None:
        raise CommandError(
            f"mrunner does not know how to launch {args.tool!r} (it knows {', '.join(TOOLS)});"
            f" `mrunner launch {args.tool} --env` prints the variables to start it with"
        )
    executable = shutil.which(tool.program)
    if executable is None:
        raise CommandError(f"{tool.program} is not installed (not on PATH): install it with `{tool.install}`")
    argv = [tool.program, *tool.argv(url, model), *args.args]
    context.out.file.flush()
    os.execve(executable, argv, {**os.environ, **env})


def passed_on(words: list[str]) -> tuple[list[str], list[str]]:
    """The command line before C{--}, and the words after it (for the tool): argparse's subcommands
    would refuse them."""
    if "--" not in words:
        return words, []
    split = words.index("--")
    return words[:split], words[split + 1 :]


def _first_model(context: Context) -> str:
    """The model to use without C{--model}: the first the daemon lists."""
    models = context.daemon.call("GET", "/v1/models").get("data") or []
    if not models:
        raise CommandError("the store has no model: `mrunner pull MODEL` first, or give --model")
    return str(models[0]["id"])
