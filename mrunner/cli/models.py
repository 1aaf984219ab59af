"""Commands on the model store: pull, push, ls, inspect, rm, tag, package, verify."""

from __future__ import annotations

import time
import urllib.parse
from argparse import Namespace
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

from mrunner.cli import found
from mrunner.cli.client import model_path
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError, DaemonError
from mrunner.cli.output import ago, show_json, table
from mrunner.cli.package import TarStream, is_whisper, members, whisper_members
from mrunner.cli.progress import layer_progress


def pull(ctx: Context, args: Namespace) -> None:
    """Pull C{args.model}; offline, a model already in the store is kept and used, with a warning."""
    try:
        show_transfer(ctx, "pull", ctx.daemon.ndjson("POST", "/models/create", {"from": args.model}))
    except DaemonError as e:
        if e.code != "registry_unreachable" or not ctx.daemon.has(model_path(args.model)):
            raise
        ctx.err.print(f"mrunner: {e.message}", markup=False, highlight=False)
        ctx.out.print(f"{args.model} is in the store already; using that copy", markup=False, highlight=False)


def push(ctx: Context, args: Namespace) -> None:
    show_transfer(ctx, "push", ctx.daemon.ndjson("POST", model_path(args.model, "/push")))


def show_transfer(
    ctx: Context, verb: str, events: Iterable[dict[str, Any]], console: Console | None = None
) -> None:
    """Show a pull's or push's NDJSON progress, one bar per layer, then its outcome, on C{console}
    (default: stdout)."""
    console = console or ctx.out
    outcome = None
    with layer_progress(console, verb) as bars:
        for event in events:
            layer = event.get("layer")
            if event.get("type") == "progress" and isinstance(layer, dict):
                bars.update(str(layer["id"]), int(layer["size"]), int(layer["current"]))
            elif event.get("type") == "error":
                raise CommandError(str(event.get("message")))
            elif event.get("type") == "success":
                outcome = str(event.get("message"))
    if outcome is None:
        raise CommandError(f"the daemon ended the {verb} without saying whether it succeeded")
    console.print(outcome, markup=False, highlight=False)


def ls(ctx: Context, args: Namespace) -> None:
    if getattr(args, "found", False):
        found.ls(ctx, args)
        return
    models = ctx.listing("/models", args)
    if models is None:
        return
    now = time.time()
    rows = [
        [
            f"{tag} (corrupt: pull it again)" if model.get("corrupt") else tag,
            model["id"].split(":", 1)[-1][:12],
            str(model["config"].get("size", "")),
            str(model["config"].get("parameters", "")),
            str(model["config"].get("quantization", "")),
            ago(model["created"], now),
        ]
        for model in models
        for tag in model["tags"] or ["<none>"]
    ]
    table(ctx.out, ["name", "id", "size", "parameters", "quantization", "created"], rows)


def verify(ctx: Context, args: Namespace) -> None:
    """Re-hash the model C{args.model}'s blobs (every model's, without one); fail if one is corrupt."""
    path = model_path(args.model, "/verify") if args.model else "/models/verify"
    reports = ctx.daemon.call("POST", path)
    for report in reports:
        name = ", ".join(report["tags"]) or report["id"]
        state = "ok" if report["status"] == "ok" else f"corrupt: {report['problem']}"
        ctx.out.print(f"{name}: {state}", markup=False, highlight=False)
    corrupt = [report for report in reports if report["status"] != "ok"]
    if corrupt:
        raise CommandError(f"{len(corrupt)} of {len(reports)} model(s) corrupt: pull them again")


def inspect(ctx: Context, args: Namespace) -> None:
    show_json(ctx.out, ctx.daemon.call("GET", model_path(args.model)))


def rm(ctx: Context, args: Namespace) -> None:
    force = "?force=true" if args.force else ""
    for change in ctx.daemon.call("DELETE", model_path(args.model) + force):
        for what, name in change.items():
            ctx.out.print(f"{what}: {name}", markup=False, highlight=False)


def tag(ctx: Context, args: Namespace) -> None:
    repo, tag = split_tag(args.target)
    query = urllib.parse.urlencode({"repo": repo, "tag": tag})
    ctx.out.print(ctx.daemon.call("POST", model_path(args.model, f"/tag?{query}"))["message"], markup=False)


def may_upload(ctx: Context) -> None:
    """Raise unless the daemon takes this key's upload, asked before it: the daemon refuses a key
    when the request's headers arrive, but the client sends every byte before it reads the refusal
    (issue 53 N8: all 94 MiB of SmolLM2, then "pass --api-key KEY")."""
    who = ctx.daemon.call("GET", "/engines/overview")  # a refused key: the daemon's 401 here
    if not who.get("admin", True):
        raise CommandError(
            f"key {who.get('key')!r} may not add models: packaging takes an admin key"
            " (admin = true in its [keys] table, or one of [http] admin_api_keys)"
        )


def split_tag(name: str) -> tuple[str, str]:
    """C{host:5000/repo:v1} → C{("host:5000/repo", "v1")}; no tag means C{latest}."""
    repo, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name, "latest"
    return repo, tag


def package(ctx: Context, args: Namespace) -> None:
    """Upload the GGUF or shard set (and licenses, projector, template), or the Whisper model, as
    C{args.model}; C{--push} too."""
    optional = [Path(path) if path else None for path in (args.mmproj, args.chat_template)]
    licenses = [Path(path) for path in args.license]
    weights = Path(args.gguf or args.whisper)
    if args.whisper or is_whisper(weights):
        if any(optional):
            raise CommandError("a Whisper model takes no --mmproj or --chat-template")
        files = whisper_members(weights, licenses)
    else:
        files = members(weights, licenses, *optional)
    may_upload(ctx)
    stream = TarStream(files)
    query = {"name": args.model} | ({"context_size": args.context_size} if args.context_size else {})
    with layer_progress(ctx.out, "package") as bars:
        model = ctx.daemon.call(
            "POST",
            f"/models/load?{urllib.parse.urlencode(query)}",
            data=stream.chunks(lambda sent: bars.update("upload", stream.length, sent)),
            headers={"Content-Type": "application/x-tar", "Content-Length": str(stream.length)},
        )
    ctx.out.print(f"Packaged {weights} as {', '.join(model['tags'])} ({model['id']})", markup=False)
    if args.push:
        push(ctx, args)
