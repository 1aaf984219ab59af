"""The whisper.cpp backend's pieces that need no process: its patches of the pinned source, the
command line of a runner, its memory estimate, and the package the CLI writes for a Whisper model."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends import build
from mrunner.backends.built import Installed
from mrunner.backends.llamacpp import arguments
from mrunner.backends.whispercpp.backend import OVERHEAD, WhisperCppBackend
from mrunner.backends.whispercpp.source import AUDIO_ERROR_PATCH, SOURCE, TEXT_TYPE_PATCH, UNIX_SOCKET_PATCH
from mrunner.cli.package import is_whisper, whisper_members
from mrunner.config import Config
from mrunner.errors import BadRequest
from mrunner.testing import tinywhisper
from mrunner.values.backend import COMPLETION, TRANSCRIPTION, RunnerSettings
from mrunner.values.model import Model


def model(path: Path, format: str = "whisper") -> Model:
    return Model("sha256:" + "0" * 64, ("ai/w:latest",), 0, {"format": format}, str(path))


class PatchTests(SynchronousTestCase):
    def tree(self, text: str) -> Path:
        tree = Path(self.mktemp())
        (tree / "examples/server").mkdir(parents=True)
        (tree / "examples/server/server.cpp").write_text(text)
        return tree

    def test_each_patch_applies_once(self) -> None:
        tree = self.tree(
            f"int main() {{\n{UNIX_SOCKET_PATCH[1]}x; {TEXT_TYPE_PATCH[1]} {AUDIO_ERROR_PATCH[1]}\n}}\n"
        )
        build.patch(tree, SOURCE)
        patched = (tree / "examples/server/server.cpp").read_text()
        self.assertIn("svr->set_address_family(AF_UNIX);", patched)
        self.assertIn('"text/plain; charset=utf-8"', patched)
        self.assertNotIn("text/html", patched)
        self.assertIn('\\"code\\":\\"invalid_file\\"', patched)

    def test_a_pin_past_the_patched_code_fails_the_build(self) -> None:
        tree = self.tree("int main() { return 0; }\n")
        with self.assertRaises(build.InstallFailed) as failed:
            build.patch(tree, SOURCE)
        self.assertIn("patching examples/server/server.cpp", str(failed.exception))


class CommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.backend = WhisperCppBackend(Config(home=Path(self.mktemp())), None, environ={})
        self.backend._installed = Installed(Path("/opt/whisper-server"), "whisper.cpp x", None)
        self.path = Path(self.mktemp())
        tinywhisper.write(self.path)

    def test_a_runner_listens_on_its_socket(self) -> None:
        command = self.backend.command(
            model(self.path), TRANSCRIPTION, "/run/r.sock", RunnerSettings(threads=2)
        )
        self.assertEqual(command.executable, "/opt/whisper-server")
        args = command.args
        self.assertEqual(args[args.index("--host") + 1], "/run/r.sock")
        self.assertEqual(args[args.index("-m") + 1], str(self.path))
        self.assertEqual(args[args.index("--threads") + 1], "2")
        self.assertNotEqual(args[args.index("--port") + 1], "0")

    def test_it_runs_only_whisper_models_for_transcription(self) -> None:
        settings = RunnerSettings()
        self.assertRaises(
            BadRequest, self.backend.command, model(self.path, "gguf"), TRANSCRIPTION, "s", settings
        )
        self.assertRaises(BadRequest, self.backend.command, model(self.path), COMPLETION, "s", settings)

    def test_runtime_flags_are_refused(self) -> None:
        flagged = RunnerSettings(flags=("--temp", "0.5"))
        with self.assertRaises(BadRequest) as refused:
            self.backend.command(model(self.path), TRANSCRIPTION, "/run/r.sock", flagged)
        self.assertEqual(refused.exception.code, "flags_not_supported")

    def test_llama_cpp_refuses_a_whisper_model(self) -> None:
        with self.assertRaises(BadRequest) as refused:
            arguments.command("llama-server", model(self.path), COMPLETION, "s.sock", RunnerSettings())
        self.assertEqual(refused.exception.code, "model_is_whisper")

    def test_memory_is_the_weights_and_the_overhead(self) -> None:
        memory = self.backend.memory(model(self.path), TRANSCRIPTION, RunnerSettings())
        self.assertEqual(memory, self.path.stat().st_size + OVERHEAD)
        self.assertEqual(
            self.backend.footprint(model(self.path), TRANSCRIPTION, RunnerSettings()).total, memory
        )


class PackageTests(SynchronousTestCase):
    def test_the_cli_names_a_whisper_model_bin(self) -> None:
        path = Path(self.mktemp())
        tinywhisper.write(path)
        self.assertTrue(is_whisper(path))
        self.assertFalse(is_whisper(Path(self.mktemp())))
        self.assertEqual(
            whisper_members(path, [Path("/x/LICENSE")]),
            [("model.bin", path), ("licenses/0-LICENSE", Path("/x/LICENSE"))],
        )
