"""What an uploaded audio file is, and how long it lasts, read from its first bytes and headers.

whisper-server decodes WAV, MP3, FLAC and Ogg Vorbis (miniaudio and stb_vorbis, built in); anything
else is refused here, named as well as its first bytes allow, so a runner never sees it. The
duration is what whisper-server's decoder will read, not what a header claims: a WAV's data bytes
present over its frame size and sample rate (never its byte rate, which no decoder reads: a byte
rate of 10,000,000 made 35 minutes look like 5 s), FLAC's sample count (miniaudio reads that many
samples and no more), Ogg's last granule; MP3 has none, and is estimated from its first frame's bit
rate. A file cut short in its header, or one whose header the decoder would refuse, is a 400 here.
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
#: The most chunks a WAV may have before its audio; recorders write a handful (fmt, fact, LIST, bext).
MAX_WAV_CHUNKS = 64
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
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return Audio("mp3", _mp3_seconds(data))
    what = next((name for magic, name in _OTHERS if data.startswith(magic)), "not audio whisper-server reads")
    named = f" ({filename})" if filename else ""
    raise BadRequest(
        f"the file{named} is {what}; the formats read are {', '.join(READ)}",
        code="invalid_file_format",
        param="file",
    )


def damaged(what: str, why: str) -> BadRequest:
    """A file whose header whisper-server's decoder would refuse, or that says nothing of its length."""
    return BadRequest(
        f"the {what} file {why}: save or convert it again (e.g. `ffmpeg -i IN -ar 16000 -ac 1 OUT.wav`)",
        code="invalid_file",
        param="file",
    )


def _wav_seconds(data: bytes) -> float:
    """The seconds of a WAV file's C{data} chunk: its bytes present at its C{fmt } chunk's frame size.

    The walk stops at C{data}, as miniaudio's does (it wants C{fmt } first), and after
    L{MAX_WAV_CHUNKS}: a file of 8-byte chunks took the reactor 0.6 s a request to walk.
    """
    rate = frame = 0.0
    at = 12
    for _ in range(MAX_WAV_CHUNKS):
        if at + 8 > len(data):
            raise damaged("WAV", "holds no audio (no data chunk)" if rate else "has no fmt chunk")
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt ":
            rate, frame = _wav_format(data[at + 8 : at + 24])
        elif chunk == b"data":
            if not rate:
                raise damaged("WAV", "has its data chunk before its fmt chunk, or no fmt chunk")
            return min(size, len(data) - at - 8) / frame / rate
        at += 8 + size + (size & 1)
    raise damaged("WAV", f"has over {MAX_WAV_CHUNKS} chunks before its audio")


def _wav_format(fmt: bytes) -> tuple[float, float]:
    """The sample rate and the bytes a frame takes (all channels: 1 for 8-bit mono, 0.5 for 4-bit ADPCM)."""
    if len(fmt) < 16:
        raise damaged("WAV", "is cut short inside its fmt chunk")
    channels, rate, _, align, bits = struct.unpack_from("<HIIHH", fmt, 2)
    for name, value in (("sample rate", rate), ("channel count", channels), ("bits per sample", bits)):
        if not value:
            raise damaged("WAV", f"gives a {name} of 0 in its fmt chunk")
    if not align:
        raise damaged("WAV", "gives a block size of 0 in its fmt chunk")
    return float(rate), channels * bits / 8


def _flac_seconds(data: bytes) -> float:
    """STREAMINFO's total samples over its sample rate: miniaudio reads that many samples and no more,
    so a total of 0 (unknown, as a stream may leave it) would be transcribed as nothing."""
    if len(data) < 26:
        raise damaged("FLAC", "is cut short inside its STREAMINFO block")
    if data[4] & 0x7F != 0:
        raise damaged("FLAC", "does not begin with its STREAMINFO block")
    packed = int.from_bytes(data[18:26], "big")
    rate, samples = packed >> 44, packed & (2**36 - 1)
    if not rate:
        raise damaged("FLAC", "gives a sample rate of 0")
    if not samples:
        raise damaged("FLAC", "does not say how many samples it holds (its STREAMINFO total is 0)")
    return samples / rate


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
