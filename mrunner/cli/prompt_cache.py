"""``mrunner cache``: the prompt cache's saved conversations, listed, or removed."""

from __future__ import annotations

import urllib.parse
from argparse import Namespace

from mrunner.cli.context import Context
from mrunner.cli.output import table
from mrunner.values.sizes import format_size


def cache(ctx: Context, args: Namespace) -> None:
    """``mrunner cache [ls]`` lists the saved states; ``mrunner cache rm [MODEL]`` removes them."""
    if args.action == "rm":
        path = "/engines/cache" + (f"?model={urllib.parse.quote(args.model)}" if args.model else "")
        removed = ctx.daemon.call("DELETE", path)["removed"]
        ctx.out.print(f"removed {removed} saved state{'s' if removed != 1 else ''}", markup=False)
        return
    states = ctx.listing("/engines/cache", args)
    if states is None:
        return
    rows = [
        [s["model"], str(s["tokens"]), format_size(s["bytes"]), s["last_used"], s["key"] or "-"]
        for s in states
    ]
    table(ctx.out, ["model", "tokens", "size", "last used", "key"], rows)
