"""What ``mrunner package`` uploads: a tar of one ``*.gguf`` and license files under ``licenses/``.

Members are read in place, never extracted, so no name in the archive becomes a path.
Sparse members are refused: their holes would make a small upload a huge blob.
Licenses are read into memory, so their count and total size are capped.
Reading is blocking file work: call it off the reactor thread.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO, cast

from mrunner.errors import BadRequest

TAR = b"application/x-tar"
LICENSES = "licenses/"
MAX_LICENSE_BYTES = 1024 * 1024
MAX_LICENSES = 16
MAX_LICENSES_BYTES = 4 * 1024 * 1024


def read_package(source: BinaryIO) -> tuple[BinaryIO, list[bytes]]:
    """The weights (a file reading from C{source}) and the license texts, in archive order.

    @raise BadRequest: not a tar, not exactly one GGUF, an unexpected or sparse
        entry, or licenses over their caps.
    """
    try:
        archive = tarfile.open(fileobj=source, mode="r:")  # noqa: SIM115  # the weights are read after return
        members = [member for member in archive.getmembers() if not member.isdir()]
    except tarfile.TarError as e:
        raise BadRequest(f"the package is not a tar archive: {e}", code="invalid_package") from None
    sparse = [m.name for m in members if m.issparse()]
    if sparse:
        raise _invalid(f"sparse tar members are not accepted ({sparse[0]!r}): write the tar without --sparse")
    weights = [m for m in members if m.isfile() and m.name.endswith(".gguf")]
    licenses = [m for m in members if m.isfile() and m.name.startswith(LICENSES)]
    unexpected = [m.name for m in members if m not in weights and m not in licenses]
    if len(weights) != 1 or unexpected:
        raise _invalid(
            f"a package holds one .gguf file and license files under {LICENSES}; this one has"
            f" {len(weights)} .gguf file(s) and {unexpected or 'nothing else'}"
        )
    _check_licenses(licenses)
    texts = [_open(archive, member).read() for member in licenses]
    return _open(archive, weights[0]), texts


def _check_licenses(licenses: list[tarfile.TarInfo]) -> None:
    if len(licenses) > MAX_LICENSES:
        raise _invalid(f"a package holds at most {MAX_LICENSES} licenses; this one has {len(licenses)}")
    for member in licenses:
        if member.size > MAX_LICENSE_BYTES:
            raise _invalid(f"license {member.name} is over {MAX_LICENSE_BYTES} bytes")
    total = sum(member.size for member in licenses)
    if total > MAX_LICENSES_BYTES:
        raise _invalid(f"the licenses take {total} bytes together; at most {MAX_LICENSES_BYTES} are accepted")


def _invalid(message: str) -> BadRequest:
    return BadRequest(message, code="invalid_package")


def _open(archive: tarfile.TarFile, member: tarfile.TarInfo) -> BinaryIO:
    return cast(BinaryIO, archive.extractfile(member))  # a regular file always opens
