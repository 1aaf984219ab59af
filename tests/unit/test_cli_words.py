"""What the commands say, against a recorded daemon (issue 53: N8, N9, N10, N12, N14): no process."""

from __future__ import annotations

import io
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

from rich.console import Console
from twisted.trial.unittest import SynchronousTestCase

from mrunner.cli import engines, models, status
from mrunner.cli.context import Context
from mrunner.cli.errors import CommandError, DaemonError
from mrunner.cli.main import parser


class RecordedDaemon:
    """Answers each C{(method, path)} from C{answers}; a callable answer is given the body."""

    url = "http://127.0.0.1:12434"

    def __init__(self, answers: dict[tuple[str, str], Any]):
        self.answers = answers

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        answer = self.answers[method, path.partition("?")[0]]
        return answer(body) if callable(answer) else answer


class Said:
    """A command's context over C{daemon}, and what it printed."""

    def __init__(self, daemon: RecordedDaemon):
        self.out, self.err = io.StringIO(), io.StringIO()
        console = Console(file=self.out, width=200, highlight=False)
        self.context = Context(lambda: daemon, console, Console(file=self.err, width=200))  # type: ignore[arg-type, return-value]


def unloading(loaded: list[str]) -> RecordedDaemon:
    def unload(body: dict[str, Any]) -> dict[str, int]:
        return {"unloaded_runners": len(loaded) if body.get("all") else int(body["models"][0] in loaded)}

    ps = [{"model_name": name} for name in loaded]
    return RecordedDaemon({("POST", "/engines/unload"): unload, ("GET", "/engines/ps"): ps})


class UnloadTests(SynchronousTestCase):
    """N9: nothing unloaded is said once, as an error; not "Unloaded 0 runners" beside it."""

    def test_not_loaded_is_the_error_alone(self) -> None:
        said = Said(unloading([]))
        error = self.assertRaises(
            CommandError, engines.unload, said.context, Namespace(all=False, models=["smollm"])
        )
        self.assertIn("smollm is not loaded", str(error))
        self.assertEqual(said.out.getvalue(), "")

    def test_what_was_unloaded(self) -> None:
        said = Said(unloading(["ai/tiny"]))
        engines.unload(said.context, Namespace(all=False, models=["ai/tiny"]))
        self.assertEqual(said.out.getvalue(), "Unloaded 1 runner\n")
        said = Said(unloading([]))
        engines.unload(said.context, Namespace(all=True, models=[]))
        self.assertEqual(said.out.getvalue(), "Unloaded 0 runners\n", "--all with none: not an error")

    def test_some_loaded_some_not(self) -> None:
        said = Said(unloading(["ai/tiny"]))
        self.assertRaises(
            CommandError, engines.unload, said.context, Namespace(all=False, models=["ai/tiny", "x"])
        )
        self.assertEqual(said.out.getvalue(), "Unloaded 1 runner\n")


STATUSES = {
    "llama.cpp": "Running: llama.cpp b1",
    "whisper.cpp": "Not Installed",
    "preload ai/x": "Error: gone",
}


def status_daemon() -> RecordedDaemon:
    return RecordedDaemon(
        {
            ("GET", "/engines/status"): STATUSES,
            ("GET", "/engines/ps"): [
                {"backend_name": "llama.cpp", "pid": 7},
                {"backend_name": "llama.cpp", "pid": None},
            ],
            ("GET", "/version"): {"docker_config": "/home/me/.docker/config.json"},
            ("GET", "/ready"): {"preloads": []},
        }
    )


class StatusTests(SynchronousTestCase):
    """N10: one wording for every install state; C{--json} carries the runners and the registry logins."""

    def test_words(self) -> None:
        said = Said(status_daemon())
        status.status(said.context, Namespace(json=False))
        lines = said.out.getvalue().splitlines()
        self.assertIn("llama.cpp: installed (llama.cpp b1), 1 runner running", lines)
        self.assertIn("whisper.cpp: not installed yet (on its first request)", lines)
        self.assertIn("preload ai/x: failed: gone", lines)
        self.assertIn(
            "registry logins: read from /home/me/.docker/config.json (`mrunner login --help`)", lines
        )

    def test_json(self) -> None:
        said = Said(status_daemon())
        status.status(said.context, Namespace(json=True))
        self.assertEqual(
            json.loads(said.out.getvalue()),
            {
                "url": RecordedDaemon.url,
                "statuses": STATUSES,
                "runners": {"llama.cpp": 1, "whisper.cpp": 0},
                "registry_logins": "/home/me/.docker/config.json",
            },
        )


class PluralTests(SynchronousTestCase):
    """N12: one of a thing is singular."""

    def test_df(self) -> None:
        usage = {"models_disk_usage": 0, "backends_disk_usage": {}, "prompt_cache_files": 1}
        said = Said(RecordedDaemon({("GET", "/engines/df"): usage}))
        engines.df(said.context, Namespace(json=False))
        self.assertIn("prompt cache (1 saved state) ", said.out.getvalue())


class CommandListTests(SynchronousTestCase):
    """N14: C{mrunner} alone lists every command, C{wait} among them."""

    def test_every_command_listed(self) -> None:
        text = parser().format_help().partition("commands:")[2]
        commands = next(a for a in parser()._actions if a.dest == "command")
        for name in commands.choices:  # type: ignore[attr-defined]
            self.assertRegex(text, rf"(?m)^    (\w+ \()?{name}\b", name)
        self.assertRegex(text, r"(?m)^    wait +wait until the daemon answers")


class PackageTests(SynchronousTestCase):
    """N8: the key is checked before the upload, not after every byte of it."""

    def package(self, overview: Any) -> RecordedDaemon:
        gguf = Path(self.mktemp())
        gguf.write_bytes(b"GGUF" + bytes(60))
        uploads: list[Any] = []
        daemon = RecordedDaemon(
            {
                ("GET", "/engines/overview"): overview,
                ("POST", "/models/load"): lambda body: uploads.append(body),
            }
        )
        args = Namespace(
            model="ai/x",
            gguf=str(gguf),
            whisper=None,
            license=[],
            mmproj=None,
            chat_template=None,
            context_size=None,
        )
        try:
            models.package(Said(daemon).context, args)
        finally:
            self.assertEqual(uploads, [], "nothing was uploaded")
        return daemon

    def test_a_refused_key(self) -> None:
        def refused(body: Any) -> Any:
            raise DaemonError(401, "this mrunner requires an API key", None)

        self.assertRaises(DaemonError, self.package, refused)

    def test_a_key_that_is_no_admins(self) -> None:
        error = self.assertRaises(CommandError, self.package, {"key": "ops", "admin": False})
        self.assertIn("key 'ops' may not add models: packaging takes an admin key", str(error))
