"""Huge pages for the memory llama.cpp allocates on the CPU (Linux).

A token's pass reads every weight of the model once. llama.cpp copies the
weights it repacks for the CPU's kernels (most of a quantized model) into
anonymous memory from malloc, which Linux backs with 4 KiB pages unless asked
otherwise (transparent huge pages are "madvise" on most distributions), so a
pass walks some 250,000 page-table entries a GiB, twice over in a virtual
machine. Backed by 2 MiB pages the same pass ran 5-16% faster (the bundled
1.5B on a 2-core Xeon VM; ik_llama.cpp reports ~12% on bare metal), though
on a 2-core AMD EPYC VM 4-6% slower (docs/measurements.md). llama.cpp
does not ask for them, so edgespec finds the memory a load allocated in
/proc/self/maps and asks: madvise(MADV_HUGEPAGE) before the weights are
written (each page is then made huge as it is first written, the load taking
1.1-1.7 s longer for 640 MiB on the VMs measured), and
MADV_COLLAPSE (Linux 6.1) for pages written before the advice. Both are advice:
where the kernel refuses (an old kernel, THP "never", memory too fragmented)
nothing changes but speed. Other systems have no such call and get nothing.
"""

from __future__ import annotations

import ctypes
import sys

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
MIN_REGION = 8 << 20
"""Regions smaller than this are left alone: a few huge pages at most, and
Python's own arenas come and go at that size."""
COLLAPSE_STEP = 32 << 20
"""MADV_COLLAPSE is asked this much at a time: it answers for the whole range
asked, so one part that cannot move would hide what the rest did."""

Region = tuple[int, int]


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def anonymous_regions(maps: str | None = None) -> list[Region]:
    """The private, writable mappings of no file ([heap] included) in
    /proc/self/maps (or `maps`, its text), as (start, end); [] where there is none."""
    if maps is None:
        try:
            with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
                maps = f.read()
        except OSError:
            return []
    regions = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[1][:2] != "rw" or fields[1][3:4] != "p":
            continue
        if len(fields) > 5 and fields[5] != "[heap]":
            continue
        lo, _, hi = fields[0].partition("-")
        regions.append((int(lo, 16), int(hi, 16)))
    return regions


def new_regions(before: list[Region], after: list[Region]) -> list[Region]:
    """Regions of `after` that `before` did not have as they are: new ones, and
    ones that grew (the kernel merges a new mapping into its neighbour); the
    small ones left out (MIN_REGION)."""
    old = set(before)
    return [r for r in after if r not in old and r[1] - r[0] >= MIN_REGION]


def huge_span(region: Region) -> Region | None:
    """The 2 MiB-aligned part of a region (None where it holds no whole huge page)."""
    lo = -(-region[0] // HUGE_PAGE) * HUGE_PAGE
    hi = region[1] // HUGE_PAGE * HUGE_PAGE
    return (lo, hi) if hi > lo else None


class NewMemory:
    """The anonymous memory that appears after it is made: `advise()` asks for
    huge pages over what has appeared so far, `collapse()` for that memory's
    pages already written to move into huge pages now."""

    def __init__(self):
        self._before = anonymous_regions() if _MADVISE else []
        self.spans: list[Region] = []

    def advise(self) -> None:
        """MADV_HUGEPAGE over the memory new since; must not raise (llama.cpp's
        progress callback calls it)."""
        if _MADVISE is None:
            return
        for region in new_regions(self._before, anonymous_regions()):
            span = huge_span(region)
            if span and _MADVISE(span[0], span[1] - span[0], MADV_HUGEPAGE) == 0:
                self.spans.append(span)

    def collapse(self) -> int:
        """MADV_COLLAPSE over the advised memory; the bytes now in huge pages (of
        those asked: a part already huge counts, one the kernel cannot move not)."""
        done = 0
        for lo, hi in self.spans:
            for at in range(lo, hi, COLLAPSE_STEP):
                size = min(COLLAPSE_STEP, hi - at)
                if _MADVISE(at, size, MADV_COLLAPSE) == 0:
                    done += size
        return done
