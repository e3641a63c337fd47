"""This machine's CPU, by name: for people reading figures, and for keys of what
was measured here (a cache folder may move to another machine); and the memory
it has available (which context size the models get by default)."""

from __future__ import annotations

import os
import platform


def cpu_name() -> str:
    """/proc/cpuinfo's model name where there is one, else what platform says."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        return name


def available_memory() -> int | None:
    """Bytes of memory available to a new program without swapping: /proc/meminfo's
    MemAvailable where there is one, else the free pages os.sysconf counts; None
    where neither says."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
