"""Hostile ``--list-devices`` output (issue 35: A9, A20); ``[gpu] devices`` naming no listed GPU (36: N14).

Every input is bounded: a line of 40,000 digits, lines just under the cap, 5,000 devices.
"""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends import childprocess
from mrunner.config import GPUConfig
from mrunner.devices import listing
from mrunner.devices.listing import MAX_DEVICES, MAX_LINE, MIB, Listed
from mrunner.devices.metrics import DeviceCollector
from mrunner.scheduling.installer import Installer
from tests.support.devices import CUDA0, devices
from tests.support.fakes import FakeBackend
from tests.support.llamacpp_fixture import VERSION_OUTPUT, Fixture, executable

#: What the regular expression this parser replaced spent seconds on, each line of it.
SLOW_LINES = {
    "an id of digits": "  CUDA" + "0" * 40_000,
    "digits alone": "0" * 40_000,
    "a name of parentheses": "  CUDA0: " + "x (" * 13_000,
    "a size of digits": "  CUDA0: x (" + "1" * 40_000 + " MiB, 1 MiB free)",
}


def device_line(ident: str, total: int | str, free: int | str, name: str = "Fake GPU") -> str:
    return f"  {ident}: {name} ({total} MiB, {free} MiB free)"


def listed(*lines: str) -> str:
    return "\n".join(("Available devices:", *lines)) + "\n"


