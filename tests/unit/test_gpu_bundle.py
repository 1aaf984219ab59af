"""The GPU bundle (bench/gpu_bundle.py) and the script a lent GPU machine runs (bench/gpu_device.sh).

Nothing here downloads: the pins come from this venv's metadata, the trimming rules
are checked on names, the GGUF round trip on a tiny model. The bundle itself, where
``make gpu-bundle`` has made it (``make test`` does), is resolved offline for
CPython 3.12 and the script is run up to its first step that needs a GPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench import gpu_bundle, gpu_streams
from mrunner.testing.tinymodel import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / ".gpu-bundle"
SCRIPT = REPO / "bench" / "gpu_device.sh"
LLAMA = f"{gpu_bundle.SDIST}/vendor/llama.cpp"


class PinTests(SynchronousTestCase):
    def test_every_dependency_pinned_to_this_venv(self) -> None:
        """mrunner's needs and theirs (Twisted's TLS extra too), at the versions installed here."""
        pins = dict(pin.split("==") for pin in gpu_bundle.pins())
        for name in ("twisted", "klein", "treq", "gguf", "numpy", "pyopenssl", "service-identity", "httpx2"):
            self.assertEqual(pins[name], importlib.metadata.version(name), name)
        self.assertNotIn("mrunner", pins)

    def test_the_sdist_build_backend(self) -> None:
        """pip prepares the sdist with scikit-build-core, which the venv lacks: pinned by hand."""
        pins = gpu_bundle.pins()
        self.assertIn("scikit-build-core==1.1.2", pins)
        self.assertIn(f"pathspec=={importlib.metadata.version('pathspec')}", pins)

    def test_requirements_are_the_checkouts(self) -> None:
        self.assertIn("httptools>=0.6", gpu_bundle.requirements())
        self.assertIn("httpx2", gpu_bundle.requirements())


class TrimTests(SynchronousTestCase):
    KEPT = (
        f"{gpu_bundle.SDIST}/pyproject.toml",
        f"{gpu_bundle.SDIST}/llama_cpp/__init__.py",
        f"{LLAMA}/CMakeLists.txt",
        f"{LLAMA}/ggml/src/ggml-cuda/fattn.cu",
        f"{LLAMA}/ggml/src/ggml-cuda/template-instances/mmq-instance-q4_1.cu",
        f"{LLAMA}/ggml/src/ggml-cpu/ggml-cpu.c",
        f"{LLAMA}/ggml/src/ggml.c",
        f"{LLAMA}/tools/server/server.cpp",
        f"{LLAMA}/tools/mtmd/mtmd.cpp",
        f"{LLAMA}/tools/ui/CMakeLists.txt",
        f"{LLAMA}/scripts/ui-assets.cmake",
        f"{LLAMA}/vendor/cpp-httplib/httplib.h",
        f"{LLAMA}/common/common.cpp",
    )
    DROPPED = (
        f"{gpu_bundle.SDIST}/.git/objects/pack/x.pack",
        f"{LLAMA}/models/ggml-vocab-llama-bpe.gguf",
        f"{LLAMA}/docs/build.md",
        f"{LLAMA}/ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        f"{LLAMA}/ggml/src/ggml-sycl/ggml-sycl.cpp",
        f"{LLAMA}/tools/ui/src/app.html",
        f"{LLAMA}/tests/test-backend-ops.cpp",
        f"{LLAMA}/examples/simple/simple.cpp",
    )

    def test_kept(self) -> None:
        for name in self.KEPT:
            self.assertTrue(gpu_bundle.kept(name), name)

    def test_dropped(self) -> None:
        for name in self.DROPPED:
            self.assertFalse(gpu_bundle.kept(name), name)


class ModelTests(SynchronousTestCase):
    def test_head_and_zeros(self) -> None:
        """The head and the size make a GGUF with the same tensors and every byte of their data zero."""
        from gguf import GGUFReader

        original, copy, head = (Path(self.mktemp()) for _ in range(3))
        write_tiny_llama(original)
        data, size = gpu_bundle.gguf_head(original)
        head.write_bytes(data)
        gpu_bundle.restore(head, size, copy)
        self.assertEqual(copy.stat().st_size, original.stat().st_size)
        before, after = GGUFReader(original), GGUFReader(copy)
        self.assertEqual([t.name for t in after.tensors], [t.name for t in before.tensors])
        self.assertEqual(after.data_offset, len(data))
        self.assertFalse(any(bytes(t.data.tobytes()).strip(b"\0") for t in after.tensors))


class LongLayoutTests(SynchronousTestCase):
    def test_trained_context_raised_in_place(self) -> None:
        """Only the field's value changes: the same size, tensors and data offset."""
        from gguf import GGUFReader

        original, copy = Path(self.mktemp()), Path(self.mktemp())
        write_tiny_llama(original)
        shutil.copyfile(original, copy)
        gpu_bundle.raise_trained_context(copy, 327_680)
        before, after = GGUFReader(original), GGUFReader(copy)
        field = after.fields["llama.context_length"]
        self.assertEqual(int(field.parts[field.data[0]][0]), 327_680)
        self.assertEqual(copy.stat().st_size, original.stat().st_size)
        self.assertEqual(after.data_offset, before.data_offset)
        self.assertEqual([t.name for t in after.tensors], [t.name for t in before.tensors])

    def test_the_gpu_plan_holds_256_streams_of_a_thousand_tokens(self) -> None:
        args = argparse.Namespace(
            cpu=False,
            server=Path("llama-server"),
            gguf=Path("smollm2.gguf"),
            shapes=None,
            verbose_streams=None,
        )
        plan = gpu_streams.plan_from(args)
        self.assertEqual((plan.parallel, plan.verbose), (256, 64))
        self.assertGreaterEqual(plan.context, 1000 + gpu_streams.PROMPT)
        self.assertEqual(plan.shapes, [(1, 1000), (64, 192), (256, 64)])


