"""Commands on the daemon and its runners: run, ps, df, unload, configure, reload, status, logs and more."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from datetime import datetime
from typing import Any

import mrunner
from mrunner.cli.chat import Chat, converse, flushing
from mrunner.cli.client import lines
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError, DaemonError
from mrunner.cli.output import duration, table
from mrunner.sizes import format_size


def run(ctx: Context, args: Namespace) -> None:
    """Answer C{args.prompt} (or piped input) and exit; with neither, chat until Ctrl-D."""
    chat = Chat(ctx.daemon, ctx.err, args.model)
    prompt = args.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is None:
        converse(chat, ctx.out, ctx.err)
        return
    chat.ask(prompt, flushing(ctx.out.file))
    ctx.out.file.write("\n")


def ps(ctx: Context, args: Namespace) -> None:
    runners = ctx.listing("/engines/ps", args)
    if runners is None:
        return
    now = time.time()
    rows = [
        [
            runner["model_name"],
            runner["model_id"].split(":", 1)[-1][:12],
            runner["backend_name"],
            runner["mode"],
            state(runner),
            format_size(runner["memory"]),
            until(runner, now),
        ]
        for runner in runners
    ]
    table(ctx.out, ["model", "id", "backend", "mode", "state", "memory", "until"], rows)


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
    table(ctx.out, ["type", "size"], rows)


def unload(ctx: Context, args: Namespace) -> None:
    result = ctx.daemon.call("POST", "/engines/unload", {"models": args.models, "all": args.all})
    count = result["unloaded_runners"]
    ctx.out.print(f"Unloaded {count} runner{'' if count == 1 else 's'}")


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


def reload(ctx: Context, args: Namespace) -> None:
    """Make the daemon read its tap.conf again."""
    result = ctx.daemon.call("POST", "/engines/_reload", {})
    ctx.out.print("Reloaded tap.conf", markup=False)
    if result["restart_required"]:
        ctx.out.print(f"Restart the daemon to apply: {', '.join(result['restart_required'])}", markup=False)


def status(ctx: Context, args: Namespace) -> None:
    statuses = ctx.listing("/engines/status", args)
    if statuses is None:
        return
    ctx.out.print(f"mrunner is running at {ctx.daemon.url}", markup=False)
    for backend, text in statuses.items():
        ctx.out.print(f"{backend}: {text}", markup=False, highlight=False)
    try:
        preloads = ctx.daemon.call("GET", "/ready")["preloads"]
    except DaemonError as e:
        if e.status != 503:
            raise
        ctx.out.print("preloads: still loading", markup=False)
        return
    for preload in preloads:
        outcome = f"failed: {preload['error']}" if preload["error"] else preload["state"]
        ctx.out.print(f"preload {preload['model']}: {outcome}", markup=False, highlight=False)


def logs(ctx: Context, args: Namespace) -> None:
    """Copy the daemon's tagged log lines to stdout; with C{--follow}, until Ctrl-C."""
    out = ctx.out.file
    with ctx.daemon.open("GET", "/logs?follow=true" if args.follow else "/logs") as response:
        for line in lines(response):
            out.write(line.decode("utf-8", errors="replace"))
            out.flush()


def version(ctx: Context, args: Namespace) -> None:
    ctx.out.print(f"mrunner client {mrunner.__version__}", markup=False)
    daemon = ctx.daemon.call("GET", "/version")
    ctx.out.print(f"mrunner daemon {daemon['version']} at {ctx.daemon.url}", markup=False)


def wait(ctx: Context, args: Namespace) -> None:
    """Return once the daemon answers C{/health}, for scripts that start it."""
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            ctx.daemon.call("GET", "/health")
            return
        except CommandError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
