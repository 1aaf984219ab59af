"""``mrunner [--host URL] COMMAND ...``: read the command line, run the command, exit 0, 1 or 2.

0 is success, 1 an error (told on stderr with what to do about it), 2 a
usage error (told with that command's usage); 130 when Ctrl-C interrupts a
command, as shells expect. A command's options go anywhere among its
arguments, as docker and git take them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

from rich.console import Console

from mrunner.cli import (
    bench,
    devices,
    engines,
    found,
    launch,
    login,
    models,
    prompt_cache,
    status,
    transcribe,
    usage,
)
from mrunner.cli.chat import DEFAULT_MAX_TOKENS
from mrunner.cli.client import DEFAULT_HOST, Daemon, find_host
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError, explain

PIPE_WIDTH = 10_000  # a listing written to a pipe or file is never wrapped
STORED = "a model in the store, e.g. ai/smollm2"
Command = Callable[[Context, argparse.Namespace], None]


class Add(Protocol):
    """Adds one subcommand, its help and its C{--json} if it has one; returns its parser."""

    def __call__(
        self, name: str, run: Command, summary: str, *aliases: str, json: bool = False
    ) -> argparse.ArgumentParser: ...


class CommandParser(argparse.ArgumentParser):
    """One command's arguments: its options anywhere among its positionals (C{run MODEL --max-tokens 0
    PROMPT}), and a word it does not know refused with its own usage rather than the top-level one."""

    _inside = False  # parse_known_intermixed_args calls parse_known_args itself, twice

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inside:
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            parsed, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def global_options(parser: argparse.ArgumentParser, defaults: bool) -> argparse.ArgumentParser:
    """C{--host}, C{--api-key}, C{--cacert}: before the command (with their defaults) or after it, as docker
    takes them.

    After the command they default to nothing, so that one given before it stands.
    """
    parser.add_argument(
        "--host",
        default=None if defaults else argparse.SUPPRESS,
        help="the daemon's address, http://HOST:PORT, https://HOST:PORT or unix:PATH (default:"
        " $MRUNNER_HOST, else the address the daemon of $MRUNNER_HOME (~/.mrunner) wrote in its"
        f" run/daemon.json, else {DEFAULT_HOST} when nothing names a home)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("MRUNNER_API_KEY") if defaults else argparse.SUPPRESS,
        help="the key a daemon with [http] api_keys or [keys] requires (default: $MRUNNER_API_KEY)",
    )
    parser.add_argument(
        "--cacert",
        metavar="FILE",
        default=os.environ.get("MRUNNER_CACERT") if defaults else argparse.SUPPRESS,
        help="trust an https daemon's certificate (a self-signed one) from this PEM file"
        " (default: $MRUNNER_CACERT, else the system's authorities or $SSL_CERT_FILE)",
    )
    return parser


def parser() -> argparse.ArgumentParser:
    top = global_options(
        argparse.ArgumentParser(
            prog="mrunner", description="Pull, run and manage local models through the mrunner daemon."
        ),
        defaults=True,
    )
    common = CommandParser(add_help=False)
    global_options(common, defaults=False)
    commands = top.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=CommandParser, title="commands"
    )

    def add(
        name: str, run: Command, summary: str, *aliases: str, json: bool = False
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, aliases=aliases, help=summary, description=summary, parents=[common])
        sub.set_defaults(run=run, usage=sub)
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON, for scripts")
        return sub

    for group in COMMAND_GROUPS:  # in this order, which `mrunner --help` lists them in
        group(add)
    return top


def _model_commands(add: Add) -> None:
    """Pulling, pushing, running and naming the store's models."""
    add("pull", models.pull, "pull a model from a registry, one bar per layer").add_argument(
        "model", help="ai/smollm2 (Docker Hub), HOST:PORT/REPO[:TAG] or hf.co/ORG/REPO[:QUANT]"
    )
    add("push", models.push, "push a model to the registry its name points at").add_argument(
        "model", help=f"{STORED}, named HOST[:PORT]/REPO[:TAG] (see `mrunner tag`)"
    )
    run = add("run", engines.run, "answer PROMPT and exit; without one, chat until Ctrl-D")
    run.add_argument("model", help=f"{STORED} (pulled first if it is not), or an alias")
    run.add_argument("prompt", nargs="?", help="the question (default: piped input, else a chat)")
    run.add_argument(
        "--no-pull", dest="pull", action="store_false", help="fail rather than pull a model not in the store"
    )
    run.add_argument(
        "--max-tokens",
        type=_whole,
        default=DEFAULT_MAX_TOKENS,
        help=f"the most tokens an answer may have (default: {DEFAULT_MAX_TOKENS}; 0: no limit)",
    )
    speech = add("transcribe", transcribe.transcribe, "turn the speech in an audio file into text")
    speech.add_argument("file", help="a WAV, MP3, FLAC or Ogg Vorbis file")
    speech.add_argument("--model", required=True, help=f"a Whisper model: {STORED}")
    speech.add_argument("--format", choices=transcribe.FORMATS, default="text", help="default: text")
    speech.add_argument("--language", help="the language spoken, e.g. en (default: the model detects it)")
    speech.add_argument("--translate", action="store_true", help="into English text, whatever is spoken")
    listing = add("ls", models.ls, "list the models in the store", "list", json=True)
    listing.add_argument(
        "--found", action="store_true", help="list the models Ollama, Hugging Face, LM Studio, llama.cpp keep"
    )
    bring = add("import", found.import_, "bring another tool's model into the store, without a copy")
    bring.add_argument("source", metavar="SOURCE", help=found.SOURCES + " (`mrunner ls --found` lists them)")
    bring.add_argument("name", nargs="?", metavar="NAME", help="its name here (default: one from its source)")
    add("inspect", models.inspect, "show a model's details as JSON").add_argument("model", help=STORED)
    add("verify", models.verify, "re-hash a model's files (all models without NAME)").add_argument(
        "model", nargs="?", metavar="NAME", help=f"{STORED} (default: every model)"
    )
    rm = add("rm", models.rm, "remove a model from the store (and unload it)", "remove")
    rm.add_argument("model", help=f"{STORED}, or its id")
    rm.add_argument("--force", action="store_true", help="remove it under all of its tags")
    tag = add("tag", models.tag, "give a model another name")
    tag.add_argument("model", metavar="SOURCE", help=STORED)
    tag.add_argument("target", metavar="TARGET", help="its new name, e.g. localhost:5000/ai/smollm2:v1")


