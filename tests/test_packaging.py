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

ROOT = Path(__file__).parent.parent
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
        target = tempfile.mkdtemp(prefix="mr-pkg-")
        self.addCleanup(shutil.rmtree, target)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, str(ROOT)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        self.assertTrue((Path(target) / "twisted" / "plugins" / "mrunner_plugin.py").is_file())
        # -S: no .pth files, so the editable install of this checkout stays out of sys.path.
        env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}"}
        self.assertIn("'mrunner'", tapnames(sys.executable, "-S", env=env))
