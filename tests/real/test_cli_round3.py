"""What a new user trips on with the ``mrunner`` command (issue 36): the real command as a child,
against a daemon each test starts (the stand-in runner, or llama-server where the row is its own).

N2 a home without its daemon, N4 a context that fills mid-answer, N5 one context rule for every
load, N8 options anywhere and each command's usage, N9 run pulls and the chat's /help, N10 unload
and status in words, N15 a certificate the client does not trust, N16 ps columns, N17 Ollama's
context_length.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase, TestCase

from mrunner.cli.chat import CONTEXT_FULL, MAX_TOKENS, why_cut
from mrunner.cli.engines import not_loaded
from mrunner.cli.main import CommandParser, parser
from mrunner.testing.tinymodel import CONTEXT
from tests.support.cli_cases import MRUNNER, CLITestCase, Ran
from tests.support.daemon import InProcessDaemon, http, short_home, write_config
from tests.support.front_door import self_signed
from tests.support.hub_server import Repo, StandInHub
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase


async def mrunner(*args: str, env: dict[str, str]) -> Ran:
    out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
    return Ran(code, out.decode(), err.decode())


class PartsTests(SynchronousTestCase):
    """The decisions, without a process."""

    def test_every_positional_has_help(self) -> None:
        commands = next(a for a in parser()._actions if a.dest == "command")
        for name, command in commands.choices.items():  # type: ignore[attr-defined]
            self.assertIsInstance(command, CommandParser)
            for action in command._actions:
                if not action.option_strings:
                    self.assertTrue(action.help, f"mrunner {name} {action.dest}")

    def test_options_anywhere(self) -> None:
        args = parser().parse_args(["run", "ai/x", "--max-tokens", "0", "hi there"])
        self.assertEqual((args.model, args.prompt, args.max_tokens), ("ai/x", "hi there", 0))
        args = parser().parse_args(["rm", "--force", "ai/x"])
        self.assertEqual((args.model, args.force), ("ai/x", True))

    def test_why_an_answer_was_cut(self) -> None:
        self.assertEqual(why_cut(100, 100), MAX_TOKENS)
        self.assertEqual(why_cut(100, None), MAX_TOKENS, "no usage: the limit is the likely cause")
        self.assertEqual(why_cut(100, 15), CONTEXT_FULL)
        self.assertEqual(why_cut(0, None), CONTEXT_FULL, "no limit was asked for")

    def test_not_loaded(self) -> None:
        self.assertEqual(not_loaded("ai/nothing", []), "ai/nothing is not loaded: no model is")
        self.assertEqual(
            not_loaded("tiyn", ["ai/tiny:latest"]), "tiyn is not loaded; did you mean ai/tiny:latest?"
        )
        self.assertEqual(
            not_loaded("ai/nothing", ["ai/tiny:latest", "ai/smollm2:latest"]),
            "ai/nothing is not loaded (loaded: ai/tiny:latest, ai/smollm2:latest)",
        )


class HomeTests(TestCase):
    """N2: a home whose daemon is stopped or killed is said so; the default address is not tried."""

    async def test_a_home_without_its_daemon(self) -> None:
        """Stopped (no run/daemon.json) or killed (one naming a process that has ended): exit 1."""
        home = short_home(self)
        env = {k: v for k, v in os.environ.items() if k != "MRUNNER_HOST"} | {"MRUNNER_HOME": str(home)}
        for command in (("ls",), ("unload", "--all"), ("rm", "ai/smollm2")):
            ran = await mrunner(*command, env=env)
            self.assertEqual(ran.code, 1, ran)
            self.assertIn(f"no mrunner daemon is running for MRUNNER_HOME={home}", ran.err)
        (home / "run").mkdir()
        (home / "run" / "daemon.json").write_text('{"url": "http://127.0.0.1:9", "pid": 999999999}\n')
        ran = await mrunner("ls", env=env)
        self.assertEqual(ran.code, 1, ran)
        self.assertIn(f"the mrunner daemon of {home} is not running (it was stopped or killed", ran.err)


class UsageTests(CLITestCase):
    """N8: options anywhere, each command's own usage, and `mrunner` alone lists the commands."""

    async def test_options_anywhere_and_each_commands_usage(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        self.assertEqual(await self.ok("run", "tiny", "--max-tokens", "0", "hi"), "tok0 tok1 tok2 \n")
        self.assertNotIn("max_tokens", self.requests()[-1])
        for args, usage in [
            (("unload",), "usage: mrunner unload"),
            (("run", "tiny", "hi", "extra"), "usage: mrunner run"),
            (("run",), "usage: mrunner run"),
        ]:
            ran = await self.mrunner(*args)
            self.assertEqual(ran.code, 2, ran)
            self.assertIn(usage, ran.err)
        ran = await self.mrunner()
        self.assertEqual(ran.code, 2, ran)
        for command in ("pull", "run", "ps", "unload", "configure"):
            self.assertRegex(ran.err, rf"(?m)^    {command} ")


class RunPullsTests(CLITestCase):
    """N9: `run` pulls a model that is not in the store, with the pull's progress on stderr."""

    def config_text(self) -> str:
        self.hub = StandInHub({})
        self.addCleanup(lambda: ensureDeferred(self.hub.stop()))
        return f'[huggingface]\nendpoint = "{self.hub.start()}"\n'

    async def test_run_pulls_first(self) -> None:
        self.hub.add("team/tiny-gguf", Repo({"tiny-Q4_K_M.gguf": self.gguf.read_bytes()}))
        error = await self.fails("run", "--no-pull", "hf.co/team/tiny-gguf", "hi")
        self.assertIn("get it with `mrunner pull hf.co/team/tiny-gguf`", error)
        error = await self.fails("run", "hf.co/team/tiny-ggu", "hi")
        self.assertIn("hf.co/team/tiny-ggu is not in the store, and pulling it failed: ", error)
        ran = await self.mrunner("run", "hf.co/team/tiny-gguf", "hi")
        self.assertEqual((ran.code, ran.out), (0, "tok0 tok1 tok2 \n"), ran)
        self.assertIn("hf.co/team/tiny-gguf is not in the store: pulling it", ran.err)
        self.assertRegex(ran.err, r"(?m)^pull [0-9a-f]{12}: .* \(100%\)$")
        self.assertIn("Model pulled successfully", ran.err)
        self.assertIn("hf.co/team/tiny-gguf:latest", await self.ok("ls"))
        error = await self.fails("run", "hf.co/team/tiny-ggu", "hi")
        self.assertIn(
            "hf.co/team/tiny-ggu is not in the store (did you mean hf.co/team/tiny-gguf:latest?), and"
            " pulling it failed: ",
            error,
        )


class ChatHelpTests(CLITestCase):
    async def test_help_lists_the_commands(self) -> None:
        """N9: /help is the chat's, not a question for the model."""
        await self.daemon.import_model("tiny", self.gguf)
        chat = self.spawn("run", "tiny", terminal=True)
        seen = await chat.shows("/help lists the commands;")
        seen = await chat.shows("> ", seen)
        chat.type("/help\r")
        for text in ("/new", "/bye", "Ctrl-C"):
            await chat.shows(text, seen)
        seen = await chat.shows("> ", seen)
        chat.type("\x04")
        await chat.ended
        self.assertEqual(chat.code, 0, chat.output)
        self.assertFalse((self.home / "requests").exists(), "nothing was sent to the model")


class ContextFillsTests(CLITestCase):
    """N4: an answer the full context stops is said so at once, not as a --max-tokens stop."""

    def runner_args(self) -> tuple[str, ...]:
        return ("--context", "12")  # words: 10 of them leave room for 2 tokens

    async def test_said_when_it_happens(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        ran = await self.mrunner("run", "tiny", " ".join(["word"] * 10))
        self.assertEqual((ran.code, ran.out), (0, "tok0 tok1 \n"), ran)
        self.assertIn("[stopped: the model's context is full (12 tokens);", ran.err)
        self.assertIn("`mrunner configure tiny --context-size N` leaves more room]", ran.err)
        self.assertNotIn("--max-tokens", ran.err)
        ran = await self.mrunner("run", "tiny", "one two", "--max-tokens", "2")
        self.assertIn(
            "[stopped at 2 tokens: --max-tokens N allows more", ran.err, "the limit, not the context"
        )

        chat = self.spawn("run", "tiny", terminal=True)
        seen = await chat.shows("> ")
        chat.type(" ".join(["word"] * 10) + "\r")
        seen = await chat.shows("tok0 tok1 ", seen)
        seen = await chat.shows("the model's context is full (12 tokens); type /new to start a new", seen)
        await chat.shows("> ", seen)
        chat.type("\x04")
        await chat.ended
        self.assertEqual(chat.code, 0, chat.output)


class UnloadStatusPsTests(CLITestCase):
    """N10, N16, N17."""

    async def test_unload_status_and_ps_in_words(self) -> None:
        out = await self.ok("status")
        self.assertRegex(out, r"(?m)^test: installed \(.*\), no runner running$")
        self.assertEqual(await self.ok("ps"), "no models loaded\n")
        ran = await self.mrunner("unload", "ai/nothing")
        self.assertEqual((ran.code, ran.out), (1, ""), ran)  # issue 53 N9: the error alone
        self.assertIn("ai/nothing is not loaded: no model is", ran.err)

        await self.daemon.import_model("tiny", self.gguf)
        self.assertEqual(await self.ok("configure", "tiny", "--context-size", "64"), "tiny: configured\n")
        await self.ok("run", "tiny", "hi")
        self.assertRegex(await self.ok("status"), r"(?m)^test: installed \(.*\), 1 runner running$")
        listing = (await self.ok("ps")).splitlines()
        self.assertEqual(
            listing[0].split(),
            ["MODEL", "ID", "BACKEND", "MODE", "STATE", "MEMORY", "PROCESSOR", "CONTEXT", "UNTIL"],
        )
        self.assertRegex(listing[1], r"^ai/tiny:latest .* idle .* 100% CPU +64 +in \d+ minutes? *$")
        ollama = json.loads(await (await http.get(self.daemon.url + "/api/ps")).text())
        self.assertEqual([m["context_length"] for m in ollama["models"]], [64])

        ran = await self.mrunner("unload", "tiyn")
        self.assertEqual(ran.code, 1, ran)
        self.assertIn("tiyn is not loaded; did you mean ai/tiny:latest?", ran.err)
        self.assertEqual(await self.ok("unload", "tiny"), "Unloaded 1 runner\n")


class UntrustedCertificateTests(CLITestCase):
    """N15: a self-signed certificate is named, with how to trust it; trusted, it works."""

    def setUp(self) -> None:
        self.home = short_home(self)
        self.pem = self.home / "daemon.pem"
        self_signed(self.pem)
        self.daemon = InProcessDaemon(write_config(self.home), tls=self.pem)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))

    async def test_named_and_trusted(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "MRUNNER_CACERT")}
        ran = await mrunner("--host", self.daemon.url, "status", env=env)
        self.assertEqual(ran.code, 1, ran)
        self.assertIn(f"the mrunner daemon at {self.daemon.url} sent a certificate", ran.err)
        self.assertIn("self-signed certificate", ran.err)
        self.assertIn("--cacert FILE, MRUNNER_CACERT=FILE or SSL_CERT_FILE=FILE", ran.err)
        self.assertNotIn("twistd", ran.err, "the daemon runs: no word of starting it")
        for args, extra in [
            (("--cacert", str(self.pem)), {}),
            ((), {"MRUNNER_CACERT": str(self.pem)}),
            ((), {"SSL_CERT_FILE": str(self.pem)}),
        ]:
            ran = await mrunner("--host", self.daemon.url, *args, "status", env={**env, **extra})
            self.assertEqual(ran.code, 0, (args, extra, ran))
            self.assertIn(f"mrunner is running at {self.daemon.url}", ran.out)
        plain = self.daemon.url.replace("https://", "http://")
        ran = await mrunner("--host", plain, "status", env=env)
        self.assertEqual(ran.code, 1, ran)
        self.assertIn(f"if it listens with TLS (an ssl: endpoint), its address is {self.daemon.url}", ran.err)
        ran = await mrunner("--host", self.daemon.url, "--cacert", "/nonexistent.pem", "status", env=env)
        self.assertEqual(ran.code, 1, ran)
        self.assertIn("cannot read the certificates in --cacert /nonexistent.pem", ran.err)