def _runner_commands(add: Add) -> None:
    """The running models: listing, disk and devices, unloading, their settings."""
    add("ps", engines.ps, "list the running models", json=True)
    add("df", engines.df, "show disk usage of models and backends", json=True)
    add("devices", devices.devices, "show the GPUs and RAM runners use: memory, budget, use", json=True)
    saved = add(
        "cache", prompt_cache.cache, "list the prompt cache's saved conversations, or remove them", json=True
    )
    saved.add_argument("action", nargs="?", choices=("ls", "rm"), default="ls", help="ls (default) or rm")
    saved.add_argument("model", nargs="?", help="rm: only this model's (default: all)")
    unload = add("unload", engines.unload, "unload the named models' runners, or all of them")
    unload.add_argument("models", nargs="*", metavar="MODEL", help="a loaded model (`mrunner ps` lists them)")
    unload.add_argument("--all", action="store_true", help="unload every runner")
    configure = add("configure", engines.configure, "set a model's runner settings (docker model configure)")
    configure.add_argument("model", help=STORED)
    pin = configure.add_mutually_exclusive_group()
    pin.add_argument(
        "--pin", action="store_true", default=None, help="keep it loaded: no expiry, no eviction"
    )
    pin.add_argument("--unpin", dest="pin", action="store_false", help="let it expire and be evicted again")
    configure.add_argument("--keep-alive", help="idle time before unloading, e.g. 10m; -1 for ever")
    configure.add_argument("--context-size", type=_positive, help="context size of its next runner")
    configure.add_argument(
        "--runtime-flags", help='llama-server flags from the allowed list, e.g. "--temp 0.2 --top-k 20"'
    )
    configure.add_argument(
        "--speculative-draft-model",
        metavar="NAME",
        help='a model in the store that drafts for it; "" for none',
    )


def _daemon_commands(add: Add) -> None:
    """The daemon itself: reload, status, logs, recorded requests, usage."""
    add("reload", engines.reload, "make the daemon read its tap.conf again (as SIGHUP does)")
    add("status", status.status, "is the daemon running, and its backends' install state", json=True)
    logs = add("logs", engines.logs, "show the daemon's and the runners' logs")
    logs.add_argument("-f", "--follow", action="store_true", help="keep showing new lines until Ctrl-C")
    logs.add_argument("--model", help="only this model's runners' logs ('daemon' for the daemon's own)")
    requests = add("requests", engines.requests, "show the recorded requests, newest first", json=True)
    requests.add_argument("--model", help="only this model's requests")
    requests.add_argument("-f", "--follow", action="store_true", help="show each new request as it ends")
    usage.add_arguments(add("usage", usage.usage, "show usage per day, key and model", json=True))


