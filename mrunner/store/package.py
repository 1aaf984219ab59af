"""What ``mrunner package`` uploads: a tar of one ``*.gguf`` and license files under ``licenses/``.

Members are read in place, never extracted, so no name in the archive becomes a path.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO, cast

from mrunner.errors import BadRequest

TAR = b"application/x-tar"
LICENSES = "licenses/"
MAX_LICENSE_BYTES = 1024 * 1024


def read_package(source: BinaryIO) -> tuple[BinaryIO, list[bytes]]:
    """The weights (a file reading from C{source}) and the license texts, in archive order.

    @raise BadRequest: not a tar, not exactly one GGUF, an unexpected entry, or a license over 1 MiB.
    """
    try:
        archive = tarfile.open(fileobj=source, mode="r:")  # noqa: SIM115  # the weights are read after return
        members = [member for member in archive.getmembers() if not member.isdir()]
    except tarfile.TarError as e:
        raise BadRequest(f"the package is not a tar archive: {e}", code="invalid_package") from None
    weights = [m for m in members if m.isfile() and m.name.endswith(".gguf")]
    licenses = [m for m in members if m.isfile() and m.name.startswith(LICENSES)]
    unexpected = [m.name for m in members if m not in weights and m not in licenses]
    if len(weights) != 1 or unexpected:
        raise BadRequest(
            f"a package holds one .gguf file and license files under {LICENSES}; this one has"
            f" {len(weights)} .gguf file(s) and {unexpected or 'nothing else'}",
            code="invalid_package",
        )
    for member in licenses:
        if member.size > MAX_LICENSE_BYTES:
            raise BadRequest(
                f"license {member.name} is over {MAX_LICENSE_BYTES} bytes", code="invalid_package"
            )
    texts = [_open(archive, member).read() for member in licenses]
    return _open(archive, weights[0]), texts


def _open(archive: tarfile.TarFile, member: tarfile.TarInfo) -> BinaryIO:
    return cast(BinaryIO, archive.extractfile(member))  # a regular file always opens