class OneContextRuleTests(LlamaCppTestCase):
    """N5: a context_size above the model's trained one starts every runner with the trained one:
    the one _configure restarts and the next load after an unload alike; ps never stale for it."""

    async def test_both_loads_get_the_trained_context(self) -> None:
        await self.start()
        await self.tiny()
        code, _ = await self.post("/engines/_configure", {"model": TINY, "keep_alive": "10m"})
        self.assertEqual(code, 200)
        await self.load()
        first = await self.runner()
        code, answer = await self.post("/engines/_configure", {"model": TINY, "context_size": 4 * CONTEXT})
        self.assertEqual((code, answer["context_size"]), (200, CONTEXT), answer)
        self.assertIn("its runners are started with", answer["warning"])
        await self.load()
        restarted = await self.runner()
        self.assertNotEqual(restarted["pid"], first["pid"], "configure restarted it")
        await self.post("/engines/unload", {"all": True})
        await self.load()
        again = await self.runner()
        for runner in (restarted, again):
            self.assertEqual(runner["ctx_size"], CONTEXT)
            self.assertEqual(runner["memory_estimate"], first["memory_estimate"])
            self.assertEqual((runner["stale"], runner["context_size"]), (False, CONTEXT))
            self.assertEqual(runner["context_size_configured"], 4 * CONTEXT)

    async def load(self) -> None:
        body = {"model": TINY, "messages": []}
        response = await http.post(
            self.daemon.url + "/engines/v1/chat/completions", json=body, headers={"X-Preload-Only": "true"}
        )
        self.assertEqual(response.code, 200, await response.text())

    async def runner(self) -> dict[str, object]:
        """The one runner, as ps shows it, and the context of each of its slots
        (C{--kv-unified-per-slot}) its process was started with."""
        (runner,) = json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text())
        self.assertEqual(runner["state"], "ready")
        words = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().split(b"\0")
        return {**runner, "ctx_size": int(words[words.index(b"--kv-unified-per-slot") + 1])}