def _package_commands(add: Add) -> None:
    """Making a model from local files, and the registries' credentials."""
    package = add(
        "package", models.package, "store a GGUF file (or shard set) or a Whisper model, with its files"
    )
    package.add_argument("model", metavar="NAME", help="its name in the store, e.g. ai/mymodel:v1")
    weights = package.add_mutually_exclusive_group(required=True)
    weights.add_argument(
        "--gguf",
        help="the GGUF file; the first shard (…-00001-of-0000N.gguf) takes the whole set",
    )
    weights.add_argument("--whisper", help="a whisper.cpp ggml model (ggml-*.bin), for speech to text")
    package.add_argument("--license", action="append", default=[], help="a license file (repeatable)")
    package.add_argument("--mmproj", help="a multimodal projector GGUF (mmproj-*.gguf), for images")
    package.add_argument("--chat-template", help="a Jinja chat template file that replaces the GGUF's")
    package.add_argument("--context-size", type=_positive, help="the model's default context size")
    package.add_argument("--push", action="store_true", help="push it to its registry afterwards")
    log_in = add("login", login.login, "store a registry's credentials where `docker login` would")
    log_in.epilog = login.WHERE
    log_in.add_argument(
        "registry", metavar="REGISTRY", type=login.registry, help="host[:port] of the registry"
    )
    log_in.add_argument("-u", "--username", help="the user name (default: asked at a terminal)")
    log_in.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from stdin (the default off a terminal)",
    )
    add("logout", login.logout, "remove a registry's stored credentials").add_argument(
        "registry", metavar="REGISTRY", type=login.registry, help="host[:port] of the registry"
    )


def _tool_commands(add: Add) -> None:
    """Benchmarks, launching other tools, versions, waiting for the daemon."""
    timing = add(
        "bench",
        bench.bench,
        "tokens per second at several concurrencies, and the time to first token",
        json=True,
    )
    timing.add_argument("model", help=STORED)
    timing.add_argument(
        "--concurrency",
        type=bench.concurrencies,
        default=bench.DEFAULT_CONCURRENCY,
        help="requests at once, one round each (default: 1,2,4,8)",
    )
    timing.add_argument(
        "--prompt-tokens",
        type=_positive,
        default=bench.DEFAULT_PROMPT_TOKENS,
        help=f"about how long each prompt is (default: {bench.DEFAULT_PROMPT_TOKENS})",
    )
    timing.add_argument(
        "--max-tokens",
        type=_positive,
        default=bench.DEFAULT_MAX_TOKENS,
        help=f"tokens each answer makes (default: {bench.DEFAULT_MAX_TOKENS})",
    )
    launch_tool = add(
        "launch", launch.launch, "start a coding agent or chat UI pointed at mrunner (claude, codex, ...)"
    )
    launch_tool.add_argument(
        "tool", metavar="TOOL", help=f"one of {', '.join(launch.TOOLS)}, or any with --env"
    )
    launch_tool.add_argument("--model", help="the model it uses (default: the first the daemon lists)")
    launch_tool.add_argument(
        "--env", action="store_true", help="print its environment as export lines instead"
    )
    launch_tool.add_argument("args", nargs="*", metavar="ARG", help="passed on to the tool (after --)")
    add("version", engines.version, "show the client's and the daemon's versions")
    wait = add("wait", engines.wait, "wait until the daemon answers, then print its address (for scripts)")
    wait.add_argument("--timeout", type=float, default=60, help="seconds (default: 60)")
    wait.add_argument(
        "--pid",
        type=_positive,
        help="the daemon's process: wait for the address it writes, and give up as soon as it ends",
    )


#: Every subcommand, group by group.
COMMAND_GROUPS = (_model_commands, _runner_commands, _daemon_commands, _package_commands, _tool_commands)


def _positive(text: str) -> int:
    if _whole(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _whole(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


#: Options whose value may itself start with "--" (C{--runtime-flags "--flash-attn"}).
FLAG_VALUED = ("--runtime-flags",)


def joined(argv: Sequence[str]) -> list[str]:
    """C{--runtime-flags --temp} as C{--runtime-flags=--temp}: argparse takes a value starting with
    C{-} for another option, so the README's C{--runtime-flags "--flash-attn"} would be refused."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        value = next(words, None) if word in FLAG_VALUED else None
        out.append(word if value is None else f"{word}={value}")
    return out


def main(argv: Sequence[str] | None = None) -> NoReturn:
    top = parser()
    words = joined(sys.argv[1:] if argv is None else argv)
    words, passed = launch.passed_on(words)
    args = top.parse_args(words)
    if args.command is None:  # `mrunner` alone: what it can do
        top.print_help(sys.stderr)
        sys.exit(2)
    if passed and args.command != "launch":
        args.usage.error("arguments after -- are for `mrunner launch TOOL -- ARGS` only")
    if passed:
        args.args += passed
    if args.command == "unload" and bool(args.models) == args.all:
        args.usage.error("name the models to unload, or give --all (not both)")
    tty = sys.stdout.isatty()
    out = Console(highlight=False, width=None if tty else PIPE_WIDTH)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        args.run(Context(lambda: Daemon(find_host(args.host), args.api_key, args.cacert), out, err), args)
    except CommandError as e:
        err.print(f"mrunner: {explain(e, args.command, getattr(args, 'model', None))}", markup=False)
        sys.exit(1)
    except KeyboardInterrupt:
        out.file.write("\n")
        sys.exit(130)
    except BrokenPipeError:  # `mrunner logs | head`: the reader is gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(0)
