"""llama.cpp's build variants without real processes: a GPU build that fails falls back to the CPU
build and says why; an earlier GPU build is used and asked for its devices."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends import build
from mrunner.backends.llamacpp import source
from mrunner.backends.llamacpp.backend import LlamaCppBackend
from mrunner.config import Config
from mrunner.scheduling.installer import Installer
from mrunner.values import InstallState
from tests.support import gpu_server
from tests.support.llamacpp_fixture import VERSION_OUTPUT, FakeProcessReactor, Fixture, executable


class VariantInstallTests(SynchronousTestCase):
    def test_failed_gpu_build_falls_back_to_cpu(self) -> None:
        """The Vulkan build fails while configuring: the CPU build is used, and the status says why."""
        fixture = Fixture(self, variant="vulkan")
        reactor = fixture.reactor
        cpu = executable(fixture.pinned(fixture.cache) / "bin" / "llama-server")
        installer = Installer({"llama.cpp": fixture.backend}, MemoryReactorClock())
        waiting = installer.wait("llama.cpp", None)
        (work,) = fixture.cache.glob(f"backends/llama.cpp/.{source.PIN}-vulkan.build-*")
        pip = reactor.next(os.path.basename(sys.executable))
        (work / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"sdist")
        pip.finish(0)
        reactor.next("tar").finish(0)
        cmake = reactor.next("cmake")
        self.assertEqual(cmake.argv[-1], "-DGGML_VULKAN=ON")
        cmake.finish(1, stderr=b"CMake Error: Could NOT find Vulkan (missing: glslc)\n")
        rm = reactor.next("rm")
        shutil.rmtree(work)
        rm.finish(0)
        probe = reactor.next("llama-server")
        self.assertEqual(probe.argv, (str(cpu), "--version"))
        probe.finish(0, stderr=VERSION_OUTPUT)

        self.successResultOf(waiting)
        status = installer.statuses()["llama.cpp"]
        self.assertIs(status.state, InstallState.RUNNING)
        self.assertTrue(
            status.detail.startswith(
                "llama.cpp 0c1e570 (cpu: the vulkan build failed: building llama.cpp 0c1e570 failed while"
                " configuring: cmake exited with code 1"
            ),
            status.detail,
        )
        self.assertIn("Could NOT find Vulkan (missing: glslc)", status.detail)
        self.assertEqual((fixture.backend.variant, fixture.backend.executable), ("cpu", cpu))
        self.assertFalse(any(fixture.cache.glob(f"backends/llama.cpp/{source.PIN}-vulkan")))

        # The next start does not spend a build failing again: it says why, and how to try again.
        reactor = FakeProcessReactor()
        settings = {"cache": str(fixture.cache), "variant": "vulkan"}
        again = LlamaCppBackend(
            Config(home=fixture.home, backends={"llama.cpp": settings}), reactor, fixture.environ
        )
        installing = again.install(lambda _: None)
        reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        detail = self.successResultOf(installing)
        self.assertIn("Could NOT find Vulkan", detail)
        self.assertIn("python -m mrunner.backends.llamacpp --variant=vulkan", detail)
        self.assertEqual(len(reactor.children), 1, "only the CPU build's --version")

    def test_earlier_gpu_build_is_used_and_lists_its_devices(self) -> None:
        fixture = Fixture(self, variant="cuda")
        built = fixture.cache / "backends" / "llama.cpp" / f"{source.PIN}-cuda" / "bin" / "llama-server"
        executable(built)
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        listing = fixture.reactor.next("llama-server")
        self.assertEqual(listing.argv, (str(built), "--list-devices"))
        listing.finish(0, stdout=gpu_server.list_devices("two").encode())
        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570 (cuda)")
        self.assertEqual(fixture.backend.variant, "cuda")
        self.assertEqual([device.id for device in fixture.backend.listed()], ["CUDA0", "CUDA1"])

    def test_unknown_variant(self) -> None:
        failure = self.failureResultOf(Fixture(self, variant="opencl").install(), build.InstallFailed)
        self.assertIn(
            "variant: expected one of auto, cpu, cuda, rocm, vulkan, got 'opencl'", str(failure.value)
        )

    def test_garbage_listing_is_no_gpu(self) -> None:
        """A configured llama-server whose --list-devices prints nonsense is a CPU build, with a warning."""
        configured = executable(Path(self.mktemp()) / "llama-server")
        fixture = Fixture(self, path=str(configured))
        with capturedLogs() as events:
            installing = fixture.install()
            fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
            fixture.reactor.next("llama-server").finish(0, stdout=gpu_server.list_devices("garbage").encode())
        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570")
        self.assertEqual((fixture.backend.variant, fixture.backend.listed()), ("cpu", []))
        warnings = [formatEvent(event) for event in events if event["log_level"] == LogLevel.warn]
        self.assertEqual(len(warnings), 1)
        self.assertIn("--list-devices printed no device list, taking it as no GPUs", warnings[0])
