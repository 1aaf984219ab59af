"""Commands on the daemon and its runners: run, ps, df, unload, configure, reload, status, logs and more."""

from __future__ import annotations

import difflib
import json
import os
import sys
import time
import urllib.parse
from argparse import Namespace
from collections.abc import Callable
from datetime import datetime
from typing import Any

import mrunner
from mrunner.address import advertised, home_of, running
from mrunner.cli.chat import Chat, converse, flushing
from mrunner.cli.client import Daemon, lines
from mrunner.cli.context import Context
from mrunner.cli.errors import NEAREST, CommandError, DaemonError, explain
from mrunner.cli.models import show_transfer
from mrunner.cli.output import duration, plural, table
from mrunner.values.sizes import format_size

#: How alike a name must be to a loaded one (both without C{ai/} and C{:latest}) to be offered instead.
NEAR = 0.6


def run(ctx: Context, args: Namespace) -> None:
    """Answer C{args.prompt} (or piped input) and exit; with neither, chat until Ctrl-D."""
    chat = Chat(ctx.daemon, ctx.err, args.model, args.max_tokens)
    prompt = args.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is None:  # loaded first, so a failed load shows before the first question
        pulling(ctx, chat.model, args.pull, chat.preload)
        converse(chat, ctx.out, ctx.err)
        return
    pulling(ctx, chat.model, args.pull, lambda: chat.ask(prompt, flushing(ctx.out.file)))
    chat.end_answer(ctx.out.file)


def pulling(ctx: Context, model: str, pull: bool, act: Callable[[], None]) -> None:
    """C{act}; if C{model} is not in the store, pull it (unless C{--no-pull}) and C{act} again.

    The pull's progress goes to stderr, leaving stdout to the answer, as C{docker model run} and
    C{ollama run} pull. A pull that fails names the stored model closest to C{model}, if any: the
    name may be a typo (but C{ai/smollm3} beside C{ai/smollm2} is another model, so it is pulled).
    """
    try:
        act()
    except DaemonError as e:
        if e.code != "model_not_found" or not pull:
            raise
        near = NEAREST.search(e.message)
        ctx.err.print(f"{model} is not in the store: pulling it", markup=False, highlight=False)
        try:
            show_transfer(ctx, "pull", ctx.daemon.ndjson("POST", "/models/create", {"from": model}), ctx.err)
        except CommandError as failed:
            guess = f" (did you mean {near.group(1)}?)" if near else ""
            why = explain(failed, "pull", model)
            raise CommandError(f"{model} is not in the store{guess}, and pulling it failed: {why}") from None
        act()


PS_COLUMNS = ["model", "id", "backend", "mode", "state", "memory", "processor", "context", "until"]


def ps(ctx: Context, args: Namespace) -> None:
    runners = ctx.listing("/engines/ps", args)
    if runners is None:
        return
    if not runners:
        ctx.out.print("no models loaded", markup=False)
        return
    now = time.time()
    failed = [runner for runner in runners if runner["state"] == "failed"]
    rows = [
        [
            runner["model_name"],
            (runner["model_id"] or "-").split(":", 1)[-1][:12],
            runner["backend_name"],
            runner["mode"],
            state(runner),
            format_size(runner["memory"]),
            processor(runner),
            str(runner.get("context_size") or "-"),
            "-" if runner in failed or runner["state"] == "waiting" else until(runner, now),
        ]
        for runner in runners
    ]
    if any(runner.get("waiting") for runner in runners):  # a queue: say it, per model
        table(
            ctx.out,
            [*PS_COLUMNS, "waiting"],
            [[*row, queued(r)] for row, r in zip(rows, runners, strict=True)],
        )
    else:
        table(ctx.out, PS_COLUMNS, rows)
    for runner in runners:
        if runner.get("warning"):  # a context_size above what the model gives
            ctx.out.print(runner["warning"], markup=False, highlight=False)
    for runner in failed:
        ctx.out.print(
            f"preload {runner['model_name']} failed: {runner['error']}", markup=False, highlight=False
        )


def queued(runner: dict[str, Any]) -> str:
    """How many wait for its model and the oldest's wait: C{3 (12s)}; C{-} when none does."""
    count = runner.get("waiting") or 0
    return f"{count} ({runner['oldest_wait']:.0f}s)" if count else "-"


def processor(runner: dict[str, Any]) -> str:
    """Where its memory is, as Ollama's C{ps} says it: C{100% CPU}, or the share on each device."""
    where = runner.get("processor")
    if not where:
        return "-"
    return "100% CPU" if where == "CPU" else str(where)


