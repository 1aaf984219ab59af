"""What an uploaded audio file is, and how long it lasts, read from its first bytes and headers.

whisper-server decodes WAV, MP3, FLAC and Ogg Vorbis (miniaudio and stb_vorbis, built in); anything
else is refused here, named as well as its first bytes allow, so a runner never sees it. The
duration is the container's own word for it (WAV's data size, FLAC's sample count, Ogg's last
granule); MP3 has none, and is estimated from its first frame's bit rate.
"""

from __future__ import annotations

import struct

import attrs

from mrunner.errors import BadRequest

#: Formats whisper-server reads, by the name a refusal gives.
READ = ("wav", "mp3", "flac", "ogg")
#: What other common files start with, to name them in a refusal.
_OTHERS = (
    (b"GGUF", "a GGUF model"),
    (b"lmgg", "a whisper.cpp model"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"\x1a\x45\xdf\xa3", "a Matroska or WebM file (not read: convert it to WAV, MP3, FLAC or Ogg Vorbis)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"{", "JSON or text"),
)
_MP3_BITRATES = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)


@attrs.frozen
class Audio:
    """An upload whisper-server can read: its format and its duration in seconds (None if unknown)."""

    format: str
    seconds: float | None


def read(data: bytes, filename: str | None) -> Audio:
    """The audio in C{data}, else L{BadRequest} saying what it is instead."""
    if not data:
        raise BadRequest("the file is empty", code="invalid_file", param="file")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return Audio("wav", _wav_seconds(data))
    if data[:4] == b"fLaC":
        return Audio("flac", _flac_seconds(data))
    if data[:4] == b"OggS":
        return Audio("ogg", _ogg_seconds(data))
    if data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return Audio("mp3", _mp3_seconds(data))
    what = next((name for magic, name in _OTHERS if data.startswith(magic)), "not audio whisper-server reads")
    named = f" ({filename})" if filename else ""
    raise BadRequest(
        f"the file{named} is {what}; the formats read are {', '.join(READ)}",
        code="invalid_file_format",
        param="file",
    )


def _wav_seconds(data: bytes) -> float | None:
    """The seconds of a WAV file's C{data} chunk at its C{fmt } chunk's byte rate."""
    rate, at = None, 12
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and size >= 16:
            rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            present = min(size, len(data) - at - 8)
            return present / rate if rate else None
        at += 8 + size + (size & 1)
    return None


def _flac_seconds(data: bytes) -> float | None:
    """STREAMINFO's total samples over its sample rate (the block that must come first)."""
    if len(data) < 26:
        return None
    packed = int.from_bytes(data[18:26], "big")
    rate, samples = packed >> 44, packed & (2**36 - 1)
    return samples / rate if rate and samples else None


def _ogg_seconds(data: bytes) -> float | None:
    """The last page's granule position over the Vorbis identification header's sample rate."""
    ident = data.find(b"\x01vorbis")
    last = data.rfind(b"OggS")
    if ident < 0 or len(data) < ident + 16 or last + 14 > len(data):
        return None
    rate = struct.unpack_from("<I", data, ident + 12)[0]
    granule = struct.unpack_from("<q", data, last + 6)[0]
    return granule / rate if rate and granule > 0 else None


def _mp3_seconds(data: bytes) -> float | None:
    """The size over the first MPEG-1 Layer III frame's bit rate: exact for constant bit rates."""
    at = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        at = 10 + ((data[6] & 0x7F) << 21 | (data[7] & 0x7F) << 14 | (data[8] & 0x7F) << 7 | (data[9] & 0x7F))
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    index = data[at + 2] >> 4
    if not 0 < index < len(_MP3_BITRATES):
        return None
    return (len(data) - at) * 8 / (_MP3_BITRATES[index] * 1000)
