"""What the store does about bytes that changed on disk, crashes, temps and partials."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from mrunner.errors import BadRequest, NotFound
from mrunner.store import blobs as blobs_module
from mrunner.store.errors import ModelCorrupt
from mrunner.store.local import ModelStore
from mrunner.store.package import MAX_LICENSES
from mrunner.values.model import Model
from tests.support.ggufs import flip_last_byte, package
from tests.support.store_cases import StoreTestCase, tiny_gguf
from tests.support.sync_reactor import InlinePool

MiB = 1024 * 1024


class IntegrityTests(StoreTestCase):
    def corrupt(self, model: Model) -> None:
        flip_last_byte(model.gguf)

    def test_size_is_checked_on_every_load(self) -> None:
        model = self.import_model("x")
        self.assertEqual(self.successResultOf(self.store.ready(self.store.resolve("x"))), model)
        with open(model.gguf, "ab") as f:
            f.write(b"garbage")
        error = self.failureResultOf(self.store.ready(self.store.resolve("x")), ModelCorrupt).value
        self.assertEqual(error.status, 409)
        self.assertIn("pull it again", error.message)
        self.assertIn("weights", error.message)
        self.assertFalse(os.path.exists(model.gguf), "the corrupt blob is out of the store")
        self.assertIn("corrupt", str(self.store.resolve("x").problem))

    def test_digest_is_checked_on_the_first_load_after_start(self) -> None:
        model = self.import_model("x")
        self.corrupt(model)
        restarted = ModelStore(self.home, self.clock)
        self.failureResultOf(restarted.ready(restarted.resolve("x")), ModelCorrupt)
        (listed,) = restarted.list()
        self.assertIn("corrupt", str(listed.problem))
        self.assertEqual(listed.tags, ("ai/x:latest",))

    def test_a_good_model_is_ready_after_restart(self) -> None:
        model = self.import_model("x")
        restarted = ModelStore(self.home, self.clock)
        self.assertEqual(self.successResultOf(restarted.ready(restarted.resolve("x"))), model)

    def test_verify_rehashes_and_reports(self) -> None:
        good = self.import_model("good")
        bad = self.import_model("bad", seed=1)
        reports = self.successResultOf(self.store.verify())
        self.assertEqual([r["status"] for r in reports], ["ok", "ok"])
        self.corrupt(bad)  # the same size: only a hash sees it
        (report,) = self.successResultOf(self.store.verify("bad"))
        self.assertEqual(report["status"], "corrupt")
        self.assertEqual(report["tags"], ["ai/bad:latest"])
        self.assertIn("weights", report["problem"])
        statuses = {blob["mediaType"]: blob["status"] for blob in report["blobs"]}
        self.assertEqual(statuses["application/vnd.docker.ai.gguf.v3"], "corrupt")
        self.assertEqual(statuses["manifest"], "ok")
        self.assertEqual(self.successResultOf(self.store.verify("good"))[0]["status"], "ok")
        self.assertIsNone(self.store.resolve(good.id).problem)
        self.assertRaises(NotFound, self.store.verify, "nothing")

    def test_importing_again_heals(self) -> None:
        model = self.import_model("x")
        self.corrupt(model)
        self.successResultOf(self.store.verify("x"))
        quarantine = self.home / "models" / "quarantine"
        self.assertEqual(len(os.listdir(quarantine)), 1)
        self.import_model("x")
        self.assertIsNone(self.store.resolve(model.id).problem)
        self.assertEqual(os.listdir(quarantine), [])
        self.successResultOf(self.store.ready(self.store.resolve("x")))

    def test_missing_manifest_or_config_is_shown_not_raised(self) -> None:
        model = self.import_model("x")
        config = self.store.manifest(model.id).config.digest
        os.unlink(self.store.blobs.path(config))
        (listed,) = ModelStore(self.home, self.clock).list()
        self.assertIn("cannot be read", str(listed.problem))
        os.unlink(self.store.blobs.path(model.id))
        restarted = ModelStore(self.home, self.clock)
        self.assertIn("cannot be read", str(restarted.resolve("x").problem))
        self.failureResultOf(restarted.ready(restarted.resolve("x")), ModelCorrupt)
        restarted.delete("x")
        self.assertEqual(restarted.list(), [])


class DurabilityTests(StoreTestCase):
    def test_renames_are_followed_by_a_directory_fsync(self) -> None:
        """Each fsync of a directory is recorded with what the directory held at that moment."""
        synced: list[tuple[str, list[str]]] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if os.path.isdir(path):
                synced.append((path, sorted(os.listdir(path))))
            real(fd)

        self.patch(blobs_module.os, "fsync", fsync)
        model = self.import_model("x")
        weights = Path(model.gguf)
        self.assertIn(
            (str(weights.parent.resolve()), sorted(os.listdir(weights.parent))),
            [(path, names) for path, names in synced],
        )
        models = str((self.home / "models").resolve())
        self.assertTrue([names for path, names in synced if path == models and "index.json" in names])

    def test_index_temps_are_swept_at_start(self) -> None:
        self.import_model("x")
        temp = self.home / "models" / "index.0123.tmp"
        temp.write_text("{")
        ModelStore(self.home, self.clock)
        self.assertFalse(temp.exists())

    def test_old_partials_are_removed_and_counted_apart(self) -> None:
        blobs = self.home / "models" / "blobs" / "sha256"
        old, fresh = blobs / ("ab" * 32 + ".incomplete"), blobs / ("cd" * 32 + ".incomplete")
        old.write_bytes(b"o" * 100)
        fresh.write_bytes(b"f" * 10)
        now = self.clock.seconds()
        os.utime(old, (now - 3601, now - 3601))
        os.utime(fresh, (now - 60, now - 60))
        store = ModelStore(self.home, self.clock, partial_max_age=3600)
        self.assertFalse(old.exists())
        self.assertTrue(fresh.exists())
        self.assertEqual((store.disk_usage(), store.partials_usage()), (0, 10))


class PackageTests(StoreTestCase):
    """Packages (tars) are read in a thread, and cost no more than they carry."""

    def tar(self, files: list[tuple[str, bytes]]) -> io.BytesIO:
        return io.BytesIO(package(files))

    def refused(self, source: Any, fragment: str) -> None:
        failure = self.failureResultOf(self.store.import_package("x", source), BadRequest)
        self.assertIn(fragment, failure.value.message)
        self.assertEqual(self.stored_files(), [])

    def test_license_count_and_total_are_capped(self) -> None:
        gguf = ("model.gguf", tiny_gguf(self.home))
        many = [(f"licenses/{n}", b"MIT") for n in range(MAX_LICENSES + 1)]
        self.refused(self.tar([gguf, *many]), f"at most {MAX_LICENSES} licenses")
        large = [(f"licenses/{n}", b"x" * MiB) for n in range(5)]
        self.refused(self.tar([gguf, *large]), "together")

    def test_sparse_members_are_refused(self) -> None:
        """GNU tar's sparse formats: a 64 MiB member carried in a few KiB."""
        work = Path(self.mktemp())
        work.mkdir()
        sparse = work / "model.gguf"
        sparse.write_bytes(tiny_gguf(self.home))
        os.truncate(sparse, 64 * MiB)
        for tar_format in ("gnu", "posix"):
            archive = work / f"{tar_format}.tar"
            status = os.spawnlp(
                os.P_WAIT, "tar", "tar", f"--format={tar_format}", "--sparse", "-C", str(work),
                "-cf", str(archive), "model.gguf",
            )  # fmt: skip
            self.assertEqual(status, 0)
            self.assertLess(archive.stat().st_size, MiB)
            with archive.open("rb") as source:
                self.refused(source, "sparse")

    def test_the_tar_is_read_off_the_reactor_thread(self) -> None:
        """Every read of the upload happens inside the thread pool's work."""
        reads: list[bool] = []

        class Upload(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                reads.append(InlinePool.working)
                return super().read(size)

        upload = Upload(self.tar([("m.gguf", tiny_gguf(self.home)), ("licenses/L", b"MIT")]).getvalue())
        model = self.successResultOf(self.store.import_package("x", upload))
        self.assertEqual(Path(model.files["license"]).read_bytes(), b"MIT")
        self.assertTrue(reads)
        self.assertNotIn(False, reads)
