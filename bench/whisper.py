"""``python -m bench.whisper``: the real-time factor of a 30-second clip through mrunner, against
whisper-server directly, in one run.

mrunner starts with a Whisper model (a tiny random one whose decoder always says the same word, so
each request takes the same work, unless ``--model`` names a real ggml file) and loads its runner
with a first request; the direct whisper-server then runs with that runner's very command line,
read back from the kernel, on a socket of its own. The clip is
espeak-ng's speech padded with silence to 30 s (16 kHz mono WAV). The two paths take the same
request in alternating rounds; each round's time is from the first byte sent to the last byte
received. Prints one row: each path's median real-time factor (seconds taken per second of audio:
lower is faster) and direct's over mrunner's (1.0: mrunner adds nothing; the goal is 0.97 or more).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import daemon, http
from bench.rounds import interleave
from bench.servers import ServerFailed, replaced, running
from mrunner.backends.whispercpp.source import cached_executable
from mrunner.testing import tinywhisper

MODEL = "bench/whisper"
SECONDS = 30.0
RATE = 16000
TEXT = (
    "The quick brown fox jumps over the lazy dog. mrunner schedules language models and speech models"
    " side by side, sharing the memory of one machine. This clip is thirty seconds long."
)


def clip(path: Path, scratch: Path) -> float:
    """espeak-ng's speech of L{TEXT} at 16 kHz, padded with silence to L{SECONDS}; its length."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise SystemExit("bench.whisper needs espeak-ng (make system-deps installs it)")
    spoken = scratch / "spoken.wav"
    subprocess.run([espeak, "-s", "140", "-w", str(spoken), TEXT], check=True, capture_output=True)
    with wave.open(str(spoken), "rb") as source:
        rate, frames = source.getframerate(), source.readframes(source.getnframes())
    samples = [int.from_bytes(frames[i : i + 2], "little", signed=True) for i in range(0, len(frames), 2)]
    step = rate / RATE  # espeak-ng speaks at 22 050 Hz: take every step-th sample
    resampled = [samples[int(n * step)] for n in range(int(len(samples) / step))]
    total = int(SECONDS * RATE)
    padded = (resampled + [0] * total)[:total]
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(b"".join(s.to_bytes(2, "little", signed=True) for s in padded))
    return total / RATE


def timed(client: Any, url: str, audio: bytes, model: str | None) -> float:
    """Seconds for one transcription, the whole answer read."""
    fields = {"response_format": "json", **({"model": model} if model else {})}
    began = time.perf_counter()
    response = client.post(url, files={"file": ("clip.wav", audio)}, data=fields)
    response.raise_for_status()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.whisper", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="requests per path (default: 5)")
    parser.add_argument("--model", help="a whisper.cpp ggml model (default: the tests' tiny random one)")
    args = parser.parse_args()
    executable = cached_executable()
    if not executable.is_file():
        raise SystemExit(f"no {executable}: run python -m mrunner.backends.whispercpp")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mrb-whisper-")))
        model = Path(args.model) if args.model else tmp / "ggml-tiny-random.bin"
        if not args.model:
            tinywhisper.write(model, peaked=True)
        audio_path = tmp / "clip.wav"
        seconds = clip(audio_path, tmp)
        audio = audio_path.read_bytes()
        conf = f'[scheduler]\nkeep_alive = -1\n[backends."whisper.cpp"]\npath = "{executable}"\n'
        mrunner = stack.enter_context(daemon.started(tmp / "home", conf, "llama.cpp"))
        daemon.import_model(mrunner.url, MODEL, model)
        client = stack.enter_context(http.client(timeout=600.0))
        timed(client, f"{mrunner.url}/v1/audio/transcriptions", audio, MODEL)  # loads the runner
        socket = str(tmp / "direct.sock")
        argv = replaced(daemon.runner_argv(mrunner.url), "--host", ["--host", socket])
        direct = stack.enter_context(running(argv, tmp / "direct.log"))
        direct.wait_ready("http://direct/health", uds=socket)
        direct_client = stack.enter_context(http.client(timeout=600.0, uds=socket))
        timed(direct_client, "http://direct/inference", audio, None)  # the same warm-up
        paths = {
            "direct": lambda: timed(direct_client, "http://direct/inference", audio, None),
            "mrunner": lambda: timed(client, f"{mrunner.url}/v1/audio/transcriptions", audio, MODEL),
        }
        samples = interleave(paths, args.rounds, lambda name, measure: measure())
    factors = {name: statistics.median(values) / seconds for name, values in samples.items()}
    ratio = factors["direct"] / factors["mrunner"]
    print(f"{'path':<10}{'real-time factor (median of ' + str(args.rounds) + ')':>36}")
    for name, factor in factors.items():
        print(f"{name:<10}{factor:>36.4f}")
    print(f"whisper {seconds:.0f} s clip: mrunner at {ratio:.3f} of direct's speed (goal >= 0.97)")


if __name__ == "__main__":
    try:
        main()
    except ServerFailed as e:
        print(f"bench.whisper: {e}", file=sys.stderr)
        raise SystemExit(1) from None
