"""``mrunner transcribe FILE --model NAME [--format srt]``: speech to text through the daemon's
C{/v1/audio/transcriptions} (or C{/v1/audio/translations} with C{--translate}), the answer printed
as the daemon gives it: the text, or SRT, WebVTT or JSON."""

from __future__ import annotations

import json
import os
from argparse import Namespace
from pathlib import Path

from mrunner.cli.client import read
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError

FORMATS = ("text", "srt", "vtt", "json", "verbose_json")


def form(fields: dict[str, str], audio: Path) -> tuple[bytes, str]:
    """A C{multipart/form-data} body of C{fields} and the file C{audio}, and its content type."""
    boundary = os.urandom(12).hex()
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    try:
        data = audio.read_bytes()
    except OSError as e:
        raise CommandError(f"cannot read {audio}: {e.strerror}") from None
    filename = json.dumps(audio.name)  # quoted, its own quotes escaped
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename={filename}\r\n\r\n'
    body = b"".join([*parts, head.encode(), data, f"\r\n--{boundary}--\r\n".encode()])
    return body, f"multipart/form-data; boundary={boundary}"


def transcribe(ctx: Context, args: Namespace) -> None:
    fields = {"model": args.model, "response_format": args.format}
    if args.language:
        fields["language"] = args.language
    body, content_type = form(fields, Path(args.file))
    task = "translations" if args.translate else "transcriptions"
    headers = {"Content-Type": content_type}
    with ctx.daemon.open("POST", f"/v1/audio/{task}", data=body, headers=headers) as answer:
        text = read(answer).decode("utf-8", errors="replace")
    ctx.out.file.write(text if text.endswith("\n") else text + "\n")
    ctx.out.file.flush()
