"""``mrunner status``: the daemon's address, its backends' install states and runners, where it reads
registry logins, and its preloads."""

from __future__ import annotations

from argparse import Namespace
from collections import Counter

from mrunner.cli.context import Context
from mrunner.cli.errors import DaemonError
from mrunner.cli.output import plural, show_json


def status(ctx: Context, args: Namespace) -> None:
    """The daemon's address, each backend's install state and runners, where it reads registry logins,
    and the preloads; C{--json} carries the same."""
    statuses = ctx.daemon.call("GET", "/engines/status")
    running = Counter(
        runner["backend_name"] for runner in ctx.daemon.call("GET", "/engines/ps") if runner["pid"]
    )
    runners = {name: running[name] for name in statuses if not name.startswith("preload ")}
    docker_config = ctx.daemon.call("GET", "/version").get("docker_config")
    if args.json:
        found = {"url": ctx.daemon.url, "statuses": statuses, "runners": runners}
        show_json(ctx.out, found | {"registry_logins": docker_config})
        return
    ctx.out.print(f"mrunner is running at {ctx.daemon.url}", markup=False)
    for backend, text in statuses.items():
        state = install_state(text, runners.get(backend, 0))
        ctx.out.print(f"{backend}: {state}", markup=False, highlight=False)
    ctx.out.print(
        f"registry logins: read from {docker_config} (`mrunner login --help`)"
        if docker_config
        else "registry logins: [registry.auth] in tap.conf only",
        markup=False,
    )
    try:
        preloads = ctx.daemon.call("GET", "/ready")["preloads"]
    except DaemonError as e:
        if e.status != 503:
            raise
        ctx.out.print("preloads: still loading", markup=False)
        return
    for preload in preloads:
        if preload["state"] != "failed":  # a failed one is among the statuses above
            ctx.out.print(f"preload {preload['model']}: {preload['state']}", markup=False, highlight=False)


#: Docker Model Runner's install states (C{/engines/status}) in the words of the rest of C{status}. Only a
#: backend no request has asked for yet is not installed (the default one installs at start): its build,
#: cached or not, is found or made on that first request.
INSTALL_WORDS = {
    "Not Installed": "not installed yet (on its first request)",
    "Installing": "installing",
    "Error": "failed",
}


def install_state(text: str, runners: int) -> str:
    """A backend's install status in words: DMR's C{Running: llama.cpp b1} is "installed", with how
    many runners it has, since "Running" reads as a model running; the others in L{INSTALL_WORDS}."""
    state, _, detail = text.partition(": ")
    if state != "Running":
        word = INSTALL_WORDS.get(state, state)
        return f"{word}: {detail}" if detail else word
    version = f" ({detail})" if detail else ""
    running = "no runner" if not runners else plural(runners, "runner")
    return f"installed{version}, {running} running"
