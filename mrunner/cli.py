"""``mrunner``: a small command line that talks to a running daemon over HTTP, nothing else."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO

DEFAULT_URL = "http://127.0.0.1:12434"


class Daemon:
    """The daemon's HTTP API, as plain blocking calls."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        data: BinaryIO | None = None,
        length: int | None = None,
    ) -> Any:
        headers = {}
        payload: Any = data
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if length is not None:
            headers["Content-Length"] = str(length)
        request = urllib.request.Request(self.url + path, payload, headers, method=method)
        try:
            with urllib.request.urlopen(request) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            raise SystemExit(f"mrunner: {e.code}: {error_message(e.read())}") from None
        except urllib.error.URLError as e:
            raise SystemExit(f"mrunner: cannot reach the daemon at {self.url}: {e.reason}") from None
        try:
            return json.loads(text)
        except ValueError:
            return [json.loads(line) for line in text.splitlines() if line.strip()] or text

    def has_model(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/models/{urllib.parse.quote(name)}"):
                return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise SystemExit(f"mrunner: {e.code}: {error_message(e.read())}") from None

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health"):
                    return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"mrunner: no daemon answered at {self.url}") from None
                time.sleep(0.2)


def error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mrunner", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("MRUNNER_URL", DEFAULT_URL))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="backend install status")
    commands.add_parser("list", help="models in the store")
    commands.add_parser("ps", help="running runners")
    wait = commands.add_parser("wait", help="wait until the daemon answers")
    wait.add_argument("--timeout", type=float, default=60)
    load = commands.add_parser("import", help="import a GGUF file as NAME (skipped if NAME exists)")
    load.add_argument("name")
    load.add_argument("file")
    pull = commands.add_parser("pull", help="pull a model from a registry")
    pull.add_argument("ref")
    run = commands.add_parser("run", help="one chat message to MODEL")
    run.add_argument("model")
    run.add_argument("prompt")
    unload = commands.add_parser("unload", help="unload MODEL's runners, or all")
    unload.add_argument("models", nargs="*")
    args = parser.parse_args(argv)
    daemon = Daemon(args.url)

    if args.command == "wait":
        daemon.wait(args.timeout)
        return
    if args.command == "import":
        if daemon.has_model(args.name):
            print(f"{args.name} is already in the store")
            return
        with open(args.file, "rb") as f:
            query = urllib.parse.urlencode({"name": args.name})
            model = daemon.call("POST", f"/models/load?{query}", data=f, length=os.fstat(f.fileno()).st_size)
        print(f"imported {args.file} as {', '.join(model['tags'])} ({model['id']})")
        return
    elif args.command == "run":
        reply = daemon.call(
            "POST",
            "/engines/v1/chat/completions",
            {
                "model": args.model,
                "messages": [{"role": "user", "content": args.prompt}],
            },
        )
        print(reply["choices"][0]["message"]["content"])
        return
    else:
        result = {
            "status": lambda: daemon.call("GET", "/engines/status"),
            "list": lambda: daemon.call("GET", "/models"),
            "ps": lambda: daemon.call("GET", "/engines/ps"),
            "pull": lambda: daemon.call("POST", "/models/create", {"from": args.ref}),
            "unload": lambda: daemon.call(
                "POST", "/engines/unload", {"models": args.models, "all": not args.models}
            ),
        }[args.command]()
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