def state(runner: dict[str, Any]) -> str:
    """Loading or draining; a ready runner is idle or serving so many requests; pinned, stale."""
    if runner["state"] != "ready":
        text = str(runner["state"])
    else:
        text = f"serving {runner['in_use']}" if runner["in_use"] else "idle"
    marks = [mark for mark in ("pinned", "stale") if runner.get(mark)]
    return ", ".join([text, *marks])


def until(runner: dict[str, Any], now: float) -> str:
    """When the runner will be unloaded: never, once idle, or in so long."""
    if runner["keep_alive"] is None:
        return "forever"
    if runner["expires_at"] is None:
        return "in use"
    left = datetime.fromisoformat(runner["expires_at"]).timestamp() - now
    return f"in {duration(left)}" if left >= 1 else "now"


def df(ctx: Context, args: Namespace) -> None:
    usage = ctx.listing("/engines/df", args)
    if usage is None:
        return
    rows = [["models", format_size(usage["models_disk_usage"])]]
    rows += [["partial downloads", format_size(usage.get("models_partial_disk_usage", 0))]]
    rows += [[f"backend {name}", format_size(size)] for name, size in usage["backends_disk_usage"].items()]
    files = usage.get("prompt_cache_files", 0)
    cache = f"prompt cache ({plural(files, 'saved state')})"
    rows += [[cache, format_size(usage.get("prompt_cache_disk_usage", 0))]]
    table(ctx.out, ["type", "size"], rows)


def unload(ctx: Context, args: Namespace) -> None:
    """Unload every runner, or each named model's (one request each, so a name that has none is told).

    When nothing named was loaded the error alone is said: "Unloaded 0 runners" beside it told
    two stories.
    """
    if args.all:
        count = ctx.daemon.call("POST", "/engines/unload", {"all": True})["unloaded_runners"]
    else:
        counts = {
            name: ctx.daemon.call("POST", "/engines/unload", {"models": [name]})["unloaded_runners"]
            for name in args.models
        }
        count = sum(counts.values())
    missing = [] if args.all else [name for name, hits in counts.items() if not hits]
    if count or not missing:
        ctx.out.print(f"Unloaded {plural(count, 'runner')}", markup=False)
    if missing:
        loaded = [runner["model_name"] for runner in ctx.daemon.call("GET", "/engines/ps")]
        raise CommandError("; ".join(not_loaded(name, loaded) for name in missing))


def not_loaded(name: str, loaded: list[str]) -> str:
    """C{name} has no runner: said with the loaded model closest to it, or that none is loaded."""
    if not loaded:
        return f"{name} is not loaded: no model is"
    short = {_short(model): model for model in loaded}
    near = difflib.get_close_matches(_short(name), list(short), n=1, cutoff=NEAR)
    if near:
        return f"{name} is not loaded; did you mean {short[near[0]]}?"
    return f"{name} is not loaded (loaded: {', '.join(dict.fromkeys(loaded))})"


def _short(name: str) -> str:
    """A name as people type it: no C{ai/} in front, no C{:latest} behind."""
    return name.removeprefix("ai/").removesuffix(":latest")


def configure(ctx: Context, args: Namespace) -> None:
    """Set a model's runner settings: pin, keep-alive, context size, runtime flags, draft model."""
    body: dict[str, Any] = {"model": args.model}
    if args.pin is not None:
        body["pinned"] = args.pin
    if args.keep_alive is not None:
        body["keep_alive"] = args.keep_alive
    if args.context_size is not None:
        body["context_size"] = args.context_size
    if args.runtime_flags is not None:
        body["raw_runtime_flags"] = args.runtime_flags
    if args.speculative_draft_model is not None:
        body["speculative"] = {"draft_model": args.speculative_draft_model}
    result = ctx.daemon.call("POST", "/engines/_configure", body)
    ctx.out.print(f"{result['model']}: {result['status']}", markup=False)
    if result.get("warning"):
        ctx.err.print(f"mrunner: {result['warning']}", markup=False, highlight=False)


def reload(ctx: Context, args: Namespace) -> None:
    """Make the daemon read its tap.conf again."""
    result = ctx.daemon.call("POST", "/engines/_reload", {})
    ctx.out.print("Reloaded tap.conf", markup=False)
    if result["restart_required"]:
        ctx.out.print(f"Restart the daemon to apply: {', '.join(result['restart_required'])}", markup=False)