class ScriptTests(SynchronousTestCase):
    def test_steps(self) -> None:
        """The order a lent machine's call depends on: nothing before the build needs a GPU, and the
        checks and the rates come after it; all of them expected to fit one call with time to spare,
        the build as long as the one the first lent H200 took (346.5 s)."""
        out = subprocess.run([str(SCRIPT), "--steps"], capture_output=True, text=True, check=True).stdout
        steps = [line.split() for line in out.splitlines()]
        self.assertEqual(
            [step[:2] for step in steps],
            [
                *(["wheels", "gpu=no"], ["model", "gpu=no"], ["prepare", "gpu=no"]),
                *(["build", "gpu=cuda"], ["checks", "gpu=yes"], ["streams", "gpu=cuda"]),
            ],
        )
        expected = {
            name: int(seconds.removeprefix("expected=").removesuffix("s")) for name, _, seconds in steps
        }
        self.assertGreaterEqual(expected["build"], 346.5)
        self.assertLessEqual(sum(expected.values()), CALL - SPARE)

    def test_needs_a_bundle(self) -> None:
        out = subprocess.run(
            [str(SCRIPT), self.mktemp()],
            capture_output=True,
            text=True,
            env={**os.environ, "BUNDLE": self.mktemp()},
        )
        self.assertEqual(out.returncode, 2)
        self.assertIn("run make gpu-bundle", out.stderr)


