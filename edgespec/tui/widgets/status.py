"""The status line: model state and live statistics of speculation."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from edgespec.chat.words import accepted_by_note, cache_note
from edgespec.engine.events import Stats
from edgespec.engine.info import EngineInfo
from edgespec.errors import terminal_text
from edgespec.tui.origin import DRAFT_STYLE


SEP = " │ "
"""Between the parts of the status line."""

LABEL_MIN = 24
"""The cells of the model label kept, at least, when the line is too wide for all of it."""


def hardware_label(info: EngineInfo | None) -> str:
    """Where the models run, from `Engine.describe()` (None where it could not say):
    the backend, and for each model with layers on a GPU how many ("cuda · target
    29/29, draft 25/25 layers on GPU"), so that a model left on the CPU by mistake shows."""
    if info is None:
        return ""
    backend = info.backend
    if any(row.worker for row in info.target.layers):
        from edgespec.chat.words import placement_line

        return f"{backend} · target {placement_line(info)}"
    offloaded = [
        f"{role} {m.n_gpu_layers}/{m.n_layer + 1}"
        for role, m in info.models.items()
        if m.n_gpu_layers and m.n_layer
    ]
    if not offloaded:
        return backend
    if info.gpu_offload is False:
        return f"{backend} · GPU layers asked for, but this llama.cpp build has no GPU backend"
    return f"{backend} · {', '.join(offloaded)} layers on GPU"


def context_label(n_ctx: int) -> str:
    """The context size the models were loaded with, chosen or asked for ("ctx 16,384", as --ctx)."""
    return f"ctx {n_ctx:,}"


def format_live(stats: Stats, *, plain_tps: float | None = None) -> str:
    """Mode, k, speed, acceptance, tokens per target pass, drafter and why; or,
    until the first token, how far reading the prompt has got."""
    if not stats.target_passes and stats.prompt_evaluated:
        to_read = max(stats.prompt_tokens - stats.prompt_cached, stats.prompt_evaluated)
        return (f"mode {stats.mode}{SEP}reading the prompt: {stats.prompt_evaluated:,} of {to_read:,} tokens "
                f"({stats.prompt_evaluated / to_read:.0%})")
    parts = [f"mode {stats.mode}", f"k {stats.k}"]
    if stats.tokens_per_s:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
        if plain_tps and stats.mode != "plain":
            parts.append(f"×{stats.tokens_per_s / plain_tps:.2f} vs plain")
    if stats.drafted:
        by = f" ({accepted_by_note(stats)})" if stats.accepted_by else ""
        parts.append(f"accept {stats.acceptance_rate:.0%}{by}")
    if stats.target_passes:
        parts.append(f"{stats.tokens_per_pass:.2f} tok/pass")
    if stats.prompt_cached:
        parts.append(cache_note(stats))
    drafter = f"drafter {stats.drafter}"
    if stats.reason:
        drafter += f" ({stats.reason})"
    parts.append(drafter)
    return SEP.join(parts)


class StatusLine(Static):
    """One line at the bottom: models, then the current or last reply's statistics."""

    model_state: reactive[str] = reactive("loading")
    """"loading", "ready" or "failed"."""
    model_label: reactive[str] = reactive("")
    """Which models are loaded (or being loaded), and on which backend."""
    detail: reactive[str] = reactive("")
    """Statistics of the current or last reply, or why loading failed."""
    origin_view: reactive[bool] = reactive(False)
    """Whether replies are coloured by token origin (adds a legend)."""

    def render(self) -> Text:
        """The line, fitted to the width: the statistics come before the end of a long model
        label, so the last statistics are left out only while even a label shortened to
        LABEL_MIN leaves them no room; the label then takes the room left, and what still
        overflows is cut with an ellipsis."""
        # fit for a terminal: the statistics name files, which may hold an escape
        label, detail = terminal_text(self.model_label), terminal_text(self.detail)
        parts = detail.split(SEP) if detail else []
        line = self._line(label, parts)
        width = self.content_size.width
        if not width or line.cell_len <= width:
            return line

        def others() -> int:
            return self._line(label, parts).cell_len - cell_len(label)

        while len(parts) > 1 and others() + min(LABEL_MIN, cell_len(label)) > width:
            parts.pop()
        short = Text(label)
        short.truncate(max(LABEL_MIN, width - others()), overflow="ellipsis")
        line = self._line(short.plain, parts)
        line.truncate(width, overflow="ellipsis")
        return line

    def _line(self, label: str, parts: list[str]) -> Text:
        state = {"loading": "⏳ loading", "ready": "● ready", "failed": "✖ failed"}.get(self.model_state, self.model_state)
        text = Text(f"{state} {label}".rstrip())
        if self.origin_view:
            text.append(SEP)
            text.append(" draft ", style=DRAFT_STYLE)
            text.append(" target")
        if parts:
            text.append(SEP + SEP.join(parts))
        return text

    def watch_model_state(self, state: str) -> None:
        for name in ("loading", "ready", "failed"):
            self.set_class(state == name, f"-{name}")
