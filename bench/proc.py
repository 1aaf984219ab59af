"""What the kernel says a process tree costs: CPU seconds and resident memory, from /proc.

Read from outside, so every path is charged alike, whatever it is written in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

#: Clock ticks per second, the unit of utime and stime in /proc/<pid>/stat.
TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def children(pid: int) -> list[int]:
    """The PIDs whose parent is C{pid} (nginx's workers, under its master)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # exited while we looked
    return found


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds the processes C{pids} have used so far."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def memory_kib(pid: int, key: str) -> int:
    """A line of /proc/<pid>/status in KiB, such as VmRSS (now) or VmHWM (the peak so far)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(f"no {key} in /proc/{pid}/status")
