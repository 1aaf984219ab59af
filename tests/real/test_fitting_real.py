"""Fitting end to end: the daemon plans SmolLM2 over the fake GPU llama-server's devices
(tests/support/gpu_server.py over the real CPU one) and starts it with the plan's flags; the
fake prints llama.cpp's load lines for those flags, or runs out of memory, and the real server answers."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from mrunner.home import Home
from tests.support import gpu_server
from tests.support.cli_cases import MRUNNER
from tests.support.daemon import http
from tests.support.held import Held
from tests.support.llamacpp_cases import LlamaCppTestCase, cached_llama_server, smollm2

SMOL = "ai/smollm2:latest"
#: A chat request that loads SmolLM2 and answers at once.
HELLO: dict[str, Any] = {"model": SMOL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
#: SmolLM2-135M's 30 blocks and its output layer: what -ngl counts.
LAYERS = 31
MIB = 2**20


def fake_pynvml(used: int) -> types.ModuleType:
    """A C{pynvml} for the fake's C{one} GPU on which each child of this process (the in-process
    daemon's runners) uses C{used} bytes."""
    module = types.ModuleType("pynvml")

    def children() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # not a process, or one that ended meanwhile
                continue
            if int(stat.rpartition(")")[2].split()[1]) == os.getpid():
                found.append(int(entry.name))
        return found

    functions = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetMemoryInfo": lambda handle: types.SimpleNamespace(total=24080 * MIB, free=23700 * MIB),
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid in children()
        ],
    }
    module.__dict__.update(functions)
    return module


