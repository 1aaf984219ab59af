"""The real ``mrunner`` command against a daemon each test starts, with the stand-in runner backend.

These run real processes on the real reactor: the daemon in this process, the
command as a child (through pipes, or a pseudo-terminal where a person would
type), and Debian's docker-registry for pull and push. Each command takes
well under a second.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

import mrunner
from mrunner.cli.chat import DEFAULT_MAX_TOKENS
from mrunner.store.local import ModelStore
from tests.support.cli_cases import MRUNNER, WAIT, CLITestCase
from tests.support.daemon import (
    InProcessDaemon,
    eventually,
    free_port,
    http,
    lines,
    short_home,
    sleep,
    write_config,
)
from tests.support.ggufs import flip_last_byte, write_tiny_gguf
from tests.support.hub_server import Repo, StandInHub
from tests.support.registry_server import SKIP, RealRegistry


class DaemonCommandTests(CLITestCase):
    async def test_status_and_version(self) -> None:
        out = await self.ok("status")
        self.assertIn(f"mrunner is running at {self.daemon.url}", out)
        self.assertIn("test: installed (", out)
        self.assertNotIn("preload", out, "none configured")
        found = json.loads(await self.ok("status", "--json"))
        self.assertTrue(found["statuses"]["test"].startswith("Running"))
        self.assertEqual(found["runners"]["test"], 0)
        self.assertIn("registry_logins", found)
        out = await self.ok("version")
        self.assertIn(f"mrunner client {mrunner.__version__}", out)
        self.assertIn(f"mrunner daemon {mrunner.__version__}", out)

    async def test_no_daemon_says_how_to_start_one(self) -> None:
        for args in (("status",), ("ls",), ("pull", "ai/smollm2"), ("run", "ai/smollm2", "hi")):
            error = await self.fails("--host", f"127.0.0.1:{free_port()}", *args)
            self.assertIn("cannot reach the mrunner daemon", error)
            self.assertIn("twistd -n mrunner", error)

    async def test_usage_errors_exit_2(self) -> None:
        for args in [
            (),
            ("frobnicate",),
            ("unload",),
            ("unload", "tiny", "--all"),
            ("package", "tiny"),
            ("package", "--gguf", str(self.gguf), "--context-size", "0", "tiny"),
        ]:
            ran = await self.mrunner(*args)
            self.assertEqual(ran.code, 2, args)
            self.assertIn("usage: mrunner", ran.err)

    async def test_run_ps_df_unload(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        self.assertEqual(await self.ok("run", "tiny", "What is 2+2?"), "tok0 tok1 tok2 \n")
        self.assertEqual(self.requests()[-1]["messages"], [{"role": "user", "content": "What is 2+2?"}])
        self.assertTrue(self.requests()[-1]["stream"])
        await self.ok("run", "tiny", stdin=b"piped question")
        self.assertEqual(self.requests()[-1]["messages"], [{"role": "user", "content": "piped question"}])

        listing = (await self.ok("ps")).splitlines()
        self.assertEqual(
            listing[0].split(),
            ["MODEL", "ID", "BACKEND", "MODE", "STATE", "MEMORY", "PROCESSOR", "CONTEXT", "UNTIL"],
        )
        self.assertEqual(
            listing[1].split()[:5], ["ai/tiny:latest", listing[1].split()[1], "test", "completion", "idle"]
        )
        self.assertRegex(listing[1], r"in \d+ minutes? *$")  # keep_alive 5m from the last answer
        self.assertEqual(
            [r["model_name"] for r in json.loads(await self.ok("ps", "--json"))], ["ai/tiny:latest"]
        )
        disk = await self.ok("df")
        self.assertRegex(disk, r"models +25\d\.\d+ KiB")
        self.assertIn("backend test", disk)
        self.assertIn("models_disk_usage", json.loads(await self.ok("df", "--json")))

        self.assertEqual(await self.ok("unload", "tiny"), "Unloaded 1 runner\n")
        self.assertEqual(json.loads(await self.ok("ps", "--json")), [])
        self.assertEqual(await self.ok("unload", "--all"), "Unloaded 0 runners\n")

    async def test_run_stops_at_max_tokens_and_says_so(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        await self.ok("run", "tiny", "hi")
        self.assertEqual(self.requests()[-1]["max_tokens"], DEFAULT_MAX_TOKENS)
        ran = await self.mrunner("run", "tiny", "hi", "--max-tokens", "2")
        self.assertEqual((ran.code, ran.out), (0, "tok0 tok1 \n"))
        self.assertIn("[stopped at 2 tokens: --max-tokens N allows more, 0 no limit]", ran.err)
        await self.ok("run", "--max-tokens", "0", "tiny", "hi")
        self.assertNotIn("max_tokens", self.requests()[-1])

    async def test_without_host_it_finds_the_daemon_of_its_home(self) -> None:
        """No --host, no MRUNNER_HOST: the address the daemon wrote in $MRUNNER_HOME, whatever its port."""
        env = {k: v for k, v in os.environ.items() if k != "MRUNNER_HOST"}
        env["MRUNNER_HOME"] = str(self.home)
        out, err, code = await getProcessOutputAndValue(MRUNNER, ["status"], env=env, reactor=reactor)
        self.assertEqual(code, 0, err)
        self.assertIn(f"mrunner is running at {self.daemon.url}", out.decode())
        args = ["wait", "--pid", str(os.getpid())]  # the daemon runs in this process
        out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
        self.assertEqual((code, out.decode()), (0, self.daemon.url + "\n"), err)
        ended = await getProcessOutputAndValue("/bin/sh", ["-c", "sh -c 'exit 3' & echo $!; wait"])
        args = ["wait", "--pid", ended[0].decode().strip()]
        out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
        self.assertEqual((code, out), (1, b""))
        self.assertIn("ended before it answered", err.decode())

    async def test_configure_pin_and_reload(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        self.assertEqual(await self.ok("configure", "tiny", "--pin"), "tiny: configured\n")
        await self.ok("run", "tiny", "hi")
        listing = (await self.ok("ps")).splitlines()
        self.assertRegex(listing[1], r" idle, pinned .* forever *$")
        self.assertEqual(await self.ok("reload"), "Reloaded tap.conf\n")

    async def test_missing_model_suggests_pull(self) -> None:
        for args in (
            ("run", "--no-pull", "nothere", "hi"),
            ("inspect", "nothere"),
            ("rm", "nothere"),
            ("push", "nothere"),
        ):
            self.assertIn("get it with `mrunner pull nothere`", await self.fails(*args), args)
        await self.daemon.import_model("tiny", self.gguf)
        error = await self.fails("run", "--no-pull", "tiyn", "hi")
        self.assertIn("did you mean ai/tiny:latest? Else get it with", error)

    async def test_logs(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        await self.ok("run", "tiny", "hi")
        out = await self.ok("logs")
        self.assertRegex(out, r"(?m)^\[daemon\] .*stored model sha256:")
        # Issue 53 N11: each runner line after the time it was written, as the daemon's.
        self.assertRegex(out, r"(?m)^\[ai_tiny_latest-completion\] \S+T\S+ --- mrunner: .*runner_program\.py")

        follow = self.spawn("logs", "--follow")
        seen = await follow.shows("[daemon]")
        await self.ok("unload", "--all")
        await follow.shows("--- mrunner: runner ended", seen)
        assert follow.transport is not None
        follow.transport.signalProcess("INT")
        await follow.ended
        self.assertEqual(follow.code, 130)

    async def test_logs_of_one_model_and_requests(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        await self.ok("run", "tiny", "hi")
        out = await self.ok("logs", "--model", "tiny")
        self.assertEqual({line.split("]")[0] for line in out.splitlines()}, {"[ai_tiny_latest-completion"})
        self.assertIn("no log has the source 'other'", await self.fails("logs", "--model", "other"))

        listing = (await self.ok("requests")).splitlines()
        self.assertEqual(listing[0].split()[:5], ["ID", "STARTED", "MODEL", "ROUTE", "STATUS"])
        self.assertEqual(listing[1].split()[2:5], ["ai/tiny:latest", "/engines/v1/chat/completions", "200"])
        self.assertTrue(listing[1].rstrip().endswith("tok0 tok1 tok2"), listing[1])
        (record,) = json.loads(await self.ok("requests", "--json", "--model", "tiny"))
        self.assertEqual(record["answer"]["text"], "tok0 tok1 tok2 ")

        follow = self.spawn("requests", "--follow", "--json")
        seen = await follow.shows('"id": 1')
        await self.ok("run", "tiny", "again")
        await follow.shows('"id": 2', seen)
        assert follow.transport is not None
        follow.transport.signalProcess("INT")
        await follow.ended
        self.assertEqual(follow.code, 130)


class FailedPreloadTests(CLITestCase):
    """A preload that failed is seen in C{ps}, C{status} and C{/ready}, and does not keep the node unready.

    A preload the store lacks is pulled first: from a registry that is not there (nothing listens on
    port 1), so the pull fails at once and nothing leaves this machine.
    """

    def config_text(self) -> str:
        return '[registry]\ndefault = "127.0.0.1:1"\n[models]\npreload = ["ai/no-such-model"]\n'

    async def test_shown(self) -> None:
        name = "ai/no-such-model:latest"
        ready: dict[str, Any] = {}

        async def failed() -> bool:
            ready.update(json.loads(await (await http.get(self.daemon.url + "/ready")).text()))
            return bool(ready.get("failed"))

        for _ in range(int(WAIT / 0.05)):
            if await failed():
                break
            await sleep(0.05)
        self.assertEqual((ready["ready"], ready["failed"]), (True, [name]), ready)
        (row,) = json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text())
        self.assertEqual((row["model_name"], row["state"]), (name, "failed"))
        self.assertIn("unreachable", row["error"])
        statuses = json.loads(await (await http.get(self.daemon.url + "/engines/status")).text())
        self.assertIn("unreachable", statuses[f"preload {name}"])

        listing = (await self.ok("ps")).splitlines()
        self.assertEqual(listing[1].split()[:5], [name, "-", "test", "completion", "failed"])
        self.assertIn(f"preload {name} failed: ", listing[-1])
        self.assertIn("unreachable", listing[-1])
        self.assertRegex(await self.ok("status"), rf"preload {name}: failed: .*unreachable")


class ModelCommandTests(CLITestCase):
    async def test_package_list_tag_remove(self) -> None:
        license = self.home / "LICENSE"
        license.write_text("Apache-2.0, more or less\n")
        out = await self.ok(
            "package", "--gguf", str(self.gguf), "--license", str(license), "--context-size", "1024", "tiny"
        )
        self.assertRegex(out, r"(?m)^package upload: .* \(100%\)$")
        self.assertIn(f"Packaged {self.gguf} as ai/tiny:latest (sha256:", out)
        stored = ModelStore(self.home, reactor).resolve("tiny")  # type: ignore[arg-type]
        self.assertEqual(Path(stored.files["license"]).read_text(), license.read_text())
        self.assertEqual(stored.config["context_size"], 1024)
        self.assertEqual(Path(stored.gguf).read_bytes(), self.gguf.read_bytes())

        listing = (await self.ok("ls")).splitlines()
        self.assertEqual(listing[0].split(), ["NAME", "ID", "SIZE", "PARAMETERS", "QUANTIZATION", "CREATED"])
        self.assertEqual(
            listing[1].split()[:7], ["ai/tiny:latest", stored.short_id, "256.34", "KiB", "65.55", "K", "Q4_1"]
        )
        self.assertRegex(listing[1], r"(just now|\d+ seconds? ago) *$")
        self.assertEqual(json.loads(await self.ok("inspect", "tiny"))["id"], stored.id)

        self.assertIn("Model tagged successfully", await self.ok("tag", "tiny", "team/tiny:v2"))
        [model] = json.loads(await self.ok("ls", "--json"))
        self.assertEqual(sorted(model["tags"]), ["ai/tiny:latest", "team/tiny:v2"])
        self.assertEqual(await self.ok("rm", "tiny"), "Untagged: ai/tiny:latest\n", "that name only")
        [model] = json.loads(await self.ok("ls", "--json"))
        self.assertEqual(model["tags"], ["team/tiny:v2"])
        self.assertEqual(
            (await self.ok("rm", "team/tiny:v2")).splitlines(),
            ["Untagged: team/tiny:v2", f"Deleted: {stored.id}"],
        )
        self.assertEqual(json.loads(await self.ok("ls", "--json")), [])

    async def test_verify_and_a_corrupt_model(self) -> None:
        """A corrupt blob is found, quarantined and shown; loading it says what to do, never serves it."""
        await self.ok("package", "--gguf", str(self.gguf), "tiny")
        self.assertEqual(await self.ok("verify"), "ai/tiny:latest: ok\n")
        flip_last_byte(ModelStore(self.home, reactor).resolve("tiny").gguf)  # type: ignore[arg-type]
        self.assertIn("1 of 1 model(s) corrupt: pull them again", await self.fails("verify", "tiny"))
        self.assertIn("ai/tiny:latest (corrupt: pull it again)", await self.ok("ls"))
        self.assertIn("weights", json.loads(await self.ok("inspect", "tiny"))["corrupt"])
        self.assertIn("pull it again", await self.fails("run", "tiny", "hi"))
        response = await http.post(
            self.daemon.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        )
        error = (await response.json())["error"]
        self.assertEqual((response.code, error["code"]), (409, "model_corrupt"))
        self.assertFalse((self.home / "requests").exists(), "no runner was asked anything")
        self.assertRegex(await self.ok("df"), r"partial downloads +0 B")

    async def test_pull_offline_keeps_the_copy_in_the_store(self) -> None:
        unreachable = f"127.0.0.1:{free_port()}/ai/tiny:latest"  # nothing listens there
        await self.ok("package", "--gguf", str(self.gguf), "tiny")
        await self.ok("tag", "tiny", unreachable)
        ran = await self.mrunner("pull", unreachable)
        self.assertEqual(ran.code, 0, ran)
        self.assertIn("is unreachable", ran.err)
        self.assertIn("is in the store already; using that copy", ran.out)
        self.assertIn("is unreachable", await self.fails("pull", unreachable.replace("tiny", "other")))

    async def test_package_refuses_what_is_not_a_model(self) -> None:
        self.assertIn(
            "not a valid GGUF file", await self.fails("package", "--gguf", str(self.home / "tap.conf"), "x")
        )
        self.assertIn("cannot read", await self.fails("package", "--gguf", str(self.home / "none.gguf"), "x"))


class UNIXSocketTests(CLITestCase):
    def setUp(self) -> None:
        self.home = short_home(self)
        self.socket = self.home / "api.sock"
        self.daemon = InProcessDaemon(write_config(self.home), listen=f"unix:{self.socket}")
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        self.home_env: dict[str, str] = {}

    def env(self, **extra: str) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k != "MRUNNER_HOST"} | self.home_env | extra

    async def test_a_daemon_on_a_unix_socket(self) -> None:
        """Named with --host unix:PATH, or found through the address the daemon wrote in its home."""
        out = await self.ok("status", "--host", f"unix:{self.socket}")
        self.assertIn(f"mrunner is running at unix:{self.socket}", out)
        self.home_env = {"MRUNNER_HOME": str(self.home)}
        self.assertIn(f"mrunner is running at unix:{self.socket}", await self.ok("status"))
        self.assertEqual(await self.ok("ls", "--json"), "[]\n")


class RemoveInUseTests(CLITestCase):
    def runner_args(self) -> tuple[str, ...]:
        return ("--gate", str(self.home / "gate"))  # each answer waits before token i for the file gate<i>

    async def test_rm_by_id_or_of_a_model_in_use_needs_force(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        await self.ok("tag", "tiny", "team/tiny:v2")
        [model] = json.loads(await self.ok("ls", "--json"))
        short = model["id"].removeprefix("sha256:")[:12]
        self.assertIn(
            f"`mrunner rm --force {short}` removes it under all of them", await self.fails("rm", short)
        )
        await self.ok("rm", "team/tiny:v2")
        gated = self.spawn("run", "tiny", "hi")  # held by the gate: a runner serves it
        await eventually(lambda: any(r.in_use for r in self.daemon.scheduler.snapshot()), WAIT)
        self.assertIn("`mrunner rm --force tiny` removes it once they end", await self.fails("rm", "tiny"))
        removing = self.spawn("rm", "--force", "tiny")
        for n in range(3):
            (self.home / f"gate{n}").touch()
        await gated.ended
        await removing.ended
        self.assertEqual((gated.code, removing.code), (0, 0), removing.output)
        self.assertIn(f"Deleted: {model['id']}", removing.output)


class ModelFilesCommandTests(CLITestCase):
    def config_text(self) -> str:
        self.hub = StandInHub({})
        self.addCleanup(lambda: ensureDeferred(self.hub.stop()))
        return f'[huggingface]\nendpoint = "{self.hub.start()}"\n'

    async def test_pull_from_hugging_face_with_progress(self) -> None:
        self.hub.add("team/tiny-gguf", Repo({"tiny-Q4_K_M.gguf": self.gguf.read_bytes()}))
        out = await self.ok("pull", "hf.co/team/tiny-gguf")
        self.assertRegex(out, r"(?m)^pull [0-9a-f]{12}: .* of .* \(100%\)$")
        self.assertIn("Model pulled successfully: hf.co/team/tiny-gguf:latest", out)
        self.assertIn("hf.co/team/tiny-gguf:latest", await self.ok("ls"))
        self.assertIn(
            "has no q2_k GGUF file; available: Q4_K_M", await self.fails("pull", "hf.co/team/tiny-gguf:q2_k")
        )
        self.assertIn("not a valid reference", await self.fails("pull", "hf.co/../.."))

    async def test_package_a_split_vision_model_and_configure_it(self) -> None:
        write_tiny_gguf(self.home / "big.gguf", shards=True)
        write_tiny_gguf(self.home / "mmproj-big.gguf", architecture="clip")
        (self.home / "chat.jinja").write_text("{{ messages }}")
        first = str(self.home / "big-00001-of-00002.gguf")
        options = [
            "--mmproj",
            str(self.home / "mmproj-big.gguf"),
            "--chat-template",
            str(self.home / "chat.jinja"),
        ]
        self.assertIn("Packaged", await self.ok("package", "--gguf", first, *options, "big"))
        stored = ModelStore(self.home, reactor).resolve("big")  # type: ignore[arg-type]
        self.assertEqual((len(stored.shards), sorted(stored.files)), (2, ["chat_template", "mmproj"]))
        await self.ok("package", "--gguf", str(self.gguf), "draft")
        out = await self.ok(
            "configure",
            "big",
            "--context-size",
            "512",
            "--runtime-flags",
            "--temp 0.2",
            "--speculative-draft-model",
            "draft",
        )
        self.assertEqual(out, "big: configured\n")
        response = await http.get(self.daemon.url + "/engines/_configure", params={"model": "big"})
        shown = await response.json()
        self.assertEqual(
            (shown["context_size"], shown["runtime_flags"], shown["speculative"]),
            (512, ["--temp", "0.2"], {"draft_model": "draft"}),
        )
        self.assertIn(
            "draft model nothing is not in the store",
            await self.fails("configure", "big", "--speculative-draft-model", "nothing"),
        )


class RegistryCommandTests(CLITestCase):
    skip = SKIP

    async def test_push_then_pull_with_progress(self) -> None:
        registry = RealRegistry(self.home / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        name = f"{registry.host}/team/tiny:v1"
        await self.daemon.import_model("tiny", self.gguf)
        await self.ok("tag", "tiny", name)

        out = await self.ok("push", name)
        self.assertRegex(out, r"(?m)^push [0-9a-f]{12}: 256\.34 KiB of 256\.34 KiB \(100%\)$")
        self.assertTrue(out.endswith(f"Model pushed successfully: {name}\n"), out)
        self.assertEqual(await self.ok("rm", "tiny"), "Untagged: ai/tiny:latest\n")
        self.assertIn("Deleted: sha256:", await self.ok("rm", name))

        out = await self.ok("pull", name)
        self.assertNotIn("\x1b", out)  # plain lines through a pipe
        progress = re.findall(r"(?m)^pull ([0-9a-f]{12}): .* of .* \((\d+)%\)$", out)
        self.assertEqual(
            {layer for layer, percent in progress if percent == "100"}, {layer for layer, _ in progress}
        )
        self.assertEqual(len({layer for layer, _ in progress}), 2)  # config and weights
        self.assertTrue(out.endswith(f"Model pulled successfully: {name}\n"), out)
        self.assertEqual([m["tags"] for m in json.loads(await self.ok("ls", "--json"))], [[name]])

        await self.ok("rm", name)
        terminal = self.spawn("pull", name, terminal=True)
        await terminal.ended
        self.assertEqual(terminal.code, 0, terminal.output)
        self.assertIn("━", terminal.output)  # bars
        self.assertIn("256.3/256.3 KiB", terminal.output)  # each layer's size and what is done
        self.assertIn("\x1b[", terminal.output)  # drawn in place
        self.assertIn(f"Model pulled successfully: {name}", terminal.output)

        error = await self.fails("pull", f"{registry.host}/team/missing:v1")
        self.assertIn(f"not found in registry {registry.host}", error)
        self.assertNotIn("mrunner pull", error)


class ChatTests(CLITestCase):
    def runner_args(self) -> tuple[str, ...]:
        # Each answer waits before its token i until the file gate<i> exists.
        return ("--gate", str(self.home / "gate"))

    def open_gate(self, *tokens: int) -> None:
        for token in tokens:
            (self.home / f"gate{token}").touch()

    async def test_chat_keeps_the_conversation_ctrl_c_stops_ctrl_d_leaves(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        self.open_gate(0)
        chat = self.spawn("run", "tiny", terminal=True)
        seen = await chat.shows("Ctrl-D or /bye leaves.")
        seen = await chat.shows("> ", seen)
        chat.type("What is 2+2?\r")
        seen = await chat.shows("tok0 ", seen)  # the answer now waits for gate1
        chat.type("\x03")  # Ctrl-C
        seen = await chat.shows("[stopped]", seen)
        await eventually(lambda: "cancelled" in lines(self.home / "events"), WAIT)
        self.assertEqual(lines(self.home / "events"), ["cancelled"])  # the runner stopped generating

        self.open_gate(1, 2)
        seen = await chat.shows("> ", seen)
        chat.type("And 3+3?\r")
        seen = await chat.shows("tok0 tok1 tok2 ", seen)
        seen = await chat.shows("> ", seen)
        chat.type("\x04")  # Ctrl-D
        await chat.ended
        self.assertEqual(chat.code, 0, chat.output)
        self.assertEqual(
            self.requests()[-1]["messages"],
            [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "tok0 "},
                {"role": "user", "content": "And 3+3?"},
            ],
        )


class ContextTests(CLITestCase):
    def runner_args(self) -> tuple[str, ...]:
        return ("--context", "12")  # words: a few turns fill it

    async def test_a_conversation_that_outgrows_the_context(self) -> None:
        """Told so plainly, with /new to start anew; then the conversation starts from nothing."""
        await self.daemon.import_model("tiny", self.gguf)
        error = await self.fails("run", "tiny", " ".join(["word"] * 20))
        self.assertIn("no longer fits in the model's context of 12 tokens", error)
        chat = self.spawn("run", "tiny", terminal=True)
        seen = await chat.shows("/new starts anew")
        seen = await chat.shows("> ", seen)
        chat.type("one two three four five\r")
        seen = await chat.shows("tok0 tok1 tok2 ", seen)
        seen = await chat.shows("> ", seen)
        chat.type("six seven eight nine ten\r")  # 5 + 3 + 5 words: more than 12
        seen = await chat.shows("the conversation (13 tokens) no longer fits", seen)
        seen = await chat.shows("Type /new to start a new conversation.", seen)
        seen = await chat.shows("> ", seen)
        chat.type("/new\r")
        seen = await chat.shows("(a new conversation)", seen)
        seen = await chat.shows("> ", seen)
        chat.type("six seven eight nine ten\r")
        seen = await chat.shows("tok0 tok1 tok2 ", seen)
        await chat.shows("> ", seen)
        chat.type("\x04")
        await chat.ended
        self.assertEqual(chat.code, 0, chat.output)
        self.assertEqual(
            self.requests()[-1]["messages"], [{"role": "user", "content": "six seven eight nine ten"}]
        )


class InstallingDaemon(Resource):
    """A daemon whose backend is still installing when the first chat request comes."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.statuses = ["Installing: fetching", "Installing: compiling", "Running: b1"]
        self.chats = 0

    def render_GET(self, request: Request) -> bytes:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return json.dumps({"llama.cpp": status}).encode()

    def render_POST(self, request: Request) -> bytes:
        self.chats += 1
        if self.chats == 1:
            request.setResponseCode(503)
            error = {
                "message": "backend llama.cpp is not ready yet",
                "type": "x",
                "code": "backend_installing",
            }
            return json.dumps({"error": error}).encode()
        chunk = {"choices": [{"index": 0, "delta": {"content": "four"}}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


class InstallProgressTests(TestCase):
    timeout = 30

    async def test_run_shows_the_install_then_answers(self) -> None:
        daemon = InstallingDaemon()
        port = reactor.listenTCP(0, Site(daemon), interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        out, err, code = await getProcessOutputAndValue(
            MRUNNER,
            ("--host", f"127.0.0.1:{port.getHost().port}", "run", "ai/smollm2", "What is 2+2?"),
            env=dict(os.environ),
            reactor=reactor,
        )
        self.assertEqual((code, out), (0, b"four\n"), err)
        self.assertEqual(
            err.decode().splitlines(),
            ["backend llama.cpp: Installing: fetching", "backend llama.cpp: Installing: compiling"],
        )
        self.assertEqual(daemon.chats, 2)
