"""Huge pages for the memory llama.cpp allocates (edgespec/llama/hugepages.py)."""

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from edgespec.llama.hugepages import HUGE_PAGE, MIN_REGION, NewMemory, anonymous_regions, huge_span, new_regions

MAPS = """\
55fa0cc3a000-55fa12704000 rw-p 00000000 00:00 0                          [heap]
7f15ec021000-7f15f0000000 ---p 00000000 00:00 0
7f15f0b63000-7f1650c00000 rw-p 00000000 00:00 0
7f16511ac000-7f1693590000 r--s 005ac000 fe:00 2146711                    /models/qwen.gguf
7f1693777000-7f16b8c00000 rw-p 00000000 00:00 0
7f16b8c00000-7f16b8d00000 rw-s 00000000 00:01 12                         /dev/zero (deleted)
7f16c0000000-7f16c0100000 rw-p 00001000 fe:00 99                         /usr/lib/libc.so.6
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
"""


def test_the_anonymous_private_writable_mappings_are_found():
    """Memory malloc and llama.cpp allocate: private, writable, of no file ([heap]
    too); not a model file's mapping, shared memory, a library's data or the stack."""
    assert anonymous_regions(MAPS) == [(0x55fa0cc3a000, 0x55fa12704000), (0x7f15f0b63000, 0x7f1650c00000),
                                       (0x7f1693777000, 0x7f16b8c00000)]


def test_new_memory_is_what_appeared_or_grew_and_is_not_small():
    before = [(0, 100 << 20), (200 << 20, 300 << 20), (400 << 20, 401 << 20)]
    after = [(0, 100 << 20),                      # as it was
             (200 << 20, 350 << 20),              # grew: a new mapping merged into it
             (400 << 20, 401 << 20),              # as it was, small
             (500 << 20, 500 << 20 + MIN_REGION),  # new
             (600 << 20, 601 << 20)]              # new, small
    assert new_regions(before, after) == [(200 << 20, 350 << 20), (500 << 20, 500 << 20 + MIN_REGION)]


def test_the_advice_covers_the_whole_huge_pages_inside_a_region():
    assert huge_span((HUGE_PAGE + 1, 4 * HUGE_PAGE - 1)) == (2 * HUGE_PAGE, 3 * HUGE_PAGE)
    assert huge_span((0, 2 * HUGE_PAGE)) == (0, 2 * HUGE_PAGE)
    assert huge_span((1, 2 * HUGE_PAGE - 1)) is None


def _thp_enabled() -> bool:
    """Transparent huge pages on for this machine and not turned off for this process
    (prctl PR_SET_THP_DISABLE, as some service managers set)."""
    try:
        if "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
            return False
        return "THP_enabled:\t0" not in Path("/proc/self/status").read_text()
    except OSError:
        return False


def _vm_flags(address: int) -> list[str]:
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and not line.endswith("kB"):
            lo, hi = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return []


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _thp_enabled(),
                    reason="transparent huge pages are Linux's, where not turned off")
def test_memory_allocated_after_it_is_made_is_advised_and_nothing_before_it():
    """Memory mapped after NewMemory() is marked for huge pages (VmFlags 'hg', set by
    MADV_HUGEPAGE; whether the kernel then finds free huge pages is its business);
    memory mapped before it is not touched."""
    size = 4 * MIN_REGION
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    # read-only pages at both ends keep the kernel from merging the old memory with a
    # neighbour that grows meanwhile (Python's own arenas): that region would be advised
    # whole as one that grew, as it should be
    old = mmap.mmap(-1, size + 2 * HUGE_PAGE, flags=flags)
    start = _address(old)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for at in (start, start + HUGE_PAGE + size):
        assert libc.mprotect(at, HUGE_PAGE, mmap.PROT_READ) == 0
    memory = NewMemory()
    new = mmap.mmap(-1, size, flags=flags)
    try:
        memory.advise()
        new[:] = b"\x01" * size  # written after the advice, as llama.cpp writes the weights
        assert memory.collapse() >= 0
        assert "hg" in _vm_flags(_address(new) + size // 2)
        assert "hg" not in _vm_flags(start + HUGE_PAGE + size // 2)
    finally:
        new.close()
        old.close()


def _address(buffer: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(buffer)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # an exported buffer cannot be closed


def test_a_model_load_advises_its_memory_before_its_weights_are_read(synth_target, monkeypatch):
    """The advice comes at the load's first progress report (its buffers allocated,
    nothing read into them yet: each page is made huge as it is first written), and
    the pages written before it are collapsed once the load is done."""
    from edgespec.llama import backend, model

    calls = []

    class Recording(NewMemory):
        def advise(self):
            calls.append("advise")
            super().advise()

        def collapse(self):
            calls.append("collapse")
            return super().collapse()

    ask = backend.loading_progress

    def progress(fraction):
        calls.append("progress")
        return ask(fraction)

    monkeypatch.setattr(model, "NewMemory", Recording)
    monkeypatch.setattr(backend, "loading_progress", progress)
    model.LlamaModel(synth_target).close()
    assert calls[:2] == ["progress", "advise"]
    assert calls[-1] == "collapse" and calls.count("advise") == 1 and calls.count("collapse") == 1
