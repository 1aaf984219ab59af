"""Scenarios 7 and 8: a pull from a local registry and an import, against tools that hash the same bytes.

A pull must verify a blob's sha256 as it streams, so its baseline is
``curl URL | sha256sum`` of the same blob from the same registry; an import
(``mrunner package --gguf``) hashes the file as it stores it, so its baseline
is ``cat FILE | sha256sum``. Plain ``curl`` and ``cp`` are reported beside
them, so what verification costs stays visible. The model is a GGUF of some
110 MB of random weights: too big to hide in a cache line, small enough for
a round to take a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np

from bench import http
from bench.report import NO_GOAL, Row, share
from bench.rounds import interleave, medians
from bench.servers import LOOPBACK, ServerFailed, Target, free_port, running

REGISTRY = "/usr/bin/docker-registry"
#: float32 weights: 28 M of them make a 112 MB file.
WEIGHTS = 28_000_000
MODEL = "bench/big:latest"
MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json"
GGUF_LAYER = "application/vnd.docker.ai.gguf.v3"


def big_gguf(path: Path) -> int:
    """A llama-shaped GGUF of random weights, its size in bytes."""
    writer = gguf.GGUFWriter(os.fspath(path), "llama")
    writer.add_name("bench-big")
    writer.add_context_length(256)
    weights = np.random.default_rng(0).standard_normal(WEIGHTS, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weights.reshape(-1, 1000))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


@contextmanager
def registry(directory: Path) -> Iterator[str]:
    """Debian's CNCF distribution registry on a free loopback port; its host:port."""
    if not os.access(REGISTRY, os.X_OK):
        raise ServerFailed(f"{REGISTRY} is missing: apt-get install docker-registry")
    host = f"{LOOPBACK}:{free_port()}"
    directory.mkdir()
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n"
        f"http:\n  addr: {host}\n"
    )
    with running([REGISTRY, "serve", str(config)], directory / "registry.log") as process:
        process.wait_ready(f"http://{host}/v2/")
        yield host


def timed(argv: list[str], **kwargs: object) -> tuple[float, str]:
    """Seconds C{argv} took, and its standard output."""
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - began, done.stdout


def throughput(size: int, seconds: dict[str, float]) -> dict[str, float]:
    return {name: size / value / 1e6 for name, value in seconds.items()}


def mrunner_cli(mrunner: Target, *args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("mrunner")), "--host", mrunner.url, *args]


def measure(mrunner: Target, rounds: int, tmp: Path) -> list[Row]:
    """Scenarios 7 and 8's rows: MB/s of a pull and of an import, each beside the tools that do as much."""
    gguf_path = tmp / "big.gguf"
    size = big_gguf(gguf_path)
    pull_rates = throughput(size, pulls(mrunner, rounds, tmp, gguf_path))
    import_rates = throughput(size, imports(mrunner, rounds, tmp, gguf_path))
    mb = f"{size / 1e6:.0f} MB"
    return [
        Row(
            f"7 pull, {mb}",
            "MB/s; direct: curl | sha256sum",
            keep(pull_rates, "direct"),
            share("direct", 0.9),
        ),
        Row(
            f"7 pull, {mb}",
            "MB/s; direct: curl alone",
            {"direct": pull_rates["curl"], "mrunner": pull_rates["mrunner"]},
            NO_GOAL,
        ),
        Row(
            f"8 import, {mb}",
            "MB/s; direct: cat | sha256sum",
            keep(import_rates, "direct"),
            share("direct", 0.9),
        ),
        Row(
            f"8 import, {mb}",
            "MB/s; direct: cp",
            {"direct": import_rates["cp"], "mrunner": import_rates["mrunner"]},
            NO_GOAL,
        ),
    ]


def pulls(mrunner: Target, rounds: int, tmp: Path, gguf_path: Path) -> dict[str, float]:
    """Median seconds of a pull of C{gguf_path}, pushed to a local registry, and of curl's of its blob."""
    with registry(tmp / "registry") as host:
        reference = f"{host}/{MODEL}"
        subprocess.run(
            mrunner_cli(mrunner, "package", "--gguf", str(gguf_path), reference),
            check=True,
            capture_output=True,
        )
        subprocess.run(mrunner_cli(mrunner, "push", reference), check=True, capture_output=True)
        digest = blob_digest(host)
        url = f"http://{host}/v2/{MODEL.split(':')[0]}/blobs/{digest}"

        def pull() -> float:
            remove(mrunner, reference)
            return timed(mrunner_cli(mrunner, "pull", reference))[0]

        def curl_hashed() -> float:
            seconds, out = timed(["bash", "-o", "pipefail", "-c", f"curl -sf '{url}' | sha256sum"])
            if out.split()[0] != digest.removeprefix("sha256:"):
                raise ServerFailed(f"curl | sha256sum of {url} gave {out.split()[0]}, not {digest}")
            return seconds

        return medians(
            interleave(
                {
                    "direct": curl_hashed,
                    "curl": lambda: timed(["curl", "-sf", "-o", "/dev/null", url])[0],
                    "mrunner": pull,
                },
                rounds,
                call,
            )
        )


def imports(mrunner: Target, rounds: int, tmp: Path, gguf_path: Path) -> dict[str, float]:
    """Median seconds of an import of C{gguf_path}, and of hashing or copying it with cat and cp."""
    copy = tmp / "copy.gguf"

    def package() -> float:
        remove(mrunner, "bench/imported")
        return timed(mrunner_cli(mrunner, "package", "--gguf", str(gguf_path), "bench/imported"))[0]

    def cat_hashed() -> float:
        return timed(["bash", "-o", "pipefail", "-c", f"cat '{gguf_path}' | sha256sum"])[0]

    def cp() -> float:
        copy.unlink(missing_ok=True)
        return timed(["cp", str(gguf_path), str(copy)])[0]

    seconds = medians(interleave({"direct": cat_hashed, "cp": cp, "mrunner": package}, rounds, call))
    copy.unlink(missing_ok=True)
    return seconds


def keep(values: dict[str, float], baseline: str) -> dict[str, float]:
    return {"direct": values[baseline], "mrunner": values["mrunner"]}


def call(_: str, measure: Callable[[], float]) -> float:
    return measure()


def remove(mrunner: Target, name: str) -> None:
    """Delete C{name} from mrunner's store if it is there, so the next pull or import does all its work."""
    with http.client(timeout=30.0) as client:
        response = client.delete(f"{mrunner.url}/models/{name}", params={"force": "true"})
        if response.status_code not in (200, 404):
            response.raise_for_status()


def blob_digest(host: str) -> str:
    """The digest of the GGUF layer of the pushed model, read from the registry's manifest."""
    name, tag = MODEL.split(":")
    with http.client(timeout=10.0) as client:
        response = client.get(f"http://{host}/v2/{name}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})
        manifest = json.loads(response.raise_for_status().content)
    (layer,) = [layer for layer in manifest["layers"] if layer["mediaType"] == GGUF_LAYER]
    return str(layer["digest"])
