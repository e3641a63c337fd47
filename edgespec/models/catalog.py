"""What `edgespec models` and the chat app's models screen show: each model and
pair with its size, origin and whether it is here, as plain rows."""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.models.fetch import available_offline, installed_path
from edgespec.models.registry import DEFAULT_PAIR, ModelEntry, Registry
from edgespec.models.source import MADE, MISSING, PARTS, READY, REMOTE


@dataclass(frozen=True)
class ModelRow:
    name: str
    size: int | None
    origin: str
    state: str
    vocab: str | None
    roles: tuple[str, ...]
    params: str | None
    quant: str | None
    hint: str
    """What to do to get it, empty when ready."""
    unverified: bool = False
    title: str = ""
    """The model's name and quantization ("Qwen2.5-Coder 1.5B Instruct Q4_K_M"), or `name`."""
    sha256_checked: bool = False
    """The file is checked against a known sha256 when it is fetched or assembled."""


@dataclass(frozen=True)
class PairRow:
    name: str
    target: str
    draft: str | None
    mode: str
    k: int
    description: str
    state: str
    """READY when both files are usable without a network, else the worst model state."""
    default: bool


def model_rows(registry: Registry) -> list[ModelRow]:
    return [_model_row(entry, registry) for entry in registry.models.values()]


def pair_rows(registry: Registry, models: list[ModelRow] | None = None) -> list[PairRow]:
    states = {row.name: row.state for row in (models or model_rows(registry))}
    rows = []
    for pair in registry.pairs.values():
        names = [pair.target] + ([pair.draft] if pair.draft else [])
        wanted = [states.get(n, MISSING) for n in names]
        order = [READY, PARTS, MADE, REMOTE, MISSING]
        worst = max(wanted, key=order.index)
        rows.append(PairRow(pair.name, pair.target, pair.draft, pair.mode, pair.k, pair.description,
                            READY if worst in (PARTS, MADE) else worst, pair.name == DEFAULT_PAIR))
    return rows


def vocab_groups(registry: Registry) -> dict[str, list[str]]:
    """Model names by tokenizer family: any two in a group can pair (check with `edgespec check`)."""
    groups: dict[str, list[str]] = {}
    for entry in registry.models.values():
        if entry.vocab:
            groups.setdefault(entry.vocab, []).append(entry.name)
    return groups


def compatible_drafts(registry: Registry, target: str) -> list[str]:
    """Registry models that can draft for `target` (same vocab family, marked as drafts)."""
    vocab = registry.model(target).vocab
    return [e.name for e in registry.models.values()
            if vocab and e.vocab == vocab and e.name != target and "draft" in e.roles]


def source_words(entry: ModelEntry) -> str:
    """Where the file comes from and whether its sha256 is checked ("bundled, sha256 checked")."""
    return entry.source.origin() + (", sha256 checked" if entry.sha256 else "")


def _model_row(entry: ModelEntry, registry: Registry) -> ModelRow:
    state, hint = _state(entry, registry)
    return ModelRow(entry.name, entry.display_size, source_words(entry), state, entry.vocab, entry.roles,
                    entry.params, entry.quant, hint, entry.unverified, entry.display_name, entry.sha256 is not None)


def _state(entry: ModelEntry, registry: Registry) -> tuple[str, str]:
    """(state, what to do to get it: empty when nothing is to do)."""
    if installed_path(entry) is not None:
        return READY, ""
    if available_offline(entry, registry):
        return entry.source.offline_state, ""
    return entry.source.missing(entry, state_other=lambda name: _state(registry.model(name), registry))


__all__ = ["ModelRow", "PairRow", "model_rows", "source_words", "pair_rows", "vocab_groups", "compatible_drafts"]
