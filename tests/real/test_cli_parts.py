"""Parts of the command line and of ``GET /logs`` that need no process: tar streams, plain progress,
error hints, names, and following log files."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import tarfile
from pathlib import Path

from rich.console import Console
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.logger import Logger, LogPublisher
from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.observe.logs import LogsAPI
from mrunner.cli.chat import DEFAULT_MAX_TOKENS
from mrunner.cli.client import find_host
from mrunner.cli.engines import state
from mrunner.cli.errors import START_HINT, CommandError, DaemonError, explain
from mrunner.cli.main import joined, parser
from mrunner.cli.models import split_tag
from mrunner.cli.output import ago
from mrunner.cli.package import TarStream, members
from mrunner.cli.progress import PlainLayers
from mrunner.daemon.listening import url_of
from mrunner.daemon.logfiles import DaemonLogFile, LogTail
from mrunner.home import Home
from mrunner.values.sizes import format_size


def untar(data: bytes) -> dict[str, bytes]:
    """The files in the tar C{data}, by name, in order, as the standard library reads them."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]


class PackageTests(SynchronousTestCase):
    def test_the_stream_is_a_package_of_the_announced_length(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        gguf, license = directory / "w.gguf", directory / "LICENSE"
        gguf.write_bytes(bytes(range(256)) * 5)  # not a multiple of the tar block
        license.write_text("MIT\n")
        stream = TarStream(members(gguf, [license]))
        sent: list[int] = []
        data = b"".join(stream.chunks(sent.append))
        self.assertEqual(len(data), stream.length)
        self.assertEqual(sent[-1], stream.length)
        self.assertEqual(untar(data), {"model.gguf": gguf.read_bytes(), "licenses/0-LICENSE": b"MIT\n"})

    def test_a_missing_file_is_named(self) -> None:
        error = self.assertRaises(CommandError, TarStream, members(Path("/nonexistent.gguf"), []))
        self.assertIn("/nonexistent.gguf", str(error))

    def test_the_first_shard_brings_the_whole_set_in_order(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        paths = [directory / f"big-Q4_K_M-{n:05d}-of-00003.gguf" for n in (1, 2, 3)]
        for n, path in enumerate(paths):
            path.write_bytes(b"shard %d" % n)
        projector, template = directory / "mmproj-big-f16.gguf", directory / "chat.jinja"
        projector.write_bytes(b"projector")
        template.write_text("{{ messages }}")
        data = b"".join(TarStream(members(paths[0], [], projector, template)).chunks(lambda _: None))
        self.assertEqual(
            list(untar(data).items()),
            [
                ("model-00001-of-00003.gguf", b"shard 0"),
                ("model-00002-of-00003.gguf", b"shard 1"),
                ("model-00003-of-00003.gguf", b"shard 2"),
                ("mmproj/mmproj-big-f16.gguf", b"projector"),
                ("chat-template/chat.jinja", b"{{ messages }}"),
            ],
        )

    def test_a_shard_set_must_be_whole_and_given_by_its_first(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        for n in (1, 3):
            (directory / f"big-{n:05d}-of-00003.gguf").write_bytes(b"x")
        error = self.assertRaises(CommandError, members, directory / "big-00001-of-00003.gguf", [])
        self.assertIn("big-00002-of-00003.gguf", str(error))
        error = self.assertRaises(CommandError, members, directory / "big-00003-of-00003.gguf", [])
        self.assertIn("give the first shard", str(error))


class NameTests(SynchronousTestCase):
    def test_split_tag(self) -> None:
        self.assertEqual(split_tag("team/tiny:v1"), ("team/tiny", "v1"))
        self.assertEqual(split_tag("host:5000/team/tiny"), ("host:5000/team/tiny", "latest"))
        self.assertEqual(split_tag("host:5000/team/tiny:v2"), ("host:5000/team/tiny", "v2"))
        self.assertEqual(split_tag("tiny"), ("tiny", "latest"))


class OutputTests(SynchronousTestCase):
    def test_plain_progress_is_a_few_lines_per_layer(self) -> None:
        out = io.StringIO()
        layers = PlainLayers(Console(file=out, width=200), "pull")
        for current in range(0, 1001, 50):
            layers.update("sha256:" + "ab" * 32, 1000, current)
        layers.update("sha256:" + "cd" * 32, 7, 7)
        self.assertEqual(
            out.getvalue().splitlines(),
            [
                "pull abababababab: 0 B of 1000 B (0%)",
                "pull abababababab: 250 B of 1000 B (25%)",
                "pull abababababab: 500 B of 1000 B (50%)",
                "pull abababababab: 750 B of 1000 B (75%)",
                "pull abababababab: 1000 B of 1000 B (100%)",
                "pull cdcdcdcdcdcd: 7 B of 7 B (100%)",
            ],
        )

    def test_runner_states(self) -> None:
        self.assertEqual(
            [
                state({"state": "loading", "in_use": 0}),
                state({"state": "draining", "in_use": 2}),
                state({"state": "ready", "in_use": 0}),
                state({"state": "ready", "in_use": 3}),
            ],
            ["loading", "draining", "idle", "serving 3"],
        )

    def test_sizes_and_times(self) -> None:
        self.assertEqual(
            [format_size(n) for n in (0, 1023, 1536, 3 * 1024**3)], ["0 B", "1023 B", "1.50 KiB", "3.00 GiB"]
        )
        self.assertEqual(
            [ago(100 - s, 100) for s in (0.5, 1, 120, 7200)],
            ["just now", "1 second ago", "2 minutes ago", "2 hours ago"],
        )

    def test_error_hints(self) -> None:
        missing = DaemonError(404, "model x not found locally", "model_not_found")
        self.assertIn("`mrunner pull ai/x`", explain(missing, "run", "ai/x"))
        remote = DaemonError(404, "model ai/x not found in registry r", "model_not_found")
        self.assertEqual(explain(remote, "pull", "ai/x"), "model ai/x not found in registry r (HTTP 404)")
        tags = DaemonError(409, "model x is tagged a, b; delete with force=true", "model_has_several_tags")
        self.assertEqual(
            explain(tags, "rm", "x"),
            "model x is tagged a, b: `mrunner rm --force x` removes it under all of them",
        )
        self.assertEqual(explain(CommandError("plain"), "ls", None), "plain")


class LogTailTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.dir.mkdir()

    def append(self, name: str, text: str) -> None:
        with (self.dir / name).open("a") as f:
            f.write(text)

    def test_daemon_first_then_runners_complete_lines_only(self) -> None:
        self.append("b-completion.log", "runner says\npartial")
        self.append("daemon.log", "daemon says\n")
        self.append("daemon.log.1", "rotated, not shown\n")
        tail = LogTail(self.dir)
        self.assertEqual(tail.read(), [("daemon", "daemon says"), ("b-completion", "runner says")])
        self.assertEqual(tail.read(), [])
        self.append("b-completion.log", " line\n")
        self.append("a-embedding.log", "new runner\n")
        self.assertEqual(tail.read(), [("a-embedding", "new runner"), ("b-completion", "partial line")])

    def test_backlog_starts_at_a_whole_line_and_rotation_starts_over(self) -> None:
        self.append("daemon.log", "first line\nsecond line\n")
        tail = LogTail(self.dir, backlog=15)
        self.assertEqual(tail.read(), [("daemon", "second line")])
        (self.dir / "daemon.log").write_text("after rotation\n")
        self.assertEqual(tail.read(), [("daemon", "after rotation")])

    def test_no_directory_yet(self) -> None:
        self.assertEqual(LogTail(self.dir / "missing").read(), [])


class LogsAPITests(SynchronousTestCase):
    def test_lines_tagged_with_their_source(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "daemon.log").write_text("started\n")
        (directory / "m-completion.log").write_text("loading\nready\n")
        http = StubTreq(LogsAPI(directory, Clock()).app.resource())
        response = self.successResultOf(http.get("http://x/logs"))
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/plain; charset=utf-8"])
        self.assertEqual(
            self.successResultOf(response.text()),
            "[daemon] started\n[m-completion] loading\n[m-completion] ready\n",
        )

    def test_one_source(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "daemon.log").write_text("started\n")
        (directory / "ai_m_latest-completion.log").write_text("chat\n")
        (directory / "ai_m_latest-embedding.log").write_text("vectors\n")
        (directory / "ai_other_latest-completion.log").write_text("other\n")
        http = StubTreq(LogsAPI(directory, Clock()).app.resource())

        def text(query: str) -> tuple[int, str]:
            response = self.successResultOf(http.get("http://x/logs?" + query))
            return response.code, self.successResultOf(response.text())

        expected = "[ai_m_latest-completion] chat\n[ai_m_latest-embedding] vectors\n"
        self.assertEqual(text("source=m"), (200, expected))
        self.assertEqual(text("source=ai/m:latest"), (200, expected))
        self.assertEqual(text("source=daemon"), (200, "[daemon] started\n"))
        code, body = text("source=nothing")
        self.assertEqual(code, 404)
        self.assertIn("ai_m_latest-completion", json.loads(body)["error"]["message"])

    def test_json_lines_read_as_text(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        publisher = LogPublisher()
        home = Home(directory)
        log_file = DaemonLogFile(home, publisher, json=True)
        log_file.startService()
        Logger(observer=publisher).info("runner {model} ready", model="ai/m")
        log_file.stopService()
        (line,) = (directory / "logs" / "daemon.log").read_text().split("\n")[:-1]
        self.assertEqual(json.loads(line.lstrip("\x1e"))["model"], "ai/m")
        ((source, text),) = LogTail(directory / "logs").read()
        self.assertEqual(source, "daemon")
        self.assertTrue(text.endswith("runner ai/m ready"), text)

    def test_follow_ends_when_the_daemon_stops(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        clock = Clock()
        logs = LogsAPI(directory, clock)
        logs.startService()
        http = StubTreq(logs.app.resource())
        response = self.successResultOf(http.get("http://x/logs?follow=true"))
        body = response.text()
        (directory / "daemon.log").write_text("later\n")
        clock.advance(1)
        self.assertNoResult(body)
        logs.stopService()
        http.flush()
        self.assertEqual(self.successResultOf(body), "[daemon] later\n")
        self.assertEqual(clock.getDelayedCalls(), [])


class CommandLineTests(SynchronousTestCase):
    """How C{mrunner}'s words are read, before any daemon is asked."""

    def parse(self, *argv: str) -> argparse.Namespace:
        return parser().parse_args(joined(argv))

    def test_global_options_go_before_or_after_the_command(self) -> None:
        """As docker takes them: C{mrunner ls --api-key X} is C{mrunner --api-key X ls}."""
        for argv in (("ls", "--api-key", "k", "--host", "h:1"), ("--api-key", "k", "--host", "h:1", "ls")):
            args = self.parse(*argv)
            self.assertEqual((args.api_key, args.host, args.command), ("k", "h:1", "ls"), argv)
        args = self.parse("--api-key", "before", "ps")
        self.assertEqual(args.api_key, "before", "an option before the command is not reset after it")

    def test_runtime_flags_may_start_with_dashes(self) -> None:
        """The README's C{--runtime-flags "--flash-attn"}, not only C{--runtime-flags=--flash-attn}."""
        for value in ("--flash-attn", "--temp 0.2", "-c 512"):
            args = self.parse("configure", "ai/x", "--runtime-flags", value, "--keep-alive", "5m")
            self.assertEqual((args.runtime_flags, args.keep_alive), (value, "5m"))
        self.assertEqual(self.parse("configure", "ai/x", "--runtime-flags=--jinja").runtime_flags, "--jinja")

    def test_run_has_a_token_limit_by_default(self) -> None:
        self.assertEqual(self.parse("run", "ai/x", "hi").max_tokens, DEFAULT_MAX_TOKENS)
        self.assertEqual(self.parse("run", "ai/x", "--max-tokens", "0").max_tokens, 0)

    def test_the_host_is_the_one_the_daemon_wrote(self) -> None:
        """Without --host or MRUNNER_HOST, the address in $MRUNNER_HOME/run/daemon.json while the
        daemon that wrote it lives; never the default address (another daemon's) for a home named
        by MRUNNER_HOME, or whose daemon was killed."""
        home = Home(Path(self.mktemp()))
        home.prepare()
        environ = {"MRUNNER_HOME": str(home.root)}
        error = self.assertRaises(CommandError, find_host, None, environ)
        self.assertEqual(
            str(error),
            f"no mrunner daemon is running for MRUNNER_HOME={home.root}: {START_HINT}, or point"
            " --host / MRUNNER_HOST at another daemon",
        )
        home.address.write_text('{"url": "unix:/tmp/api.sock", "pid": 1}\n')
        self.assertEqual(find_host(None, environ), "unix:/tmp/api.sock")
        self.assertEqual(find_host(None, {**environ, "MRUNNER_HOST": "h:2"}), "h:2")
        self.assertEqual(find_host("h:3", environ), "h:3")
        gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, check=True).stdout
        home.address.write_text(f'{{"url": "http://127.0.0.1:9", "pid": {int(gone)}}}\n')
        error = self.assertRaises(CommandError, find_host, None, environ)
        self.assertIn(f"the mrunner daemon of {home.root} is not running (it was stopped", str(error))
        self.assertEqual(find_host(None, {**environ, "MRUNNER_HOST": "h:2"}), "h:2")

    def test_the_url_of_a_listening_port(self) -> None:
        self.assertEqual(url_of("tcp:0", IPv4Address("TCP", "0.0.0.0", 5)), "http://127.0.0.1:5")
        self.assertEqual(url_of("tcp6:0", IPv6Address("TCP", "::", 5)), "http://[::1]:5")
        self.assertEqual(url_of("tcp6:0", IPv6Address("TCP", "fe80::1", 5)), "http://[fe80::1]:5")
        self.assertEqual(
            url_of("ssl:5:privateKey=k", IPv4Address("TCP", "127.0.0.2", 5)), "https://127.0.0.2:5"
        )
        self.assertEqual(url_of("unix:/r/a.sock", UNIXAddress(b"/r/a.sock")), "unix:/r/a.sock")

    def test_a_missing_name_shows_the_daemons_guess(self) -> None:
        error = DaemonError(
            404,
            "model ai/smolm2:latest not found locally (did you mean ai/smollm2:latest?); pull it first",
            "model_not_found",
        )
        self.assertEqual(
            explain(error, "run", "ai/smolm2"),
            "model ai/smolm2 is not here; did you mean ai/smollm2:latest? Else get it with"
            " `mrunner pull ai/smolm2` (`mrunner ls` lists what is)",
        )
