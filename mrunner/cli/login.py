"""C{mrunner login REGISTRY} and C{mrunner logout REGISTRY}: credentials where C{docker login} keeps them.

That is the credential helper Docker's config names for the registry
(C{credHelpers}, else C{credsStore}), else C{auths} in the config file itself
(C{$DOCKER_CONFIG/config.json}, else C{~/.docker/config.json}); the daemon
reads them from there at its next pull or push. Neither command talks to the
daemon or the registry: the credentials are checked when they are first used.

That config is the one of the user who runs the command, in its environment;
the daemon reads its own user's (L{WHERE}), which C{mrunner status} names.
"""

from __future__ import annotations

import argparse
import getpass
import os
import subprocess
import sys
from pathlib import Path

from mrunner import docker_config
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError
from mrunner.docker_config import Credential, DockerConfigError

HELPER_TIMEOUT = 30.0  # a helper may ask for a GPG passphrase
#: What C{login --help} says of where the credentials go, and who reads them.
WHERE = (
    "The credentials go into the Docker config of the user running this command ($DOCKER_CONFIG/config.json,"
    " else ~/.docker/config.json, or the credential helper it names). The daemon reads the config of the"
    " user it runs as, in its own environment (`mrunner status` names the file): when it runs as another"
    " user, in a container or pod, or with another DOCKER_CONFIG, log in as that user with its DOCKER_CONFIG"
    " (in a pod: mount a config.json and point DOCKER_CONFIG at its directory), or set [registry.auth] in"
    " its tap.conf."
)


def registry(text: str) -> str:
    """A registry's host[:port] (lower-cased, as pulls name it); anything else is a usage error."""
    if not docker_config.is_registry_host(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a registry's host[:port] (such as localhost:5000 or registry.example.com)"
        )
    return text.lower()


def login(context: Context, args: argparse.Namespace) -> None:
    host = args.registry
    tty = sys.stdin.isatty()
    username = args.username or (input("Username: ") if tty else "")
    if not username:
        raise CommandError("login needs a username: give --username NAME (the password comes on stdin)")
    if tty and not args.password_stdin:
        password = getpass.getpass("Password: ")
    else:
        password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not password:
        raise CommandError("login needs a password (on standard input, or typed at the prompt)")
    credential = Credential(username, password)
    path, config = _config()
    helper = _helper_for(config, host)
    if helper:
        _helper(helper, "store", docker_config.helper_store_input(host, credential))
        where = docker_config.program(helper)
        credential = Credential(username, "")  # the file keeps a placeholder, as Docker's does
    else:
        where = str(path)
    docker_config.write(path, docker_config.with_auth(config, host, credential))
    context.out.print(f"Login for {host} stored in {where}", markup=False)


def logout(context: Context, args: argparse.Namespace) -> None:
    host = args.registry
    path, config = _config()
    helper = _helper_for(config, host)
    if helper:
        _helper(helper, "erase", docker_config.server_key(host).encode(), miss_ok=True)
    had = docker_config.stored(config, host) is not None or bool(helper)
    docker_config.write(path, docker_config.with_auth(config, host, None))
    context.out.print(f"Removed the login for {host}" if had else f"Not logged in to {host}", markup=False)


def _config() -> tuple[Path, dict[str, object]]:
    path = docker_config.config_path(os.environ)
    try:
        return path, docker_config.read(path)
    except DockerConfigError as e:
        raise CommandError(str(e)) from None


def _helper_for(config: dict[str, object], host: str) -> str | None:
    try:
        return docker_config.helper_for(config, host)
    except DockerConfigError as e:
        raise CommandError(f"{docker_config.config_path(os.environ)}: {e}") from None


def _helper(helper: str, action: str, request: bytes, miss_ok: bool = False) -> None:
    """Run C{docker-credential-HELPER ACTION} with C{request} on its stdin; its output is never shown."""
    name = docker_config.program(helper)
    try:
        done = subprocess.run(
            [name, action],
            input=request,
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            check=False,
            env=docker_config.helper_environment(os.environ),
        )
    except FileNotFoundError:
        raise CommandError(
            f"Docker's config names the credential helper {name}, which is not on PATH; install it"
            f" or remove it from {docker_config.config_path(os.environ)}"
        ) from None
    except subprocess.TimeoutExpired:
        raise CommandError(f"{name} {action} did not finish within {HELPER_TIMEOUT:g}s") from None
    if done.returncode != 0 and not (miss_ok and docker_config.is_miss(done.stdout + done.stderr)):
        raise CommandError(f"{name} {action} failed (exit code {done.returncode})")