class BundleTests(SynchronousTestCase):
    """The bundle as made here: skipped until ``make gpu-bundle`` has made it."""

    def setUp(self) -> None:
        if not (BUNDLE / "manifest.json").exists():
            raise self.skipTest("no .gpu-bundle/ here: make gpu-bundle makes it (make test does)")
        self.manifest = json.loads((BUNDLE / "manifest.json").read_text())

    def test_manifest(self) -> None:
        """It lists this venv's pins, and its files fit a call with room for the working tree."""
        self.assertEqual(self.manifest["requirements"], gpu_bundle.pins())
        self.assertLess(sum(self.manifest["files"].values()), gpu_bundle.LIMIT * 3 // 4)
        self.assertIn(f"wheels/{gpu_bundle.SDIST}.tar.gz", self.manifest["files"])

    def test_resolves_offline_for_python_312(self) -> None:
        self.assertEqual(gpu_bundle.resolve(BUNDLE), self.manifest["requirements"])

    def test_a_missing_wheel_is_found_out(self) -> None:
        bundle = Path(self.mktemp())
        shutil.copytree(BUNDLE, bundle)
        next((bundle / "wheels").glob("zope_interface-*.whl")).unlink()
        with self.assertRaises(subprocess.CalledProcessError):
            gpu_bundle.resolve(bundle)

    def test_the_script_stops_at_the_first_step_that_needs_a_gpu(self) -> None:
        """Here (no GPU) the wheels are resolved, the model made and the source prepared, on a PATH
        without CMake or ninja: they are only beside the interpreter, as on the first lent machine,
        and pip asks for no wheel of theirs. Nothing that needs the GPU is started."""
        if shutil.which("nvidia-smi"):
            raise self.skipTest("an NVIDIA GPU is here: the script would build")
        path, python = bare_machine(Path(self.mktemp()).resolve(), self)
        out_dir = Path(self.mktemp()).resolve()
        work = out_dir.with_name("work")
        run = subprocess.run(
            [str(SCRIPT), str(out_dir)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": str(path), "PYTHON": str(python), "GPU_DEVICE_WORK": str(work)},
        )
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("no NVIDIA GPU here (nvidia-smi does not answer): 'build' not run", run.stdout)
        rows = [line.split(None, 3) for line in (out_dir / "steps.txt").read_text().splitlines()]
        self.assertEqual(
            [(row[0], row[-1]) for row in rows if not row[0].startswith("#")][:-1],
            [
                *(("wheels", "ok"), ("model", "ok"), ("prepare", "ok")),
                *(
                    ("build", "not run: no GPU"),
                    ("checks", "not run: no GPU"),
                    ("streams", "not run: no GPU"),
                ),
            ],
        )
        self.assertEqual(rows[-1][0], "total")
        prepared = (work / "logs" / "prepare.log").read_text()
        for tool in HIDDEN_TOOLS:
            self.assertIn(f"{tool}: {python.with_name(tool)}\n", prepared)
        self.assertIn("the source fetched and configured", prepared)
        self.assertTrue((out_dir / "logs.tar.gz").exists())


#: The seconds of a lent machine's call the script is given, and those its steps leave to spare.
CALL, SPARE = 590, 30
#: What a machine with CMake and ninja installed by pip beside its Python lacks on PATH.
HIDDEN_TOOLS = ("cmake", "ninja")


def bare_machine(root: Path, test: SynchronousTestCase) -> tuple[Path, Path]:
    """A PATH of every program on this one but CMake's and ninja, and this venv's interpreter seen
    from a folder of its own (its pyvenv.cfg, its lib) with CMake and ninja beside it."""
    if sys.prefix == sys.base_prefix or not all(shutil.which(tool) for tool in HIDDEN_TOOLS):
        raise test.skipTest("needs a venv, and CMake and ninja to move off PATH")
    path, bin = root / "path", root / "python" / "bin"
    path.mkdir(parents=True)
    bin.mkdir(parents=True)
    hidden = {*HIDDEN_TOOLS, "ctest", "cpack", "ccmake"}
    for folder in filter(os.path.isdir, os.environ["PATH"].split(os.pathsep)):
        for program in Path(folder).iterdir():
            if program.name not in hidden and not (path / program.name).exists():
                (path / program.name).symlink_to(program)
    shutil.copyfile(Path(sys.prefix) / "pyvenv.cfg", bin.parent / "pyvenv.cfg")
    (bin.parent / "lib").symlink_to(Path(sys.prefix) / "lib")
    (bin / "python3").symlink_to(Path(sys.executable).resolve())
    for tool in HIDDEN_TOOLS:
        (bin / tool).symlink_to(str(shutil.which(tool)))
    return path, bin / "python3"
