"""``python -m bench.heads``: the two request-head parsers side by side, CPU per small chat.

Two daemons of the code as it stands, one reading heads with httptools and one
with twisted.web's own parser (``[http] head_parser``), each with its runner of
the tiny model, take wrk's small chats at 32 connections in alternating rounds:
once with wrk's three headers, once with the twenty the openai Python client
sends. A head's cost grows with its headers, so the second is what users' clients
pay. Prints the median CPU milliseconds per request of each daemon and their ratio;
then, with less noise, the CPU of the door's whole cycle alone (the head read, the
request built, a route that answers at once, the answer written), in this process.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.resource import Resource

from bench import daemon, inputs, wrk
from bench.rounds import interleave
from bench.servers import Target
from bench.settings import CHAT, Settings, chat
from mrunner.api.door.site import GatedSite
from mrunner.config import Config, HTTPConfig
from mrunner.testing.tinymodel import write_tiny_llama

MODEL = "bench/tiny"
PARSERS = ("twisted", "httptools")
#: What the openai Python client sends besides Host, Content-Type and Content-Length.
OPENAI_CLIENT = {
    "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate",
    "Authorization": "Bearer sk-no-key",
    "Connection": "keep-alive",
    "User-Agent": "OpenAI/Python 1.99.0",
    "X-Stainless-Arch": "x64",
    "X-Stainless-Async": "false",
    "X-Stainless-Lang": "python",
    "X-Stainless-OS": "Linux",
    "X-Stainless-Package-Version": "1.99.0",
    "X-Stainless-Read-Timeout": "600",
    "X-Stainless-Retry-Count": "0",
    "X-Stainless-Runtime": "CPython",
    "X-Stainless-Runtime-Version": "3.11.7",
}


def load(_: str, target: Target, lua: Path, seconds: float) -> wrk.Run:
    return wrk.run(target, CHAT, lua, 32, seconds)


class Answer(Resource):
    """A route that reads the body and answers at once: all else is the door's."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        request.content.read()
        return b"{}"


def door_cycle(head_parser: str, headers: dict[str, str], count: int = 5000) -> float:
    """CPU microseconds the door takes for one small chat on a kept-alive connection."""
    config = attrs.evolve(Config(), http=HTTPConfig(head_parser=head_parser))
    site = GatedSite(Answer(), config, MemoryReactorClock())
    transport = StringTransport(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 12434), peerAddress=IPv4Address("TCP", "127.0.0.1", 40000)
    )
    channel = site.buildProtocol(None)
    channel.makeConnection(transport)
    body = json.dumps(chat(MODEL, max_tokens=1, stream=False)).encode()
    fields = {"Host": "127.0.0.1:12434", "Content-Type": "application/json", **headers}
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    request = f"POST {CHAT} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    start = time.process_time()
    for _ in range(count):
        channel.dataReceived(request)
        transport.clear()
    return (time.process_time() - start) / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.heads", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="of each wrk run")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mrh-", dir="/tmp"))
    try:
        write_tiny_llama(tmp / "tiny.gguf")
        with ExitStack() as running:
            daemons = {}
            for name in PARSERS:
                lines = f'head_parser = "{name}"\n'
                server = inputs.llama_server()
                conf = daemon.llama_conf(server, Settings.parallel, Settings.threads, http=lines)
                daemons[name] = running.enter_context(daemon.started(tmp / name, conf, "llama.cpp"))
                daemon.import_model(daemons[name].url, MODEL, tmp / "tiny.gguf")
            body = chat(MODEL, max_tokens=1, stream=False)
            scripts = {
                "wrk's 3 headers": wrk.script(tmp, body),
                "the openai client's 17": wrk.script(tmp, body, OPENAI_CLIENT, "openai.lua"),
            }
            for lua in scripts.values():
                for target in daemons.values():
                    wrk.run(target, CHAT, lua, 32, 1.0)  # warm: the runner loaded, the caches filled
            for label, lua in scripts.items():
                runs = interleave(daemons, args.rounds, partial(load, lua=lua, seconds=args.seconds))
                cpu = {name: statistics.median(r.cpu_ms_per_request for r in runs[name]) for name in PARSERS}
                spread = {name: [round(r.cpu_ms_per_request, 3) for r in runs[name]] for name in PARSERS}
                print(
                    f"{label}: CPU ms/request twisted.web {cpu['twisted']:.3f},"
                    f" httptools {cpu['httptools']:.3f} ({cpu['httptools'] / cpu['twisted']:.3f}x);"
                    f" rounds {spread}"
                )
    finally:
        shutil.rmtree(tmp)
    for label, headers in (("wrk's 3 headers", {}), ("the openai client's 17", OPENAI_CLIENT)):
        cycle = {name: statistics.median(door_cycle(name, headers) for _ in range(3)) for name in PARSERS}
        print(
            f"{label}: the door's cycle alone, CPU us: twisted.web {cycle['twisted']:.0f},"
            f" httptools {cycle['httptools']:.0f} ({cycle['httptools'] / cycle['twisted']:.3f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
