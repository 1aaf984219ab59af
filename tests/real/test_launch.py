"""`mrunner launch TOOL`: the real command starts fake tools on PATH that record what they were given."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from mrunner.cli.launch import TOOLS
from tests.support.daemon import InProcessDaemon, short_home, write_config
from tests.support.daemon_cases import MODEL
from tests.support.ggufs import write_tiny_gguf

MRUNNER = str(Path(sys.executable).with_name("mrunner"))
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
sys.exit(7)
"""
URL = "http://127.0.0.1:9"  # no daemon is asked when --model is given


class LaunchTests(TestCase):
    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True)
        self.record = self.dir / "record.json"
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "RECORD": str(self.record), "HOME": str(self.dir)}

    def install(self, *programs: str) -> None:
        for program in programs:
            path = self.bin / program
            path.write_text(RECORDER)
            path.chmod(0o755)

    async def launch(self, *args: str, host: str = URL, code: int = 7) -> tuple[str, str]:
        out, err, status = await getProcessOutputAndValue(
            MRUNNER, ["--host", host, "launch", *args], env=self.env, reactor=reactor
        )
        self.assertEqual(status, code, err)
        return out.decode(), err.decode()

    def recorded(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.record.read_text())
        return value

    async def test_claude(self) -> None:
        """Claude Code gets the Anthropic address, the model and the key; arguments after -- follow."""
        self.install("claude")
        self.env["MRUNNER_API_KEY"] = "key-1"
        await self.launch("claude", "--model", "ai/smollm2", "--", "--print", "hi")
        seen = self.recorded()
        self.assertEqual(seen["argv"][1:], ["--print", "hi"])
        env = seen["env"]
        self.assertEqual(env["ANTHROPIC_BASE_URL"], f"{URL}/anthropic")
        self.assertEqual((env["ANTHROPIC_MODEL"], env["ANTHROPIC_AUTH_TOKEN"]), ("ai/smollm2", "key-1"))
        self.assertEqual(env["RECORD"], str(self.record), "the rest of the environment is kept")

    async def test_every_tool(self) -> None:
        """Each known tool starts with the address, the model (in its argv or environment) and a key."""
        self.install(*(tool.program for tool in TOOLS.values()))
        for name in TOOLS:
            await self.launch(name, "--model", "ai/smollm2", "--api-key", "key-2")
            seen = self.recorded()
            self.assertEqual(Path(seen["argv"][0]).name, TOOLS[name].program)
            given = json.dumps(seen["argv"]) + json.dumps(
                {k: seen["env"][k] for k in seen["env"] if k != "RECORD"}
            )
            self.assertIn("ai/smollm2", given, name)
            self.assertIn(f"{URL}/", given, name)
            self.assertIn("key-2", given, name)

    async def test_codex_argv(self) -> None:
        self.install("codex")
        await self.launch("codex", "--model", "ai/smollm2")
        argv = self.recorded()["argv"]
        self.assertIn(f'model_providers.mrunner.base_url="{URL}/v1"', argv)
        self.assertEqual(argv[-2:], ["--model", "ai/smollm2"])

    async def test_missing_tool(self) -> None:
        _out, err = await self.launch("aider", "--model", "m", code=1)
        self.assertIn("aider is not installed (not on PATH): install it with `python -m pip install", err)
        self.assertFalse(self.record.exists())

    async def test_env_for_any_tool(self) -> None:
        out, _ = await self.launch("my-tool", "--model", "m", "--env", code=0)
        lines = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
        self.assertEqual(lines["OPENAI_BASE_URL"], f"{URL}/v1")
        self.assertEqual(lines["ANTHROPIC_BASE_URL"], f"{URL}/anthropic")
        self.assertEqual(lines["OPENAI_API_KEY"], "mrunner", "a placeholder when no key is given")
        out, err = await self.launch("my-tool", "--model", "m", code=1)
        self.assertIn("--env", err)

    async def test_default_model_from_a_daemon_with_keys(self) -> None:
        """Without --model, the daemon's first model; the daemon wants a key, and the tool gets it."""
        home = short_home(self)
        daemon = InProcessDaemon(write_config(home, '[http]\napi_keys = ["key-3"]\n'))
        self.addCleanup(lambda: ensureDeferred(daemon.stop()))
        write_tiny_gguf(home / "tiny.gguf")
        await daemon.import_model(MODEL, home / "tiny.gguf")
        self.install("aider")
        self.env["MRUNNER_API_KEY"] = "key-3"
        await self.launch("aider", host=daemon.url)
        seen = self.recorded()
        self.assertEqual(seen["argv"][1:], ["--model", f"openai/{MODEL}"])
        self.assertEqual(
            (seen["env"]["OPENAI_API_BASE"], seen["env"]["OPENAI_API_KEY"]), (f"{daemon.url}/v1", "key-3")
        )
