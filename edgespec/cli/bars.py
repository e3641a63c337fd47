"""Download and assembly progress (edgespec.models.progress events), drawn with rich."""

from __future__ import annotations

import sys


def stderr_progress() -> ProgressBars | None:
    """Download/assembly progress bars on stderr (only on a terminal)."""
    return ProgressBars(sys.stderr) if sys.stderr.isatty() else None


class ProgressBars:
    """Draws the `Progress` events of edgespec.models.progress with rich: a bar
    per file and stage (download, assemble, quantize, verify) with bytes, speed
    and time left. Off a terminal, one line when each file's work finishes."""

    def __init__(self, stream) -> None:
        from rich.console import Console

        self.console = Console(file=stream, highlight=False)
        self._bars = None
        self._key: tuple[str, str] | None = None

    def __call__(self, p) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        key = (p.file, p.stage)
        if key != self._key:
            self.close()
            self._key = key
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), TaskProgressColumn(),
                                  DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                  console=self.console)
            self._bars.add_task(f"{p.stage:8s} {p.file}", total=p.total, completed=p.done)
            self._bars.start()
        self._bars.update(self._bars.task_ids[0], completed=p.done, total=p.total)
        if p.finished:
            self.close()

    def close(self) -> None:
        """Leave the current bar drawn as it stands and stop redrawing it."""
        if self._bars is not None:
            self._bars.stop()
        self._bars, self._key = None, None
