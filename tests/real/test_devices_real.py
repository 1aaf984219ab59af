"""Devices end to end: the daemon runs the fake GPU llama-server (tests/support/gpu_server.py) over
the real CPU one, and says what it sees through C{/engines/devices}, C{mrunner devices}, C{/metrics}
and C{mrunner status}; a model still loads and answers through it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from mrunner.home import Home
from tests.support import gpu_server
from tests.support.cli_cases import MRUNNER
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase, cached_llama_server

MIB = 2**20
GIB = 2**30


class DevicesDaemonTests(LlamaCppTestCase):
    async def start_with(self, scenario: str, config_text: str = "") -> dict[str, Any]:
        """A daemon whose llama-server is the fake one in C{scenario}: its C{/engines/devices}."""
        directory = Path(self.mktemp())
        directory.mkdir()
        wrapper = gpu_server.write_wrapper(directory, cached_llama_server(), scenario=scenario)
        await self.start(f'[backends."llama.cpp"]\npath = "{wrapper}"\n{config_text}')
        self.status = await self.settled_status()
        response = await http.get(self.daemon.url + "/engines/devices")
        self.assertEqual(response.code, 200)
        answer: dict[str, Any] = json.loads(await response.text())
        return answer

    def cpu_last(self, answer: dict[str, Any]) -> list[dict[str, Any]]:
        *gpus, ram = answer["devices"]
        self.assertEqual((ram["id"], ram["budget"]), ("CPU", self.daemon.config.scheduler.memory_budget))
        self.assertGreater(ram["memory_total"], 0)
        self.assertGreater(ram["memory_free"], 0)
        return gpus

    async def test_one_gpu(self) -> None:
        answer = await self.start_with("one")
        self.assertEqual(answer["variant"], "cuda")
        self.assertEqual(
            self.cpu_last(answer),
            [
                {
                    "id": "CUDA0",
                    "name": "NVIDIA GeForce RTX 4090",
                    "memory_total": 24080 * MIB,
                    "memory_free": 23700 * MIB,
                    "budget": int(24080 * MIB * 0.9),
                    "used": 0,
                }
            ],
        )
        self.assertEqual(self.status["llama.cpp"], "Running: llama.cpp 0c1e570 (cuda)")

    async def test_two_gpus_chosen_and_budgeted(self) -> None:
        answer = await self.start_with("two", '[gpu]\ndevices = ["CUDA1"]\nmemory_budget = "10GiB"\n')
        self.assertEqual(
            [(d["id"], d["memory_total"], d["budget"]) for d in self.cpu_last(answer)],
            [("CUDA1", 12 * GIB, 10 * GIB)],
        )

    async def test_rocm(self) -> None:
        answer = await self.start_with("rocm")
        self.assertEqual(answer["variant"], "rocm")
        self.assertEqual([d["id"] for d in self.cpu_last(answer)], ["ROCm0"])

    async def test_none_and_garbage_are_a_cpu_machine(self) -> None:
        for scenario in ("none", "garbage"):
            with self.subTest(scenario):
                answer = await self.start_with(scenario)
                self.assertEqual((answer["variant"], self.cpu_last(answer)), ("cpu", []))
                self.assertEqual(self.status["llama.cpp"], "Running: llama.cpp 0c1e570")
                await self.daemon.stop()

    async def test_cli_and_metrics(self) -> None:
        answer = await self.start_with("two")
        env = {**os.environ, "MRUNNER_HOST": self.daemon.url}
        out, err, code = await getProcessOutputAndValue(MRUNNER, ["devices"], env=env, reactor=reactor)
        self.assertEqual(code, 0, err)
        text = out.decode()
        self.assertIn("llama-server build: cuda", text)
        for name in ("CUDA0", "NVIDIA GeForce RTX 4090", "CUDA1", "NVIDIA GeForce RTX 3060", "CPU"):
            self.assertIn(name, text)
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, ["devices", "--json"], env=env, reactor=reactor
        )
        self.assertEqual(code, 0, err)
        listed = json.loads(out)
        self.assertEqual([d["id"] for d in listed["devices"]], [d["id"] for d in answer["devices"]])
        metrics = await (await http.get(self.daemon.url + "/metrics")).text()
        self.assertIn('mrunner_device_memory_total_bytes{device="CUDA1"} 1.2884901888e+10', metrics)
        self.assertIn('mrunner_device_memory_budget_bytes{device="CPU"}', metrics)

    async def test_a_model_loads_and_answers_through_the_fake(self) -> None:
        """The runner is started on the fake's GPU at llama-server's default verbosity, where the
        pinned build prints no buffer lines and no debug lines per request (issue 48), and answers."""
        await self.start_with("one")
        await self.tiny()
        chat = await self.call(
            self.client.chat.completions.create,
            model=TINY,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=3,
        )
        self.assertTrue(chat.choices)
        log = Home(self.home).runner_log(TINY, "completion").read_text()
        command = log.splitlines()[0]
        self.assertIn("--device CUDA0 --n-gpu-layers ", command)
        self.assertNotIn("-lv", command.split())
        self.assertNotIn("buffer size", log)
        devices = json.loads(await (await http.get(self.daemon.url + "/engines/devices")).text())
        self.assertGreater(devices["devices"][-1]["used"], 0, "the runner's memory counts as the CPU's")
