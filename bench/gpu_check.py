"""``make gpu-check``: mrunner on an NVIDIA GPU, checked end to end, in one table.

On a host with an NVIDIA GPU (NVML or ``nvidia-smi`` answers) it takes the CUDA build of
llama-server (``$MRUNNER_CUDA_LLAMA_SERVER``, else the one ``make cuda-build`` left in the
cache, else it builds it) and checks, each in a daemon of its own:

1. offload: SmolLM2 with every layer on the GPU, the runner holding at least the GGUF's
   size there (NVML's use by the runner's process, else the drop in free memory);
2. devices: ``GET /engines/devices``' total and free memory of CUDA0 against NVML's,
   within 2% of the total;
3. speed: tokens/s of one answer on the GPU against the CPU (the CPU build when the cache
   has one, else the CUDA build with ``[gpu] devices = "none"``, whose runner must then hold
   nothing on the GPU, and ``-ngl 0``: the same CPU code);
4. swap: a GPU budget with room for one runner of either of two models: the second evicts the first;
5. partial: a GPU budget of half what the model takes there: some of its layers offloaded,
   the rest on the CPU, and it answers;
6. oom: a llama-server outside mrunner holds all but a little of the GPU, so the budget
   (all of it) is more than is free; a model that fits the budget and not what is free
   fails to allocate, and mrunner's one retry with fewer layers loads it;
7. instances: ``instances = 2`` and one slot each: two requests at once are served by
   two runners, one each (least-busy dispatch).

``--gguf`` takes another GGUF for SmolLM2 (``make gpu-bundle``'s zero-weight copy on a
machine without it); ``--out`` receives ``table.txt`` and ``results.json``, ``--logs``
each daemon's home and logs. Without an NVIDIA GPU it says so and exits 0 with nothing
checked; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_card import MIB, Gpu
from bench.gpu_checks import CHECKS, Run
from mrunner.backends.llamacpp.source import cached_executable


def cuda_server() -> Path:
    """The CUDA llama-server to check: the one given, the cached one, or a new build."""
    given = os.environ.get("MRUNNER_CUDA_LLAMA_SERVER")
    if given:
        return Path(given)
    cached = cached_executable(variant="cuda")
    if not cached.is_file():
        print("gpu-check: building the CUDA variant (make cuda-build); this takes a while", flush=True)
        subprocess.run([sys.executable, "-m", "mrunner.backends.llamacpp", "--variant=cuda"], check=True)
    return cached


def smollm2() -> Path:
    from bench.gpu_bundle import smollm2

    return smollm2()


def table(rows: list[tuple[str, str, bool]], seconds: dict[str, float]) -> str:
    width = max((len(check) for check, _, _ in rows), default=5)
    lines = [f"{'check':<{width}}  {'':4}  result"]
    lines += [f"{check:<{width}}  {'ok  ' if ok else 'FAIL'}  {result}" for check, result, ok in rows]
    lines += ["", "seconds: " + ", ".join(f"{name} {s:.1f}" for name, s in seconds.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, help="SmolLM2's GGUF, or a copy of its layout")
    parser.add_argument("--out", type=Path, help="where table.txt and results.json go")
    parser.add_argument("--logs", type=Path, help="where each daemon's home and logs go (kept)")
    args = parser.parse_args(argv)
    gpu = Gpu.find()
    if gpu is None:
        print("gpu-check: no NVIDIA GPU here (nvidia-smi does not answer): nothing checked.")
        return 0
    # SIGTERM (the GPU script's time limit) unwinds, so every process started here is stopped by its PID.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    run = Run(gpu, cuda_server(), args.gguf or smollm2(), logs)
    total, _ = gpu.memory()
    print(f"gpu-check: {gpu.name}, {total // MIB} MiB ({gpu.source}); CUDA build {run.cuda}", flush=True)
    seconds: dict[str, float] = {}
    for name, check in CHECKS:
        began = time.perf_counter()
        try:
            check(run)
        except Exception as e:  # one check's failure is a row; the others still run
            run.row(name, f"error: {type(e).__name__}: {e}", False)
        seconds[name] = time.perf_counter() - began
        print(f"gpu-check: {name} took {seconds[name]:.1f}s", flush=True)
        if name == "offload" and not run.counted:
            break  # nothing else can be sized without it
    text = table(run.rows, seconds)
    print("\n" + text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.txt").write_text(text)
        results = {"gpu": gpu.name, "rows": run.rows, "seconds": seconds}
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if not args.logs:
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if all(ok for _, _, ok in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
