"""Imports staged as their bytes arrive: package tars read piece by piece, and uploads that leave nothing."""

from __future__ import annotations

import io
import tarfile

from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import BadRequest
from mrunner.store.artifact import CHAT_TEMPLATE
from mrunner.store.package import Untar, Write, ignore
from tests.support.ggufs import package
from tests.support.store_cases import StoreTestCase, tiny_gguf

LONG = "licenses/" + "a-very-long-license-name-" * 8  # over the 100 bytes a plain tar header holds


def archive(tar_format: int, files: list[tuple[str, bytes]], directory: str = "licenses") -> bytes:
    """A tar of C{files} in C{tar_format}, with a directory entry first."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as tar:
        tar.addfile(_directory(directory))
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _directory(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def untar(data: bytes, piece: int) -> list[tuple[str, bytes]]:
    """The files L{Untar} finds in C{data} given C{piece} bytes at a time."""
    found: list[tuple[str, bytearray]] = []

    def start(member: tarfile.TarInfo) -> Write:
        if member.isdir():
            return ignore
        found.append((member.name, bytearray()))
        return found[-1][1].extend

    reader = Untar(start)
    for offset in range(0, len(data), piece):
        reader.feed(memoryview(data)[offset : offset + piece])
    reader.end()
    return [(name, bytes(content)) for name, content in found]


class UntarTests(SynchronousTestCase):
    FILES = [("model.gguf", bytes(range(256)) * 7), (LONG, b"MIT\n"), ("licenses/empty", b"")]

    def test_pieces_of_any_size_give_what_tarfile_reads(self) -> None:
        for tar_format in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
            data = archive(tar_format, self.FILES)
            for piece in (1, 511, 512, 513, 4096, len(data)):
                self.assertEqual(untar(data, piece), self.FILES, (tar_format, piece))

    def test_reading_stops_at_the_end_of_the_archive(self) -> None:
        data = archive(tarfile.PAX_FORMAT, self.FILES[:1])
        self.assertEqual(untar(data + b"trailing bytes after the end", 1000), self.FILES[:1])

    def test_an_archive_cut_short_is_refused(self) -> None:
        data = archive(tarfile.PAX_FORMAT, self.FILES[:1])
        for cut, where in [(1500, "in the middle of 'model.gguf'"), (600, "in a header")]:
            reader = Untar(lambda member: ignore)
            reader.feed(memoryview(data[:cut]))
            error = self.assertRaises(BadRequest, reader.end)
            self.assertIn(where, error.message)
            self.assertIn("cut short", error.message)

    def test_junk_is_not_a_tar(self) -> None:
        reader = Untar(lambda member: ignore)
        error = self.assertRaises(BadRequest, reader.feed, memoryview(b"junk" * 200))
        self.assertIn("not a tar archive", error.message)


class UploadTests(StoreTestCase):
    def test_an_upload_in_pieces_is_the_same_model_as_the_file(self) -> None:
        data = package([("model.gguf", tiny_gguf(self.home)), ("licenses/L", b"MIT")])
        whole = self.successResultOf(self.store.import_package("whole", io.BytesIO(data)))
        upload = self.store.upload(packaged=True)
        for offset in range(0, len(data), 1000):
            upload.write(data[offset : offset + 1000])
        model = self.successResultOf(self.store.import_upload("pieces", upload))
        self.assertEqual(model.id, whole.id)
        self.assertEqual(self.store.resolve("pieces").tags, ("ai/whole:latest", "ai/pieces:latest"))
        upload.close()  # twisted.web's, after the answer: the model stays
        self.assertEqual(len(self.stored_files()), 4)  # manifest, config, weights, license

    def test_members_too_many_are_counted_not_kept(self) -> None:
        templates = [(f"chat-template/{n}.jinja", b"{{ x }}") for n in range(3)]
        others = [(f"other/{n}", b"x") for n in range(100)]
        upload = self.store.upload(packaged=True)
        upload.write(package([("model.gguf", tiny_gguf(self.home)), *templates, *others]))
        self.assertEqual(len(upload._texts[CHAT_TEMPLATE]), 1)
        error = self.failureResultOf(self.store.import_upload("x", upload), BadRequest).value
        self.assertIn(
            "1 .gguf file(s), 0 .bin file(s), 0 projector(s), 3 template(s) and ['other/0',", error.message
        )
        self.assertEqual(error.message.count("other/"), 5)

    def test_an_upload_nobody_took_leaves_nothing(self) -> None:
        upload = self.store.upload(packaged=False)
        upload.write(tiny_gguf(self.home)[:1000])
        self.assertEqual(len(self.stored_files()), 1)  # the staged weights
        upload.close()  # a lost connection, or a refused request
        self.assertEqual(self.stored_files(), [])

    def test_a_failed_import_leaves_nothing(self) -> None:
        for packaged, body, fragment in [
            (False, b"junk", "not a valid GGUF"),
            (True, b"junk" * 200, "not a tar"),
            (True, package([("model.gguf", b"x" * 2000)])[:1500], "cut short"),
            (True, package([("model.gguf", b"x"), ("licenses/L", b"\xff" * 2 * 1024 * 1024)]), "over"),
        ]:
            upload = self.store.upload(packaged)
            upload.write(body)
            error = self.failureResultOf(self.store.import_upload("x", upload), BadRequest).value
            self.assertIn(fragment, error.message)
            self.assertEqual(error.status, 400)
            self.assertEqual(self.stored_files(), [])
