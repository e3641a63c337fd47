"""Chat settings: what a conversation remembers (system prompt, sampling,
speculation, hardware), with app-wide defaults in `<config dir>/settings.yaml`.

A conversation stores its settings as a plain dict (`ConversationStore.save_settings`);
`ChatSettings.from_dict` fills what it lacks from the app defaults.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from edgespec.engine.events import MODES, GenerationParams
from edgespec.engine.limits import LIMITS

SETTINGS_FILE = "settings.yaml"
SAMPLING = ("temperature", "top_k", "top_p", "max_tokens", "k")
"""The settings that are generation parameters, checked against their ranges in engine/limits.py."""
AUTO = "auto"
GPU_LAYERS = ("gpu_layers_target", "gpu_layers_draft")
"""Settings whose None is AUTO: as many layers as fit on this machine's GPUs (edgespec.placement)."""


@dataclass(frozen=True)
class ChatSettings:
    """Everything the settings screen edits."""

    system_prompt: str = "You are a helpful assistant."
    temperature: float = LIMITS["temperature"].default
    """0 is greedy decoding."""
    top_k: int = LIMITS["top_k"].default
    """0 disables top-k."""
    top_p: float = LIMITS["top_p"].default
    """1.0 disables top-p."""
    max_tokens: int = LIMITS["max_tokens"].default
    mode: str = "auto"
    """Speculation mode: plain, draft, lookup or auto."""
    k: int = LIMITS["k"].default
    """Maximum draft length per cycle."""
    gpu_layers_target: int | None = None
    """Target layers offloaded to the GPU (-1: all; None: as many as fit)."""
    gpu_layers_draft: int | None = None
    """Draft layers offloaded to the GPU (-1: all; None: all if they fit)."""
    threads: int = 0
    """CPU threads (0: all cores)."""
    exact: bool = False
    """Batch-invariant kernels for the target: greedy speculation equals plain
    greedy decoding token for token (ModelSettings.exact)."""
    rpc: str = ""
    """llama.cpp RPC workers for the target's layers, 'HOST:PORT[,HOST:PORT...]'
    ('': none). With workers, GPU layers (target) 0 or None means all of them."""

    def __post_init__(self) -> None:
        for name in SAMPLING:
            LIMITS[name].check(getattr(self, name))
        _check(self.mode in MODES, f"mode must be one of {', '.join(MODES)}")
        for name, role in zip(GPU_LAYERS, ("target", "draft")):
            value = getattr(self, name)
            _check(value is None or value >= -1, f"GPU layers ({role}) must be {AUTO}, -1 (all) or more")
        _check(self.threads >= 0, "threads must be 0 (all cores) or more")
        if self.rpc.strip():
            from edgespec.net import parse_endpoints

            parse_endpoints(self.rpc)  # a ValueError says what is wrong

    @classmethod
    def from_dict(cls, data: dict | None, *, defaults: ChatSettings | None = None) -> ChatSettings:
        """Settings from a stored dict; missing or unknown keys fall back to `defaults`.

        Raises ValueError (with a message for the user) when a value is out of range
        or of the wrong type.
        """
        base = defaults or cls()
        values = {}
        for f in fields(cls):
            if data and f.name in GPU_LAYERS and data.get(f.name, 0) in (None, AUTO):
                values[f.name] = None
            elif data and f.name in data and data[f.name] is not None:
                kind = int if f.name in GPU_LAYERS else type(getattr(base, f.name))
                try:
                    if kind is bool and not isinstance(data[f.name], bool):
                        raise TypeError  # bool("no") is True
                    values[f.name] = kind(data[f.name])
                except (TypeError, ValueError, OverflowError):  # OverflowError: int(.inf)
                    raise ValueError(f"{f.name.replace('_', ' ')}: {data[f.name]!r} is not a valid {kind.__name__}") from None
        return replace(base, **values)

    def to_dict(self) -> dict:
        return asdict(self)

    def params(self) -> GenerationParams:
        """The generation parameters these settings describe."""
        return GenerationParams(
            mode=self.mode, k=self.k, temperature=self.temperature,
            top_k=self.top_k, top_p=self.top_p, max_tokens=self.max_tokens,
        )

    def hardware(self) -> tuple[int | None, int | None, int, bool, str]:
        """The settings that need the models reloaded when they change."""
        return (self.gpu_layers_target, self.gpu_layers_draft, self.threads, self.exact, self.rpc)


def store_settings(store, conversation_id: int, settings: ChatSettings) -> None:
    """Store `settings` as the conversation's (next to what the chat session stores there)."""
    store.save_settings(conversation_id, {**store.settings(conversation_id), **settings.to_dict()})


def give_session(session, settings: ChatSettings, store) -> None:
    """Give a chat session `settings`: its generation parameters, and its system prompt
    (in the stored conversation too, or starting an empty chat with it)."""
    session.params = settings.params()
    prompt = settings.system_prompt
    session.system_prompt = prompt or None
    messages = session.messages
    if messages and messages[0].role == "system":
        if prompt and messages[0].content != prompt:
            messages[0].content = prompt
            if messages[0].id is not None:
                store.update(messages[0])
    elif prompt and not messages:
        session.new(system_prompt=prompt)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def defaults_path() -> Path:
    """Where the app-wide defaults live: `<config dir>/settings.yaml`."""
    from edgespec.config import dirs

    return dirs().config / SETTINGS_FILE


def load_defaults(path: str | Path | None = None) -> ChatSettings:
    """The app-wide default settings; built-in defaults when the file is absent.

    Raises ValueError naming the file when it is malformed.
    """
    path = Path(path) if path is not None else defaults_path()
    if not path.exists():
        return ChatSettings()
    try:
        if not path.is_file():
            raise ValueError("not a file")
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError("expected a mapping of setting: value")
        return ChatSettings.from_dict(data)
    except (yaml.YAMLError, ValueError, OSError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ValueError(f"{path}: {reason} (fix or delete the file to use the built-in defaults)") from None


def save_defaults(settings: ChatSettings, path: str | Path | None = None) -> Path:
    """Write the app-wide defaults; returns the file written. Raises ValueError naming
    the file when it cannot be written."""
    path = Path(path) if path is not None else defaults_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(settings.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
    except OSError as e:
        raise ValueError(f"could not write {path}: {e.strerror or e}") from None
    return path
