"""Devices: the ``--list-devices`` parser, budgets, ``[gpu]``, what runners use, NVML, and the metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from mrunner import config as configuration
from mrunner.config import ConfigError, GPUConfig
from mrunner.devices import listing
from mrunner.devices.inventory import LISTING_MAX_AGE, used_by_runners
from mrunner.devices.listing import MIB, Listed
from mrunner.devices.metrics import DeviceCollector
from mrunner.devices.nvml import Nvml
from mrunner.interfaces import IDevices
from tests.support import gpu_server
from tests.support.devices import CUDA0, GIB, devices
from tests.support.metrics import snapshot


class ParseTests(SynchronousTestCase):
    """Each case: what llama-server printed, and the devices read from it."""

    CASES: Mapping[str, tuple[str, list[Listed]]] = {
        "one": (gpu_server.list_devices("one"), [CUDA0]),
        "two": (
            gpu_server.list_devices("two"),
            [
                Listed("CUDA0", "NVIDIA GeForce RTX 4090", 24 * GIB, 24000 * MIB),
                Listed("CUDA1", "NVIDIA GeForce RTX 3060", 12 * GIB, 12000 * MIB),
            ],
        ),
        "rocm": (
            gpu_server.list_devices("rocm"),
            [Listed("ROCm0", "AMD Radeon RX 7800 XT", 16 * GIB, 16000 * MIB)],
        ),
        "none": (gpu_server.list_devices("none"), []),
        "garbage": (gpu_server.list_devices("garbage"), []),
        "empty": ("", []),
        "vulkan and driver noise": (
            "ggml_vulkan: Found 1 Vulkan devices:\nggml_vulkan: 0 = AMD Radeon (RADV) | uma: 0\n"
            "Available devices:\n  Vulkan0: AMD Radeon (RADV NAVI32) (16368 MiB, 15000 MiB free)\n",
            [Listed("Vulkan0", "AMD Radeon (RADV NAVI32)", 16368 * MIB, 15000 * MIB)],
        ),
        "metal": (
            "Available devices:\n  MTL0: Apple M2 Max (49152 MiB, 49152 MiB free)\n",
            [Listed("MTL0", "Apple M2 Max", 48 * GIB, 48 * GIB)],
        ),
        "a name with parentheses": (
            "Available devices:\n  CUDA0: NVIDIA H100 (PCIe) (81559 MiB, 80000 MiB free)\n",
            [Listed("CUDA0", "NVIDIA H100 (PCIe)", 81559 * MIB, 80000 * MIB)],
        ),
        "an unknown kind is not a GPU": ("Available devices:\n  RPC0: host:50052 (1 MiB, 1 MiB free)\n", []),
    }

    def test_cases(self) -> None:
        for name, (output, expected) in self.CASES.items():
            with self.subTest(name):
                self.assertEqual(listing.read(output).devices, expected)

    def test_garbage_is_not_a_listing(self) -> None:
        self.assertFalse(listing.read(gpu_server.list_devices("garbage")).looks_like_listing())
        self.assertTrue(listing.read(gpu_server.list_devices("none")).looks_like_listing())
        self.assertTrue(listing.read(gpu_server.list_devices("two")).looks_like_listing())

    def test_variant(self) -> None:
        for scenario, variant in {
            "one": "cuda",
            "two": "cuda",
            "rocm": "rocm",
            "none": "cpu",
            "garbage": "cpu",
        }.items():
            with self.subTest(scenario):
                self.assertEqual(
                    listing.variant_of(listing.read(gpu_server.list_devices(scenario)).devices), variant
                )
        self.assertEqual(listing.variant_of([Listed("MTL0", "Apple M2", 1, 1)]), "metal")


class FakeNvml:
    def __init__(self, memory: dict[str, tuple[int, int]]):
        self._memory = memory

    def memory(self) -> dict[str, tuple[int, int]]:
        return self._memory


class DevicesTests(SynchronousTestCase):
    def test_interface(self) -> None:
        verifyObject(IDevices, devices([CUDA0])[0])

    def test_gpu_then_ram(self) -> None:
        """A GPU budgets 90% of its memory; the RAM is CPU, with the scheduler's budget."""
        inventory, _ = devices([CUDA0], used={"CUDA0": GIB, "CPU": 2 * GIB})
        first, ram = inventory.devices()
        self.assertEqual(first.id, "CUDA0")
        self.assertEqual((first.memory_total, first.memory_free), (24080 * MIB, 23700 * MIB))
        self.assertEqual(first.budget, int(24080 * MIB * 0.9))
        self.assertEqual(first.used, GIB)
        self.assertEqual(
            (ram.id, ram.memory_total, ram.memory_free, ram.budget, ram.used),
            ("CPU", 32 * GIB, 20 * GIB, 8 * GIB, 2 * GIB),
        )

    def test_cpu_machine(self) -> None:
        inventory, _ = devices([])
        self.assertEqual([device.id for device in inventory.devices()], ["CPU"])

    def test_budget_does_not_move_with_use(self) -> None:
        """Memory runners (or others) take does not shrink a device's budget."""
        inventory, source = devices([CUDA0])
        budget = inventory.devices()[0].budget
        source.found = [attrs.evolve(CUDA0, free=GIB)]
        self.assertEqual(self.successResultOf(inventory.refresh())[0].budget, budget)
        self.assertEqual(inventory.devices()[0].memory_free, GIB)

    def test_budget_in_bytes_is_capped_by_the_device(self) -> None:
        small = Listed("CUDA1", "small", 12 * GIB, 11 * GIB)
        inventory, _ = devices([CUDA0, small], GPUConfig(memory_budget=20 * GIB))
        self.assertEqual([d.budget for d in inventory.devices()[:2]], [20 * GIB, 12 * GIB])

    def test_chosen_devices(self) -> None:
        small = Listed("CUDA1", "small", 12 * GIB, 11 * GIB)
        for chosen, ids in {
            "none": ["CPU"],
            "auto": ["CUDA0", "CUDA1", "CPU"],
            ("CUDA1",): ["CUDA1", "CPU"],
        }.items():
            with self.subTest(chosen):
                inventory, _ = devices([CUDA0, small], GPUConfig(devices=chosen))
                self.assertEqual([d.id for d in inventory.devices()], ids)

    def test_refresh_without_nvml_lists_again(self) -> None:
        inventory, source = devices([CUDA0])
        self.successResultOf(inventory.refresh())
        self.assertEqual(source.asked, 1)

    def test_refreshes_at_once_share_one_listing(self) -> None:
        clock = Clock()
        inventory, source = devices([CUDA0], now=clock.seconds)
        source.pending = Deferred()
        first, second = inventory.refresh(), inventory.refresh()
        self.assertNoResult(first)
        self.assertEqual(source.asked, 1)
        source.pending.callback([CUDA0])
        self.assertEqual(self.successResultOf(first), self.successResultOf(second))
        source.pending = None
        clock.advance(LISTING_MAX_AGE - 1)
        self.successResultOf(inventory.refresh())
        self.assertEqual(source.asked, 1, "a refresh just after the last one ended takes its answer")
        clock.advance(1)
        self.successResultOf(inventory.refresh())
        self.assertEqual(source.asked, 2, "a refresh once that answer is old lists again")

    def test_refresh_with_nvml_is_live(self) -> None:
        inventory, source = devices([CUDA0], nvml=FakeNvml({"CUDA0": (24 * GIB, 3 * GIB)}))
        cuda0 = self.successResultOf(inventory.refresh())[0]
        self.assertEqual((cuda0.memory_total, cuda0.memory_free, source.asked), (24 * GIB, 3 * GIB, 0))

    def test_nvml_that_does_not_see_a_device_is_not_used(self) -> None:
        """A ROCm device, or NVML failing now: the build's list again."""
        inventory, source = devices([CUDA0], nvml=FakeNvml({}))
        self.assertEqual(self.successResultOf(inventory.refresh())[0].memory_free, CUDA0.free)
        self.assertEqual(source.asked, 1)