class Warnings:
    """The warnings logged while a test runs."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.events: list[dict[str, object]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def texts(self) -> list[str]:
        return [formatEvent(e) for e in self.events if e.get("log_level") == LogLevel.warn]


class LinearTests(SynchronousTestCase):
    """A9: reading a listing takes time linear in its length; a line past the cap is not read."""

    def test_a_line_of_40000_digits_takes_milliseconds(self) -> None:
        for name, line in SLOW_LINES.items():
            with self.subTest(name):
                start = time.perf_counter()
                found = listing.read(listed(line))
                self.assertLess(time.perf_counter() - start, 0.05)
                self.assertEqual((found.devices, found.refused), ([], []))

    def test_lines_just_under_the_cap_take_milliseconds(self) -> None:
        """2,000 of the worst lines the cap lets through: the old expression took ~6 s on them."""
        worst = "  CUDA" + "0" * (MAX_LINE - 6)
        start = time.perf_counter()
        listing.read(listed(*[worst] * 2_000))
        self.assertLess(time.perf_counter() - start, 0.5)

    def test_a_device_line_past_the_cap_is_not_a_device(self) -> None:
        long = device_line("CUDA0", 8, 6, name="x" * MAX_LINE)
        self.assertEqual(listing.read(listed(long, device_line("CUDA1", 8, 6))).devices[0].id, "CUDA1")

    def test_a_child_that_never_ends_its_line_is_cut(self) -> None:
        """The probe's reader cuts an endless line into pieces rather than copying it on each read."""
        lines: list[str] = []
        collector = childprocess._Collector(("llama-server",), lines.append, None, keep=4)
        for _ in range(64):
            collector.childDataReceived(1, b"7" * childprocess.READ_BYTES)
        self.assertEqual(len(lines), 64 * childprocess.READ_BYTES // childprocess.MAX_LINE_BYTES)
        self.assertLessEqual(len(collector._partial[1]), childprocess.MAX_LINE_BYTES)


class NonsenseTests(SynchronousTestCase):
    """A20: a device listed twice is kept once, figures no device has are refused, and the cap is clear."""

    def test_refused(self) -> None:
        found = listing.read(
            listed(
                device_line("CUDA0", 8, 6),
                device_line("CUDA0", 16, 6),
                device_line("CUDA1", 8, 9),
                device_line("CUDA2", 10**30, 1),
                device_line("CUDA3", 12, 12),
            )
        )
        self.assertEqual(
            found.devices,
            [Listed("CUDA0", "Fake GPU", 8 * MIB, 6 * MIB), Listed("CUDA3", "Fake GPU", 12 * MIB, 12 * MIB)],
        )
        self.assertEqual(
            found.refused,
            [
                "CUDA0 is listed twice; the first is kept",
                "CUDA1 claims 9 MiB free of 8 MiB; left out",
                f"CUDA2 claims over {listing.MAX_MIB} MiB, more than any device has; left out",
            ],
        )

    def test_5000_devices(self) -> None:
        found = listing.read(listed(*(device_line(f"CUDA{i}", 8, 6) for i in range(5_000))))
        self.assertEqual([d.id for d in found.devices], [f"CUDA{i}" for i in range(MAX_DEVICES)])
        self.assertEqual(found.over, 5_000 - MAX_DEVICES)

    def test_metrics_have_one_series_per_device(self) -> None:
        """A scraper refuses a scrape with a series twice."""
        twice = listed(device_line("CUDA0", 8, 6), device_line("CUDA0", 8, 6))
        inventory, _ = devices(listing.read(twice).devices)
        registry = CollectorRegistry()
        registry.register(DeviceCollector(inventory))
        text = generate_latest(registry).decode()
        series = [line for line in text.splitlines() if line.startswith("mrunner_")]
        self.assertEqual(len(series), len(set(series)))
        self.assertEqual(sum('device="CUDA0"' in line for line in series), 4)


class BackendTests(SynchronousTestCase):
    """What the backend does with such a listing: every line read (not a tail), each refusal logged."""

    def listing_of(self, output: str) -> tuple[Fixture, list[str]]:
        warnings = Warnings(self)
        configured = executable(Path(self.mktemp()) / "llama-server")
        fixture = Fixture(self, path=str(configured))
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        fixture.reactor.next("llama-server").finish(0, stdout=output.encode())
        self.successResultOf(installing)
        return fixture, warnings.texts()

    def test_5000_devices_and_nonsense(self) -> None:
        lines = [device_line("CUDA0", 8, 6), device_line("CUDA0", 8, 6), device_line("CUDA1", 8, 9)]
        lines += [device_line(f"Vulkan{i}", 8, 6) for i in range(5_000)]
        fixture, warnings = self.listing_of(listed(*lines))
        self.assertEqual(len(fixture.backend.listed()), MAX_DEVICES)
        self.assertEqual(fixture.backend.listed()[0].id, "CUDA0")
        self.assertEqual(fixture.backend.variant, "cuda")
        self.assertEqual(len(warnings), 3)
        self.assertIn("CUDA0 is listed twice; the first is kept", warnings[0])
        self.assertIn("CUDA1 claims 9 MiB free of 8 MiB; left out", warnings[1])
        self.assertIn(f"listed {5_000 - MAX_DEVICES + 1} devices past the first {MAX_DEVICES}", warnings[2])

    def test_a_line_of_40000_digits(self) -> None:
        fixture, warnings = self.listing_of(listed(SLOW_LINES["an id of digits"]))
        self.assertEqual(fixture.backend.listed(), [])
        (warning,) = warnings
        self.assertIn("printed no device list, taking it as no GPUs: 'Available devices:", warning)
        self.assertLess(len(warning), 600)


class CachedTests(SynchronousTestCase):
    """A9: C{/engines/devices}, polled by every page and open to any key, starts a listing at most every
    L{LISTING_MAX_AGE} seconds."""

    def test_polls_share_one_listing(self) -> None:
        clock = Clock()
        inventory, source = devices([CUDA0], now=clock.seconds)
        for _ in range(100):
            self.successResultOf(inventory.refresh())
            clock.advance(0.1)
        self.assertEqual(source.asked, 1)


class ChosenTests(SynchronousTestCase):
    """N14: C{[gpu] devices} naming a GPU the build does not list is said at start, with what it lists."""

    def test_warned_once_after_install(self) -> None:
        warnings = Warnings(self)
        inventory, _ = devices([CUDA0], GPUConfig(devices=("CUDA0", "CUDA1")))
        backend = FakeBackend()
        installer = Installer({"llama.cpp": backend}, Clock(), lambda name: inventory.check())
        installer.start("llama.cpp")
        self.assertEqual(warnings.texts(), [], "what the build lists is known once it is installed")
        backend.installs[0].callback("llama.cpp 1")
        self.assertEqual(
            warnings.texts(),
            [
                "[gpu] devices names CUDA1, which this llama-server (cuda) does not list; it lists CUDA0:"
                " runners use only those of [gpu] devices it lists"
            ],
        )
        inventory.check()
        self.assertEqual(len(warnings.texts()), 1, "the same again is not said again")

    def test_cpu_build(self) -> None:
        warnings = Warnings(self)
        inventory, _ = devices([], GPUConfig(devices=("CUDA0",)))
        inventory.check()
        self.assertIn("it lists no GPU", warnings.texts()[0])

    def test_listed_or_not_chosen(self) -> None:
        warnings = Warnings(self)
        for chosen in ("auto", "none", ("CUDA0",)):
            devices([CUDA0], GPUConfig(devices=chosen))[0].check()
        self.assertEqual(warnings.texts(), [])