class FittingTests(LlamaCppTestCase):
    async def start_with(
        self,
        scenario: str,
        oom_layers: int | None = None,
        config_text: str = "",
        parallel: int = 1,
        oom_context: int | None = None,
    ) -> None:
        """The daemon over the fake GPUs' C{scenario}; one slot by default, so that the budgets below
        are sized for one context of KV cache (each slot holds a whole context: issue 49)."""
        directory = Path(self.mktemp())
        directory.mkdir()
        wrapper = gpu_server.write_wrapper(
            directory,
            cached_llama_server(),
            scenario=scenario,
            oom_layers=oom_layers,
            oom_context=oom_context,
        )
        await self.start(f'[backends."llama.cpp"]\npath = "{wrapper}"\n{config_text}', parallel)
        await self.settled_status()
        await self.daemon.import_model(SMOL, smollm2())

    async def ask(self) -> Any:
        return await self.call(self.client.chat.completions.create, **HELLO)

    async def runners(self) -> list[dict[str, Any]]:
        return json.loads(await (await http.get(self.daemon.url + "/engines/ps")).text())  # type: ignore[no-any-return]

    def log(self) -> str:
        return Home(self.home).runner_log(SMOL, "completion").read_text()

    async def test_spread_over_two_gpus(self) -> None:
        """No GPU holds it whole (about 316 MiB: 31 layers of 9.5 MiB and a 21.5 MiB compute buffer,
        against budgets of 270 and 180 MiB): spread, in proportion to their room; what `ps` gives
        each GPU is what the devices' used sums. The runner serves at the default verbosity, where
        the pinned build prints no buffer lines (issue 48): without NVML, the plan counts."""
        await self.start_with("CUDA0=300/300,CUDA1=200/200")
        self.assertTrue((await self.ask()).choices)
        [runner] = await self.runners()
        self.assertEqual(runner["gpu_layers"], LAYERS)
        self.assertEqual(list(runner["devices"]), ["CUDA0", "CUDA1", "CPU"])
        self.assertIn("--device CUDA0,CUDA1 --n-gpu-layers 31 --tensor-split", self.log())
        self.assertNotIn("buffer size", self.log())
        self.assertGreater(runner["devices"]["CUDA0"], runner["devices"]["CUDA1"])
        devices = json.loads(await (await http.get(self.daemon.url + "/engines/devices")).text())
        used = {d["id"]: d["used"] for d in devices["devices"]}
        self.assertEqual(
            (used["CUDA0"], used["CUDA1"]), (runner["devices"]["CUDA0"], runner["devices"]["CUDA1"])
        )

    async def test_partly_offloaded(self) -> None:
        """One small GPU (a 90 MiB budget): as many layers as fit, the rest on the CPU, as `ps` shows."""
        await self.start_with("CUDA0=100/100")
        self.assertTrue((await self.ask()).choices)
        [runner] = await self.runners()
        self.assertGreater(runner["gpu_layers"], 0)
        self.assertLess(runner["gpu_layers"], LAYERS)
        self.assertIn(f"--device CUDA0 --n-gpu-layers {runner['gpu_layers']} ", self.log())
        env = {**os.environ, "MRUNNER_HOST": self.daemon.url}
        out, err, code = await getProcessOutputAndValue(MRUNNER, ["ps"], env=env, reactor=reactor)
        self.assertEqual(code, 0, err)
        self.assertRegex(out.decode(), r"CUDA0 \d+% / CPU \d+%")

    async def test_nvml_use_corrects_the_load_output(self) -> None:
        """Where NVML loads (a fake that gives the runner 1 GiB on CUDA0, as a CUDA context would add to
        its buffers), `/engines/ps` and `/engines/devices` count what NVML gives, not the buffers."""
        previous = sys.modules.pop("pynvml", None)
        self.addCleanup(lambda: sys.modules.update({"pynvml": previous} if previous else {}))
        self.addCleanup(sys.modules.pop, "pynvml", None)
        sys.modules["pynvml"] = fake_pynvml(1024 * MIB)
        await self.start_with("one")
        self.assertTrue((await self.ask()).choices)
        [runner] = await self.runners()
        self.assertEqual((runner["gpu_layers"], runner["devices"]["CUDA0"]), (LAYERS, 1024 * MIB))
        devices = json.loads(await (await http.get(self.daemon.url + "/engines/devices")).text())
        self.assertEqual(devices["devices"][0]["used"], 1024 * MIB)

    async def test_out_of_memory_retries_with_fewer_layers(self) -> None:
        """The fake runs out of memory above 25 layers: all 31 fail, the retry with 23 loads."""
        await self.start_with("one", oom_layers=25)
        self.assertTrue((await self.ask()).choices)
        [runner] = await self.runners()
        self.assertEqual(runner["gpu_layers"], 23)
        self.assertIn("cudaMalloc failed: out of memory", self.log())

    async def test_out_of_memory_retries_once_with_fewer_layers_and_half_the_context(self) -> None:
        """The fake runs out of memory above 4096 tokens of context: 31 layers fail with SmolLM2's
        default (its trained 8192); the one retry, 23 layers with 4096, loads, as `/engines/ps` shows."""
        await self.start_with("one", oom_context=4096)
        self.assertTrue((await self.ask()).choices)
        [runner] = await self.runners()
        self.assertEqual((runner["gpu_layers"], runner["context_size"]), (23, 4096))
        self.assertIn("--ctx-size 4096", self.log())
        self.assertEqual(self.log().count("cudaMalloc failed: out of memory"), 1)

    async def test_a_context_size_set_is_not_halved(self) -> None:
        await self.start_with(
            "one", oom_context=4096, config_text='[models."ai/smollm2"]\ncontext_size = 8192\n'
        )
        code, body = await self.post("/engines/v1/chat/completions", HELLO)
        self.assertEqual((code, body["error"]["code"]), (500, "runner_failed"), body)
        self.assertIn("with 23 layers offloaded; lower [gpu] memory_budget", body["error"]["message"])

    async def test_out_of_memory_every_time_names_the_device(self) -> None:
        await self.start_with("one", oom_layers=10)
        code, body = await self.post("/engines/v1/chat/completions", HELLO)
        self.assertEqual((code, body["error"]["code"]), (500, "runner_failed"), body)
        self.assertIn(
            "ran out of memory on CUDA0 while loading, with 23 layers offloaded and its context halved"
            " to 4096 tokens",
            body["error"]["message"],
        )
        self.assertEqual(await self.runners(), [])

    async def test_instances_on_gpus_of_their_own(self) -> None:
        """With the first instance busy (its answer held unread), a request starts a second one, whole
        on the other GPU, and it answers; both show in `ps`."""
        await self.start_with("two", config_text='[models."ai/smollm2"]\ninstances = 2\n', parallel=1)
        body = {**HELLO, "max_tokens": 4000, "stream": True, "ignore_eos": True}
        response = await http.post(self.daemon.url + "/v1/chat/completions", json=body)
        self.assertEqual(response.code, 200)
        held = Held()
        response.deliverBody(held)
        self.addCleanup(lambda: held.transport.stopProducing() if not held.done.called else None)
        code, answer = await self.post(
            "/v1/chat/completions",
            HELLO,
        )
        self.assertEqual(code, 200, answer)
        runners = sorted(await self.runners(), key=lambda r: r["instance"])
        self.assertEqual(
            [(r["instance"], r["in_use"], [d for d in r["devices"] if d != "CPU"]) for r in runners],
            [(0, 1, ["CUDA1"]), (1, 0, ["CUDA0"])],
            "the first on the GPU it fits best, the second on the other",
        )
        held.transport.stopProducing()
        await held.done
