"""``mrunner usage``: tokens and requests per UTC day, key name and model, from C{GET /engines/usage}."""

from __future__ import annotations

import urllib.parse
from argparse import ArgumentParser, Namespace
from collections.abc import Iterator
from typing import Any

from mrunner.cli.context import Context
from mrunner.cli.output import show_json, table

COLUMNS = ["day", "key", "model", "requests", "prompt", "completion", "errors", "seconds"]
#: Rows asked for per request: the most a page of C{/engines/usage} holds.
PAGE = 1000


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--key", help="only this key's name ('anonymous': keys without a name)")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--from", dest="since", metavar="DAY", help="from this UTC day (YYYY-MM-DD)")
    parser.add_argument("--to", dest="until", metavar="DAY", help="to this UTC day (YYYY-MM-DD)")


def usage(ctx: Context, args: Namespace) -> None:
    """Every row the filters select, newest day first, read page by page (a bad day is the daemon's 400)."""
    asked = {"key": args.key, "model": args.model, "from": args.since, "to": args.until}
    filled = {name: value for name, value in asked.items() if value}
    found = list(_rows(ctx, filled))
    if args.json:
        show_json(ctx.out, {"object": "list", "data": found})
        return
    rows = [
        [
            row["day"],
            row["key"],
            row["model"],
            str(row["requests"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
            str(row["errors"]),
            f"{row['seconds']:.1f}",
        ]
        for row in found
    ]
    table(ctx.out, COLUMNS, rows)


def _rows(ctx: Context, filled: dict[str, str]) -> Iterator[dict[str, Any]]:
    after = None
    while True:
        page = {**filled, "limit": str(PAGE), **({"after": after} if after else {})}
        answer = ctx.daemon.call("GET", "/engines/usage?" + urllib.parse.urlencode(page))
        yield from answer["data"]
        after = answer.get("next")
        if not after:
            return
