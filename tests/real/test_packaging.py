"""``twistd mrunner`` finds its plugin after ``pip install -e .`` and after ``pip install .``.

These tests run pip and Python as child processes.
"""

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).parents[2]
TAPNAMES = (
    "from twisted.plugin import getPlugins\n"
    "from twisted.application.service import IServiceMaker\n"
    "print(sorted(p.tapname for p in getPlugins(IServiceMaker)))\n"
)


def tapnames(*python: str, env: dict[str, str] | None = None) -> str:
    """The twistd plugins a Python started outside the checkout sees."""
    done = subprocess.run(
        [*python, "-c", TAPNAMES], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


class PluginTests(SynchronousTestCase):
    def test_editable_install(self) -> None:
        """``make install`` runs ``pip install -e .``: this very environment."""
        self.assertIn("'mrunner'", tapnames(sys.executable))

    def test_regular_install(self) -> None:
        work = Path(tempfile.mkdtemp(prefix="mr-pkg-"))
        self.addCleanup(shutil.rmtree, work)
        source, target = work / "source", work / "target"
        # setuptools builds in the source tree: build a copy, leave the checkout clean.
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "mrunner", "twisted"):
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / name, source / name)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(source)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        self.assertTrue((target / "twisted" / "plugins" / "mrunner_plugin.py").is_file())
        for page_file in ("index.html", "app.js", "style.css"):  # the web page ships as package data
            self.assertTrue((target / "mrunner" / "ui" / page_file).is_file(), page_file)
        # -S: no .pth files, so the editable install of this checkout stays out of sys.path.
        env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}"}
        self.assertIn("'mrunner'", tapnames(sys.executable, "-S", env=env))
