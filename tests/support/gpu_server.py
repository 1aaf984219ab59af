"""A fake GPU llama-server for tests: it claims GPUs, then execs the real CPU llama-server.

Run as ``python gpu_server.py ARGS...`` with llama-server's own arguments, or through the
executable script L{write_wrapper} puts where a test's ``[backends."llama.cpp"] path`` points.
Its environment says what it pretends:

- ``MRUNNER_FAKE_GPU``: the devices, one of
  ``one``     CUDA0 "NVIDIA GeForce RTX 4090", 24080 MiB total, 23700 MiB free;
  ``two``     CUDA0 "NVIDIA GeForce RTX 4090" (24576 MiB, 24000 free) and
              CUDA1 "NVIDIA GeForce RTX 3060" (12288 MiB, 12000 free);
  ``rocm``    ROCm0 "AMD Radeon RX 7800 XT" (16384 MiB, 16000 free);
  ``none``    no GPU (the default when unset);
  ``garbage`` ``--list-devices`` prints lines no parser should take for a device;
  or a list ``ID=TOTAL/FREE[,ID=TOTAL/FREE...]`` in MiB (e.g. ``CUDA0=8/6``), each named "Fake GPU".
- ``MRUNNER_FAKE_GPU_REAL``: the real CPU llama-server to exec (required for anything but
  ``--list-devices``).
- ``MRUNNER_FAKE_GPU_OOM_LAYERS=N``: a load asking for more than N GPU layers fails as
  llama.cpp's CUDA build does when ``cudaMalloc`` runs out of memory, and exits 1.
- ``MRUNNER_FAKE_GPU_OOM_CONTEXT=N``: so does a load with any layer on a GPU and a ``--ctx-size``
  over N tokens.

What it does:

- ``--list-devices``: prints the devices exactly as llama.cpp's ``common_print_available_devices``
  does (``  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23700 MiB free)``, or ``  (none)``), exits 0.
- a load (anything else) on a scenario with GPUs: prints to stderr, in llama.cpp's formats and with
  its log prefix, at ``-lv 4`` or above only (the pinned build logs the library's information
  there; its errors at any level), ``load_tensors: offloaded G/L+1 layers to GPU``, then a
  ``model buffer size`` line per device holding layers plus ``CPU_Mapped`` for the rest, a
  ``KV buffer size`` line per device holding layers (and ``CPU`` for the rest) and a
  ``compute buffer size`` line per device used.
  G comes from ``-ngl``/``--gpu-layers``/``--n-gpu-layers`` (a number; ``auto``, ``all`` or none
  given: every layer), the devices from ``-dev``/``--device`` (default all; ``none``: no GPU), the
  shares from ``-ts``/``--tensor-split`` (default: in proportion to free memory). Weights are the
  GGUF's file size shared evenly over its ``block_count`` layers plus the output layer; the KV cache
  is f16 keys and values for ``--ctx-size`` (default 4096) tokens per layer; compute buffers are
  llama-server's micro-batch arithmetic. Then it execs the real server without the GPU-only
  options (``-ngl``, ``-ts``, ``-dev``, ``-sm``, ``-mg``, ``-fitt`` and their long forms), so every
  route works.
- ``--version`` and any load with no GPU: execs the real server (without the GPU-only options).
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import time
from pathlib import Path
from typing import Any

MIB = 2**20
UBATCH = 512
SCENARIOS = {
    "one": [("CUDA0", "NVIDIA GeForce RTX 4090", 24080, 23700)],
    "two": [
        ("CUDA0", "NVIDIA GeForce RTX 4090", 24576, 24000),
        ("CUDA1", "NVIDIA GeForce RTX 3060", 12288, 12000),
    ],
    "rocm": [("ROCm0", "AMD Radeon RX 7800 XT", 16384, 16000)],
    "none": [],
}
GARBAGE = (
    "ggml_cuda_init: failed to initialize CUDA: unknown error\n"
    "Available devices:\n"
    "  CUDA0: NVIDIA GeForce RTX 4090 (lots of MiB)\n"
    "  ???\n"
    "\x1b[31m  Vulkan0 (24080 MiB, 23700 MiB free\n"
)
#: Options only a GPU build takes (or that name GPUs), each with a value.
GPU_OPTIONS = {
    "-ngl": "layers",
    "--gpu-layers": "layers",
    "--n-gpu-layers": "layers",
    "-ts": "split",
    "--tensor-split": "split",
    "-dev": "device",
    "--device": "device",
    "-sm": "",
    "--split-mode": "",
    "-mg": "",
    "--main-gpu": "",
    "-fitt": "",
    "--fit-target": "",
}
_START = time.monotonic()


def devices(scenario: str) -> list[tuple[str, str, int, int]] | None:
    """The scenario's (id, name, total MiB, free MiB); None for ``garbage``."""
    if scenario == "garbage":
        return None
    if scenario in SCENARIOS:
        return SCENARIOS[scenario]
    found = []
    for item in scenario.split(","):
        ident, _, sizes = item.partition("=")
        total, _, free = sizes.partition("/")
        found.append((ident.strip(), "Fake GPU", int(total), int(free or total)))
    return found


