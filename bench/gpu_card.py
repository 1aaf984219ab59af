"""The first NVIDIA GPU, as NVML (else ``nvidia-smi``) sees it: its name, memory and each process's use."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from mrunner.devices.nvml import Nvml

MIB = 2**20


def smi(*query: str) -> list[list[str]] | None:
    """``nvidia-smi QUERY --format=csv,noheader,nounits`` as rows of fields; None if it cannot run."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[field.strip() for field in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


@dataclass
class Gpu:
    """The first NVIDIA GPU as NVML (else ``nvidia-smi``) sees it."""

    name: str
    nvml: Nvml | None

    @classmethod
    def find(cls) -> Gpu | None:
        rows = smi("--query-gpu=name")
        if not rows:
            return None
        return cls(rows[0][0], Nvml.load())

    @property
    def source(self) -> str:
        return "NVML" if self.nvml is not None else "nvidia-smi"

    def memory(self) -> tuple[int, int]:
        """Total and free bytes now."""
        if self.nvml is not None and (live := self.nvml.memory().get("CUDA0")):
            return live
        total, free = (smi("--query-gpu=memory.total,memory.free") or [["0", "0"]])[0]
        return int(total) * MIB, int(free) * MIB

    def used_by(self, pid: int) -> int:
        """Bytes process C{pid} holds on the GPU, 0 where that cannot be seen (a PID namespace)."""
        if self.nvml is not None:
            return self.nvml.used_by(pid).get("CUDA0", 0)
        rows = smi("--query-compute-apps=pid,used_memory") or []
        return sum(int(used) * MIB for owner, used in rows if owner == str(pid))
