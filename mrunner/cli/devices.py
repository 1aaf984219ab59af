"""``mrunner devices``: the llama-server build in use and each device's memory, the host's RAM last."""

from __future__ import annotations

from argparse import Namespace

from mrunner.cli.context import Context
from mrunner.cli.output import table
from mrunner.values.sizes import format_size


def devices(ctx: Context, args: Namespace) -> None:
    answer = ctx.listing("/engines/devices", args)
    if answer is None:
        return
    ctx.out.print(f"llama-server build: {answer['variant']}", markup=False, highlight=False)
    rows = [
        [
            device["id"],
            device["name"],
            format_size(device["memory_total"]),
            format_size(device["memory_free"]),
            format_size(device["budget"]),
            format_size(device["used"]),
        ]
        for device in answer["devices"]
    ]
    table(ctx.out, ["device", "name", "total", "free", "budget", "used"], rows)