def list_devices(scenario: str) -> str:
    """``llama-server --list-devices``' output for C{scenario}."""
    found = devices(scenario)
    if found is None:
        return GARBAGE
    lines = ["Available devices:"]
    lines += [f"  {ident}: {name} ({total} MiB, {free} MiB free)" for ident, name, total, free in found]
    return "\n".join(lines if found else [*lines, "  (none)"]) + "\n"


def split_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The GPU options' values by kind, and the arguments the CPU server gets."""
    gpu: dict[str, str] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in GPU_OPTIONS:
            if not equals:
                value = next(args, "")
            if GPU_OPTIONS[name]:
                gpu[GPU_OPTIONS[name]] = value
            continue
        rest.append(arg)
    return gpu, rest


def option(argv: list[str], *names: str, default: str = "") -> str:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        name, equals, value = arg.partition("=")
        if equals and name in names:
            return value
    return default


def log(level: str, text: str) -> None:
    """One line as llama-server's common_log prints it: elapsed time, level, text."""
    micros = int((time.monotonic() - _START) * 1e6)
    minutes, seconds = micros // 60_000_000, micros // 1_000_000 % 60
    stamp = f"{minutes}.{seconds:02d}.{micros // 1000 % 1000:03d}.{micros % 1000:03d}"
    sys.stderr.write(f"{stamp} {level} {text}\n")


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


