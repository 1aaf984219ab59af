"""Where a build finds its programs (mrunner/backends/programs.py): PATH, then beside the interpreter,
then in the program's Python package, as pip installs CMake and ninja (issue 50)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends import programs


def program(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class FindTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.root = Path(self.mktemp()).resolve()
        self.path = self.root / "path"
        self.path.mkdir(parents=True)
        self.python = str(self.root / "python" / "bin" / "python3")
        self.environ = {"PATH": str(self.path)}

    def package(self, name: str, body: str) -> None:
        """C{name} importable for the test's length, from a folder of its own at the head of sys.path."""
        folder = self.root / f"site-{name}"
        (folder / name).mkdir(parents=True)
        if body:
            (folder / name / "__init__.py").write_text(body)
        sys.path.insert(0, str(folder))
        self.addCleanup(sys.path.remove, str(folder))
        self.addCleanup(sys.modules.pop, name, None)

    def test_path_first(self) -> None:
        on_path = program(self.path / "cmake")
        program(Path(self.python).with_name("cmake"))
        self.assertEqual(programs.find("cmake", self.environ, self.python), str(on_path))

    def test_beside_the_interpreter(self) -> None:
        """The lent machine's case: CMake in its Python's bin, which its PATH lacked."""
        beside = program(Path(self.python).with_name("cmake"))
        self.assertEqual(programs.find("cmake", self.environ, self.python), str(beside))

    def test_beside_the_interpreter_a_link_leads_to(self) -> None:
        """A python3 on PATH that links into another Python's bin, which has CMake."""
        real = program(self.root / "opt" / "bin" / "python3.12")
        beside = program(real.with_name("cmake"))
        Path(self.python).parent.mkdir(parents=True)
        Path(self.python).symlink_to(real)
        self.assertEqual(programs.find("cmake", self.environ, self.python), str(beside))

    def test_in_the_python_package(self) -> None:
        """pip install --target leaves no script on a PATH: the package names its binaries' folder."""
        folder = self.root / "ninja-data" / "bin"
        ninja = program(folder / "ninja")
        self.package("ninja", f"BIN_DIR = {str(folder)!r}\n")
        self.assertEqual(programs.find("ninja", self.environ, self.python), str(ninja))

    def test_a_bare_cmake_directory_is_not_the_package(self) -> None:
        """llama.cpp's tree has a cmake/ folder: on sys.path it is a namespace package, passed over."""
        self.package("cmake", "")
        self.assertIsNone(programs.package_folder("cmake"))

    def test_nowhere(self) -> None:
        self.assertIsNone(programs.find("cmake", self.environ, self.python))
        self.assertIsNone(programs.find("tar", self.environ, self.python))
