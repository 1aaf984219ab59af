"""``mrunner usage``: tokens and requests per UTC day, key name and model, from C{GET /engines/usage}."""

from __future__ import annotations

import urllib.parse
from argparse import ArgumentParser, Namespace

from mrunner.cli.context import Context
from mrunner.cli.output import table

COLUMNS = ["day", "key", "model", "requests", "prompt", "completion", "errors", "seconds"]


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--key", help="only this key's name ('anonymous': keys without a name)")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--from", dest="since", metavar="DAY", help="from this UTC day (YYYY-MM-DD)")
    parser.add_argument("--to", dest="until", metavar="DAY", help="to this UTC day (YYYY-MM-DD)")


def usage(ctx: Context, args: Namespace) -> None:
    asked = {"key": args.key, "model": args.model, "from": args.since, "to": args.until}
    path = "/engines/usage"
    filled = {name: value for name, value in asked.items() if value}
    if filled:
        path += "?" + urllib.parse.urlencode(filled)
    answer = ctx.listing(path, args)
    if answer is None:
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
        for row in answer["data"]
    ]
    table(ctx.out, COLUMNS, rows)