@attrs.frozen
class Process:
    """What C{nvmlDeviceGetComputeRunningProcesses} lists: a pid and its bytes (None: not shown)."""

    pid: int
    usedGpuMemory: int | None  # NVML's name


class FakePynvml:
    """The C{pynvml} module (its names) over GPUs by index, each with the processes on it;
    C{broken}: NVML fails."""

    def __init__(self, *gpus: list[Process], broken: bool = False):
        self._gpus = gpus
        self.broken = broken

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> list[Process]:
        if self.broken:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return self._gpus[index]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: list[Process]) -> list[Process]:
        return handle


class NvmlUseTests(SynchronousTestCase):
    """NVML's per-process use, by llama.cpp's device ids (NVML's index i is C{CUDA<i>})."""

    def test_a_process_on_each_gpu(self) -> None:
        nvml = Nvml(FakePynvml([Process(7, 300 * MIB), Process(8, 5 * GIB)], [Process(7, 200 * MIB)]))
        self.assertEqual(nvml.used_by(7), {"CUDA0": 300 * MIB, "CUDA1": 200 * MIB})
        self.assertEqual(nvml.used_by(8), {"CUDA0": 5 * GIB})
        self.assertEqual(nvml.used_by(9), {})

    def test_use_nvml_does_not_show_counts_as_none(self) -> None:
        nvml = Nvml(FakePynvml([Process(7, None)], [Process(7, 200 * MIB)]))
        self.assertEqual(nvml.used_by(7), {"CUDA1": 200 * MIB})

    def test_nvml_failing_now_measures_nothing(self) -> None:
        self.assertEqual(Nvml(FakePynvml([Process(7, 300 * MIB)], broken=True)).used_by(7), {})

    def test_devices_ask_nvml_when_it_loads(self) -> None:
        nvml = Nvml(FakePynvml([Process(7, 300 * MIB)]))
        self.assertEqual(devices([CUDA0], nvml=nvml)[0].used_by(7), {"CUDA0": 300 * MIB})
        self.assertEqual(devices([CUDA0])[0].used_by(7), {}, "without NVML: nothing measured")


