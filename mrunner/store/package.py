"""What ``mrunner package`` uploads: a tar of the model's files, each kind in its place.

- ``*.gguf`` at the top: the weights, one file or the shards of a split model in order;
- ``licenses/*``: license texts;
- ``mmproj/*``: at most one multimodal projector;
- ``chat-template/*``: at most one Jinja chat template.

Members are read in place, never extracted, so no name in the archive becomes a path.
Sparse members are refused: their holes would make a small upload a huge blob.
Licenses and templates are read into memory, so their count and sizes are capped.
Reading is blocking file work: call it off the reactor thread.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO, cast

import attrs

from mrunner.errors import BadRequest

TAR = b"application/x-tar"
LICENSES = "licenses/"
MMPROJ = "mmproj/"
CHAT_TEMPLATE = "chat-template/"
MAX_LICENSE_BYTES = 1024 * 1024
MAX_LICENSES = 16
MAX_LICENSES_BYTES = 4 * 1024 * 1024
MAX_TEMPLATE_BYTES = 1024 * 1024
MAX_SHARDS = 256


@attrs.frozen
class Package:
    """The files of one model, as streams (big) or bytes (small)."""

    weights: list[BinaryIO]
    licenses: list[bytes] = attrs.field(factory=list)
    mmproj: BinaryIO | None = None
    chat_template: bytes | None = None


def read_package(source: BinaryIO) -> Package:
    """The model in the package tar read from C{source}.

    @raise BadRequest: not a tar, no GGUF, an unexpected or sparse entry, more
        than one projector or template, or licenses and templates over their caps.
    """
    try:
        archive = tarfile.open(fileobj=source, mode="r:")  # noqa: SIM115  # the weights are read after return
        members = [member for member in archive.getmembers() if not member.isdir()]
    except tarfile.TarError as e:
        raise BadRequest(f"the package is not a tar archive: {e}", code="invalid_package") from None
    sparse = [m.name for m in members if m.issparse()]
    if sparse:
        raise _invalid(f"sparse tar members are not accepted ({sparse[0]!r}): write the tar without --sparse")
    files = [m for m in members if m.isfile()]
    weights = [m for m in files if "/" not in m.name and m.name.endswith(".gguf")]
    licenses = [m for m in files if m.name.startswith(LICENSES)]
    mmproj = [m for m in files if m.name.startswith(MMPROJ)]
    template = [m for m in files if m.name.startswith(CHAT_TEMPLATE)]
    known = {id(m) for m in (*weights, *licenses, *mmproj, *template)}
    unexpected = [m.name for m in members if id(m) not in known]
    if not weights or unexpected or len(mmproj) > 1 or len(template) > 1 or len(weights) > MAX_SHARDS:
        raise _invalid(
            "a package holds the weights (one .gguf file, or up to"
            f" {MAX_SHARDS} shards in order) at its top, license files under {LICENSES}, at most one"
            f" projector under {MMPROJ} and one chat template under {CHAT_TEMPLATE}; this one has"
            f" {len(weights)} .gguf file(s), {len(mmproj)} projector(s), {len(template)} template(s)"
            f" and {unexpected[:5] or 'nothing else'}"
        )
    _check_licenses(licenses)
    if template and template[0].size > MAX_TEMPLATE_BYTES:
        raise _invalid(f"the chat template is over {MAX_TEMPLATE_BYTES} bytes")
    return Package(
        weights=[_open(archive, member) for member in weights],
        licenses=[_open(archive, member).read() for member in licenses],
        mmproj=_open(archive, mmproj[0]) if mmproj else None,
        chat_template=_template(_open(archive, template[0]).read()) if template else None,
    )


def _template(text: bytes) -> bytes:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("the chat template is not UTF-8 text") from None
    return text


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