def gguf_numbers(path: str) -> dict[str, float]:
    """The GGUF header's numeric keys, read directly: gguf's reader takes seconds over a vocabulary."""
    found: dict[str, float] = {}
    with open(path, "rb") as f:

        def read(fmt: str) -> Any:
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def text() -> bytes:
            return f.read(read("<Q"))

        def value(kind: int) -> Any:
            if kind in _SCALARS:
                return read(_SCALARS[kind])
            if kind == 8:
                return text()
            if kind == 9:
                item, count = read("<I"), read("<Q")
                if item in _SCALARS:
                    f.seek(struct.calcsize(_SCALARS[item]) * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        value(item)
                return None
            raise ValueError(f"GGUF value type {kind}")

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        read("<I")
        read("<Q")
        for _ in range(read("<Q")):
            key = text().decode()
            number = value(read("<I"))
            if isinstance(number, int | float):
                found[key] = number
    return found


def model_shape(path: str) -> tuple[int, int, int]:
    """The GGUF's file size, layer count and KV bytes per token per layer (f16 keys and values)."""
    try:
        numbers = gguf_numbers(path)
    except (OSError, ValueError, struct.error):  # a file that is no GGUF: the real server will say so
        numbers = {}

    def number(suffix: str, default: int) -> int:
        return next((int(v) for k, v in numbers.items() if k.endswith("." + suffix)), default)

    layers = number("block_count", 1) or 1
    embedding = number("embedding_length", 64)
    heads = number("attention.head_count", 1) or 1
    kv_heads = number("attention.head_count_kv", heads)
    return os.path.getsize(path), layers, 2 * kv_heads * (embedding // heads) * 2


def shares(count: int, weights: list[float]) -> list[int]:
    """C{count} layers over devices in proportion to C{weights}, as whole layers."""
    total = sum(weights) or 1.0
    given, cumulative = [], 0.0
    for weight in weights:
        cumulative += weight
        given.append(round(count * cumulative / total) - sum(given))
    return given


def out_of_memory(on_gpu: int, context: int) -> bool:
    """Whether a load of C{on_gpu} layers and C{context} tokens is over the limits the environment sets."""
    layers = os.environ.get("MRUNNER_FAKE_GPU_OOM_LAYERS")
    tokens = os.environ.get("MRUNNER_FAKE_GPU_OOM_CONTEXT")
    too_many = layers is not None and on_gpu > int(layers)
    return too_many or (tokens is not None and on_gpu > 0 and context > int(tokens))


def load(found: list[tuple[str, str, int, int]], gpu: dict[str, str], argv: list[str]) -> int | None:
    """Print the load lines for a GPU load; the exit status if it runs out of memory, else None."""
    wanted = gpu.get("device", "")
    if wanted == "none":
        return None
    if wanted:
        names = wanted.split(",")
        found = [device for device in found if device[0] in names]
    model = option(argv, "-m", "--model")
    if not found or not model or not os.path.exists(model):
        return None
    size, layers, kv_per_token = model_shape(model)
    context = int(option(argv, "-c", "--ctx-size", default="4096")) or 4096
    offloadable = layers + 1
    asked = gpu.get("layers", "auto")
    on_gpu = offloadable if asked in ("auto", "all", "-1", "-2", "") else min(int(asked), offloadable)
    split = [float(x) for x in gpu["split"].split(",")] if gpu.get("split") else []
    weights = (split + [0.0] * len(found))[: len(found)] if split else [free for *_, free in found]
    per_device = shares(on_gpu, weights)
    per_layer = size / offloadable
    kv_layer = context * kv_per_token
    verbosity = int(option(argv, "-lv", "--verbosity", "--log-verbosity", default="3"))
    info = log if verbosity >= 4 else lambda level, text: None

    if on_gpu:
        info("I", "load_tensors: offloading output layer to GPU")
    info("I", f"load_tensors: offloading {max(on_gpu - 1, 0)} repeating layers to GPU")
    info("I", f"load_tensors: offloaded {on_gpu}/{offloadable} layers to GPU")
    if out_of_memory(on_gpu, context):
        index = next(i for i, count in enumerate(per_device) if count)
        ident, request = found[index][0], int(per_device[index] * per_layer)
        log(
            "E",
            "ggml_backend_cuda_buffer_type_alloc_buffer:"
            f" allocating {request / MIB:.2f} MiB on device {index}: cudaMalloc failed: out of memory",
        )
        log("E", f"alloc_tensor_range: failed to allocate {ident} buffer of size {request}")
        log("E", f"llama_model_load: error loading model: unable to allocate {ident} buffer")
        log("E", "llama_model_load_from_file_impl: failed to load model")
        log("E", f"cmn  common_init_: failed to load model '{model}'")
        log("E", f"srv    load_model: failed to load model, '{model}'")
        log("E", "srv  llama_server: exiting due to model loading error")
        return 1
    # The output layer is the last device's last; only the repeating layers hold KV cache.
    kv_layers = list(per_device)
    if on_gpu:
        kv_layers[max(i for i, count in enumerate(per_device) if count)] -= 1
    for (ident, *_), count in zip(found, per_device, strict=True):
        if count:
            info("I", f"load_tensors: {ident:>12} model buffer size = {count * per_layer / MIB:8.2f} MiB")
    if on_gpu < offloadable:
        rest = (offloadable - on_gpu) * per_layer
        info("I", f"load_tensors: {'CPU_Mapped':>12} model buffer size = {rest / MIB:8.2f} MiB")
    for (ident, *_), count in zip(found, kv_layers, strict=True):
        if count:
            info("I", f"llama_kv_cache: {ident:>10} KV buffer size = {count * kv_layer / MIB:8.2f} MiB")
    if layers > sum(kv_layers):
        rest = (layers - sum(kv_layers)) * kv_layer
        info("I", f"llama_kv_cache: {'CPU':>10} KV buffer size = {rest / MIB:8.2f} MiB")
    compute = UBATCH * context * 2 + UBATCH * (kv_per_token // 2) * 48
    for (ident, *_), count in zip(found, per_device, strict=True):
        if count:
            info("I", f"sched_reserve: {ident:>10} compute buffer size = {compute / MIB:8.2f} MiB")
    host = found[0][0].rstrip("0123456789") + "_Host"
    info("I", f"sched_reserve: {host:>10} compute buffer size = {UBATCH * context * 4 / MIB / 8:8.2f} MiB")
    return None


def main(argv: list[str]) -> int:
    scenario = os.environ.get("MRUNNER_FAKE_GPU", "none")
    if "--list-devices" in argv:
        sys.stdout.write(list_devices(scenario))
        return 0
    gpu, rest = split_options(argv)
    found = devices(scenario) or []
    if "--version" not in argv and (status := load(found, gpu, argv)) is not None:
        return status
    sys.stderr.flush()
    real = os.environ["MRUNNER_FAKE_GPU_REAL"]
    os.execv(real, [real, *rest])
    return 127  # not reached


def write_wrapper(
    directory: str | os.PathLike[str],
    real: str | os.PathLike[str],
    *,
    scenario: str | None = None,
    oom_layers: int | None = None,
    oom_context: int | None = None,
) -> Path:
    """An executable C{directory}/llama-server that runs this fake over C{real}.

    C{scenario}, C{oom_layers} and C{oom_context} are fixed in it when given; otherwise the fake
    reads C{MRUNNER_FAKE_GPU} and C{MRUNNER_FAKE_GPU_OOM_*} from the environment it is run in.
    """
    path = Path(directory) / "llama-server"
    lines = ["#!/bin/sh", f"export MRUNNER_FAKE_GPU_REAL='{os.fspath(real)}'"]
    if scenario is not None:
        lines.append(f"export MRUNNER_FAKE_GPU='{scenario}'")
    if oom_layers is not None:
        lines.append(f"export MRUNNER_FAKE_GPU_OOM_LAYERS={oom_layers}")
    if oom_context is not None:
        lines.append(f"export MRUNNER_FAKE_GPU_OOM_CONTEXT={oom_context}")
    lines.append(f'exec "{sys.executable}" "{Path(__file__).resolve()}" "$@"')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
