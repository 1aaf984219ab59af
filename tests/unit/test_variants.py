"""Which llama-server build ``auto`` picks, from fake toolchains on PATH and fake device files."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends import cuda, variants
from mrunner.backends.variants import Machine


class ChoiceTests(SynchronousTestCase):
    def machine(
        self, tools: tuple[str, ...] = (), devices: tuple[str, ...] = (), vulkan: int | None = None
    ) -> Machine:
        """A PATH holding a script per tool, these device files, and a Vulkan header of this version."""
        root = Path(self.mktemp())
        bin = root / "bin"
        bin.mkdir(parents=True)
        for tool in tools:
            (bin / tool).write_text("#!/bin/sh\nexit 0\n")
            (bin / tool).chmod(0o755)
        header = root / "vulkan_core.h"
        if vulkan is not None:
            header.write_text(f"#define VK_HEADER_VERSION_COMPLETE 1\n#define VK_HEADER_VERSION {vulkan}\n")
        present = {Path(device) for device in devices}
        return Machine({"PATH": str(bin)}, lambda path: path in present, (header,))

    CASES = {
        "nothing": ((), (), None, "cpu"),
        "nvcc and an NVIDIA GPU": (("nvcc",), ("/dev/nvidia0",), None, "cuda"),
        "nvcc without a GPU": (("nvcc",), (), None, "cpu"),
        "an NVIDIA GPU without nvcc": ((), ("/dev/nvidia0",), None, "cpu"),
        "hipcc and /dev/kfd": (("hipcc",), ("/dev/kfd",), None, "rocm"),
        "hipcc without /dev/kfd": (("hipcc",), (), None, "cpu"),
        "glslc and new headers": (("glslc",), (), 275, "vulkan"),
        "glslc and old headers": (("glslc",), (), 131, "cpu"),
        "glslc without headers": (("glslc",), (), None, "cpu"),
        "cuda before rocm before vulkan": (
            ("nvcc", "hipcc", "glslc"),
            ("/dev/nvidia0", "/dev/kfd"),
            275,
            "cuda",
        ),
        "rocm before vulkan": (("nvcc", "hipcc", "glslc"), ("/dev/kfd",), 275, "rocm"),
    }

    def test_auto(self) -> None:
        for name, (tools, devices, vulkan, expected) in self.CASES.items():
            with self.subTest(name):
                self.assertEqual(variants.choose("auto", self.machine(tools, devices, vulkan)), expected)

    def test_a_named_variant_is_taken_as_is(self) -> None:
        for variant in variants.VARIANTS:
            self.assertEqual(variants.choose(variant, self.machine()), variant)

    def test_unknown_variant(self) -> None:
        with self.assertRaises(variants.UnknownVariant) as raised:
            variants.choose("opencl", self.machine())
        self.assertIn("auto, cpu, cuda, rocm, vulkan", str(raised.exception))

    def test_why_not(self) -> None:
        self.assertEqual(variants.present("cuda", self.machine()), "nvcc not found on PATH")
        self.assertEqual(variants.present("rocm", self.machine(("hipcc",))), "no ROCm device (/dev/kfd)")

    def test_directories(self) -> None:
        """The CPU build keeps the directory it had before variants; each other has its own."""
        self.assertEqual(variants.directory_name("0c1e570", "cpu"), "0c1e570")
        self.assertEqual(variants.directory_name("0c1e570", "cuda"), "0c1e570-cuda")


class CudaTests(SynchronousTestCase):
    def test_wheels(self) -> None:
        self.assertEqual(cuda.wheel_name(13), "nvidia-cublas")
        self.assertEqual(cuda.wheel_name(12), "nvidia-cublas-cu12")

    def test_capabilities_from_nvidia_smi(self) -> None:
        self.assertEqual(cuda.capabilities(None, ["8.9", "8.9", "9.0", "garbage"]), ["89", "90"])
        self.assertEqual(cuda.capabilities(None, []), [])

    def test_find_cublas(self) -> None:
        """The wheel's layout: a library and its headers beside it, for the toolkit's major version."""
        root = Path(self.mktemp())
        (root / "nvidia/cu13/lib").mkdir(parents=True)
        (root / "nvidia/cu13/include").mkdir(parents=True)
        (root / "nvidia/cu13/lib/libcublas.so.13").write_text("")
        self.assertIsNone(cuda.find_cublas([root], 13))
        (root / "nvidia/cu13/include/cublas_v2.h").write_text("")
        self.assertEqual(
            cuda.find_cublas([root], 13),
            (root / "nvidia/cu13/lib/libcublas.so.13", root / "nvidia/cu13/include"),
        )
        self.assertIsNone(cuda.find_cublas([root], 12))
