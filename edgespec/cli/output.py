"""What the commands write besides a reply (notes, tables, the statistics line)."""

from __future__ import annotations

import sys

from edgespec.chat.words import stats_line


def note(text: str) -> None:
    print(f"edgespec: note: {said(text)}", file=sys.stderr)


def error(text: str) -> None:
    print(f"edgespec: error: {said(text)}", file=sys.stderr)


def said(text: str) -> str:
    """A note or an error as one line a terminal shows as it is: what would break the line or
    act on the terminal (a newline or an escape in a file's name, a bidirectional override)
    escaped as Python writes it ("gone\\nx.py"), so that the name can still be told."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def quiet_stdout() -> None:
    """Once stdout's reader has gone: point stdout at /dev/null, so that what is still
    buffered, and Python's flush at exit, do not fail again with a traceback."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a file (a test's stand-in): nothing is flushed at exit
        pass


def banner(warning: str) -> str:
    """A warning no one should miss (listening where others can reach it), framed."""
    return f"\n{'!' * 78}\n{warning}\n{'!' * 78}\n"


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [[h.upper() for h in header], *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def stderr_stats(stats) -> str:
    """The statistics line `generate` and `chat` print to stderr: the reply's line,
    time to first token, and in auto mode what was chosen last and why."""
    parts = [stats_line(stats)]
    if stats.ttft_s is not None:
        parts.append(f"first token {stats.ttft_s * 1000:.0f} ms")
    if stats.reason and stats.mode == "auto":
        parts.append(f"last choice: {stats.reason}")
    elif stats.reason and stats.mode != "plain" and stats.drafter == "none":
        parts.append(stats.reason)  # a speculative mode that did not speculate says why
    return "[" + " · ".join(parts) + "]"