class UsedTests(SynchronousTestCase):
    def test_runners_without_devices_are_ram(self) -> None:
        self.assertEqual(used_by_runners([snapshot("a"), snapshot("b")]), {"CPU": 2})

    def test_runners_with_devices_are_summed_per_device(self) -> None:
        """The hook for per-device runner memory: a runner that reports C{devices} is counted per id."""

        @attrs.frozen
        class WithDevices:
            memory: int
            devices: Mapping[str, int]

        runners: list[Any] = [
            WithDevices(5, {"CUDA0": 3, "CPU": 2}),
            WithDevices(4, {"CUDA0": 4}),
            snapshot("c"),
        ]
        self.assertEqual(used_by_runners(runners), {"CUDA0": 7, "CPU": 3})


class ConfigTests(SynchronousTestCase):
    def read(self, text: str) -> configuration.Config:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return configuration.load(path, environ={})

    def test_defaults(self) -> None:
        self.assertEqual(self.read("").gpu, GPUConfig(devices="auto", memory_budget=0.9))

    def test_values(self) -> None:
        gpu = self.read('[gpu]\ndevices = ["CUDA1"]\nmemory_budget = "75%"\n').gpu
        self.assertEqual((gpu.devices, gpu.memory_budget), (("CUDA1",), 0.75))
        self.assertEqual(
            self.read('[gpu]\ndevices = "none"\nmemory_budget = "20GiB"\n').gpu.memory_budget, 20 * GIB
        )
        self.assertEqual(self.read("[gpu]\nmemory_budget = 1000\n").gpu.memory_budget, 1000)

    def test_mistakes_name_the_key(self) -> None:
        for text in (
            'devices = "all"',
            "devices = [1]",
            "devices = []",
            'memory_budget = "auto"',
            'memory_budget = "lots"',
            "memory_budget = true",
        ):
            with self.subTest(text), self.assertRaises(ConfigError) as raised:
                self.read(f"[gpu]\n{text}\n")
            self.assertIn("gpu.", str(raised.exception))


class MetricsTests(SynchronousTestCase):
    def test_device_memory(self) -> None:
        registry = CollectorRegistry()
        registry.register(DeviceCollector(devices([CUDA0], used={"CUDA0": 5})[0]))
        samples = {
            (sample.name, sample.labels["device"]): sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples
        }
        self.assertEqual(samples[("mrunner_device_memory_total_bytes", "CUDA0")], 24080 * MIB)
        self.assertEqual(samples[("mrunner_device_memory_free_bytes", "CPU")], 20 * GIB)
        self.assertEqual(samples[("mrunner_device_memory_budget_bytes", "CPU")], 8 * GIB)
        self.assertEqual(samples[("mrunner_device_memory_used_bytes", "CUDA0")], 5)
