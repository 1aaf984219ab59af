"""``mrunner ls --found`` and ``mrunner import``: the models Ollama, the Hugging Face cache, LM Studio and
llama.cpp keep on the daemon's machine, listed and brought into the store without a second copy."""

from __future__ import annotations

import os
from argparse import Namespace

from mrunner.cli.context import Context
from mrunner.cli.output import table
from mrunner.values.sizes import format_size

PREFIXES = ("ollama:", "hf-cache:", "lmstudio:", "llama.cpp:")
SOURCES = (
    "ollama:NAME[:TAG], hf-cache:ORG/REPO[:QUANT], lmstudio:PUBLISHER/REPO[:QUANT], llama.cpp:FILE"
    " or PATH.gguf"
)


def ls(ctx: Context, args: Namespace) -> None:
    """The found models: what to import each as, its size and quantization, where, and its names here."""
    found = ctx.listing("/models?found=1", args)
    if found is None:
        return
    rows = [
        [
            model["ref"],
            model.get("quantization") or "?",
            format_size(model["size"]),
            model["path"],
            f"refused: {model['problem']}" if model.get("problem") else ", ".join(model["in_store"]) or "-",
        ]
        for model in found
    ]
    table(ctx.out, ["import", "quantization", "size", "where", "in store"], rows)


def import_(ctx: Context, args: Namespace) -> None:
    """Bring C{args.source} into the store (as C{args.name}): linked, or copied where it must be."""
    source = args.source
    if not source.startswith(PREFIXES):  # a path: the daemon's, the same machine's when it is local
        source = os.path.abspath(source)
    body = {"from": source} | ({"name": args.name} if args.name else {})
    model = ctx.daemon.call("POST", "/models/import", body)
    report = model["import"]
    names = ", ".join(model["tags"])
    ctx.out.print(f"Imported {args.source} as {names}: {report['message']}", markup=False, highlight=False)
    for note in report["notes"]:
        ctx.out.print(f"  {note}", markup=False, highlight=False)
