"""The usage store as ``twistd -n mrunner`` meets it (real processes: twistd, the scripted runner, the CLI).

A damaged usage.sqlite at start is moved aside before the daemon listens, or ends the start with one
line; a daemon without named keys never opens it; a made-up model leaves no row; ``mrunner usage``
with a day that is no day exits 1 naming it; a home made beforehand with mode 0755 and a umask of
022 still leave every file mrunner writes its owner's alone (issue 35 rows A6, A7, A23; issue 36 N6).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from tests.support.daemon import eventually, short_home, spawn_twistd, stop_twistd, unix_client, write_config
from tests.support.ggufs import write_tiny_gguf

MRUNNER = str(Path(sys.executable).with_name("mrunner"))
TINY = "ai/tiny:latest"
HI = [{"role": "user", "content": "hi"}]
KEYS = """
[keys.root]
key = "root-key"
admin = true
"""
ROOT = {"Authorization": "Bearer root-key"}


class UsageStoreRealTests(TestCase):
    timeout = 120

    def setUp(self) -> None:
        old = os.umask(0o022)  # a user's usual umask: twistd -n keeps it
        self.addCleanup(os.umask, old)

    def config(self, home: Path, keys: str = KEYS) -> Path:
        return write_config(home, 'listen = "unix:{}"\n{}'.format(home / "api.sock", keys))

    def start(self, home: Path, config: Path, output: str = "twistd.out") -> Any:
        process = spawn_twistd(config, home, output_name=output)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(process)) if process.pid else None)
        return process

    async def serving(self, home: Path, config: Path) -> Any:
        process = self.start(home, config)
        await eventually(lambda: (home / "api.sock").exists(), 30, what=lambda: self.said(home))
        return process

    def said(self, home: Path, output: str = "twistd.out") -> str:
        path = home / output
        return path.read_text(errors="replace") if path.exists() else ""

    async def test_random_bytes_moved_aside_before_it_listens(self) -> None:
        home = short_home(self)
        junk = os.urandom(4096)
        (home / "usage.sqlite").write_bytes(junk)
        process = await self.serving(home, self.config(home))
        client = unix_client(str(home / "api.sock"))
        response = await client.get("http://d/engines/usage", headers=ROOT)
        self.assertEqual(response.code, 200, await response.text())
        await stop_twistd(process)
        (aside,) = home.glob("usage.sqlite.damaged-*")
        self.assertEqual(aside.read_bytes(), junk)
        self.assertIn(f"moved to {aside}", self.said(home))

    async def test_what_cannot_be_mended_is_one_line_and_no_socket(self) -> None:
        home = short_home(self)
        (home / "usage.sqlite-wal").mkdir()  # SQLite's write-ahead log, a directory: an I/O error
        process = self.start(home, self.config(home))
        await process.output.ended
        said = self.said(home)
        self.assertEqual(process.output.exit_code, 1, said)
        self.assertIn("mrunner: cannot open the usage file", said)
        self.assertNotIn("Traceback", said)
        self.assertFalse((home / "api.sock").exists(), "it never listened")

    async def test_no_named_keys_never_opens_it(self) -> None:
        home = short_home(self)
        (home / "usage.sqlite").write_bytes(b"not a database")
        await self.serving(home, self.config(home, ""))
        client = unix_client(str(home / "api.sock"))
        response = await client.get("http://d/engines/usage")
        self.assertEqual(response.code, 404)
        self.assertIn("named keys", await response.text())
        self.assertEqual((home / "usage.sqlite").read_bytes(), b"not a database")

    async def test_missing_models_bad_days_and_private_files(self) -> None:
        """A home made beforehand (0755) under umask 022: made 0700, and every file the daemon and its
        runner write there is 0600 (directories 0700); a made-up model leaves no usage row; a day that
        is no day is the CLI's exit 1, naming it."""
        home = short_home(self)
        home.chmod(0o755)
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        ours = {home / name for name in ("tap.conf", "tiny.gguf", "twistd.out")}
        process = await self.serving(home, self.config(home))
        client = unix_client(str(home / "api.sock"))
        with gguf.open("rb") as f:
            response = await client.post("http://d/models/load", params={"name": TINY}, data=f, headers=ROOT)
            self.assertEqual(response.code, 201, await response.text())
        response = await client.post(
            "http://d/v1/chat/completions", json={"model": TINY, "messages": HI}, headers=ROOT
        )
        self.assertEqual(response.code, 200, await response.text())
        for n in range(20):
            response = await client.post(
                "http://d/v1/chat/completions",
                json={"model": f"ai/nothing-{n}", "messages": HI},
                headers=ROOT,
            )
            self.assertEqual(response.code, 404)
        shown = await deferToThread(
            subprocess.run,
            [
                MRUNNER,
                "--host",
                "unix:" + str(home / "api.sock"),
                "--api-key",
                "root-key",
                "usage",
                "--from",
                "2026-13-01",
            ],
            capture_output=True,
            text=True,
        )
        self.assertEqual(shown.returncode, 1, shown.stdout)
        self.assertIn("2026-13-01", shown.stderr)
        await stop_twistd(process)

        with closing(sqlite3.connect(home / "usage.sqlite")) as db:
            self.assertEqual(
                db.execute("SELECT key, model, requests FROM usage").fetchall(), [("root", TINY, 1)]
            )
        self.assertEqual(stat.S_IMODE(home.stat().st_mode), 0o700)
        shared = []
        for root, dirs, files in os.walk(home):
            for name in dirs + files:
                path = Path(root) / name
                if path in ours or path.is_symlink():
                    continue
                if stat.S_IMODE(path.lstat().st_mode) & 0o077:
                    shared.append(f"{path.relative_to(home)} {stat.S_IMODE(path.lstat().st_mode):04o}")
        self.assertEqual(shared, [], "files others may read")