def logs(ctx: Context, args: Namespace) -> None:
    """Copy the tagged log lines (all, or one model's runners') to stdout; with C{--follow}, until Ctrl-C."""
    out = ctx.out.file
    query = {"source": args.model} if args.model else {}
    if args.follow:
        query["follow"] = "true"
    with ctx.daemon.open("GET", "/logs" + _query(query)) as response:
        for line in lines(response):
            out.write(line.decode("utf-8", errors="replace"))
            out.flush()


def requests(ctx: Context, args: Namespace) -> None:
    """The recorded requests, newest first, as a table or JSON; with C{--follow}, as C{tail -f} does.

    A follow shows the last L{FOLLOW_BACKLOG} records, oldest first, under the table's
    header, then each new one as it ends (it replayed the daemon's fifty, headerless).
    """
    query = {"model": args.model} if args.model else {}
    if not args.follow:
        records = ctx.listing("/engines/requests" + _query(query), args)
        if records is not None:
            table(ctx.out, REQUEST_COLUMNS, [request_row(record) for record in records])
        return
    query |= {"follow": "true", "limit": str(FOLLOW_BACKLOG)}
    out = ctx.out.file
    with ctx.daemon.open("GET", "/engines/requests" + _query(query)) as response:
        if not args.json:
            out.write(_follow_row([column.upper() for column in REQUEST_COLUMNS]))
            out.flush()
        for line in lines(response):
            if not line.startswith(b"data: "):
                continue
            record = json.loads(line[6:])
            out.write(json.dumps(record) + "\n" if args.json else _follow_row(request_row(record)))
            out.flush()


REQUEST_COLUMNS = ["id", "started", "model", "route", "status", "queued", "ttfb", "total", "tokens", "answer"]
FOLLOW_BACKLOG = 10
# A follow's columns cannot be fitted to rows yet to come: these widths suit most (a longer cell
# pushes the rest of its row along).
FOLLOW_WIDTHS = (5, 8, 24, 28, 9, 8, 8, 8, 9, 0)


def _follow_row(cells: list[str]) -> str:
    """One line of a follow, its cells padded to L{FOLLOW_WIDTHS}."""
    padded = (cell.ljust(width) for cell, width in zip(cells, FOLLOW_WIDTHS, strict=True))
    return "  ".join(padded).rstrip() + "\n"


def request_row(record: dict[str, Any]) -> list[str]:
    """One record in a line: when, what, how it went, how long it took, and the start of its answer."""
    timings = record["timings"]
    tokens = record["tokens"]
    text = record["answer"]["text"] or ""
    return [
        str(record["id"]),
        (record["started"] or "")[11:19],
        record["model"],
        record["route"],
        str(record["status"]) + ("" if record["completed"] else " (cut)"),
        *(_seconds(timings[key]) for key in ("queued", "ttfb", "total")),
        f"{tokens['prompt']}+{tokens['completion']}" if tokens else "-",
        " ".join(text.split())[:40],
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _query(values: dict[str, str]) -> str:
    return "?" + urllib.parse.urlencode(values) if values else ""


def version(ctx: Context, args: Namespace) -> None:
    ctx.out.print(f"mrunner client {mrunner.__version__}", markup=False)
    daemon = ctx.daemon.call("GET", "/version")
    ctx.out.print(f"mrunner daemon {daemon['version']} at {ctx.daemon.url}", markup=False)


def wait(ctx: Context, args: Namespace) -> None:
    """Print the daemon's address once it answers C{/health}, for scripts that start it.

    With C{--pid} (and no C{--host} or C{MRUNNER_HOST}), the daemon is the one
    that process says it is in its home's C{run/daemon.json}: not another
    daemon already there (C{make run} twice), nor the default port when it
    listens elsewhere. It gives up as soon as that process ends.
    """
    deadline = time.monotonic() + args.timeout
    follow = args.pid is not None and args.host is None and "MRUNNER_HOST" not in os.environ
    while True:
        if args.pid is not None and not running(args.pid):
            raise CommandError(f"the daemon (pid {args.pid}) ended before it answered")
        try:
            daemon = advertising(args.pid, args.api_key, args.cacert) if follow else ctx.connect()
            daemon.call("GET", "/health")
            ctx.out.print(daemon.url, markup=False, highlight=False)
            return
        except CommandError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def advertising(pid: int, api_key: str | None, cacert: str | None) -> Daemon:
    """The daemon that process C{pid} says it is, in the home's C{run/daemon.json}."""
    said = advertised(home_of(os.environ))
    if said is None or said.get("pid") != pid:
        raise CommandError(f"the daemon (pid {pid}) has not said where it listens")
    return Daemon(said["url"], api_key, cacert)
