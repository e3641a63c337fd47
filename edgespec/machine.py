"""This machine's CPU, by name: for people reading figures, and for keys of what
was measured here (a cache folder may move to another machine)."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """/proc/cpuinfo's model name where there is one, else what platform says."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        return name
