"""Chat settings: what a conversation remembers (system prompt, sampling,
speculation, hardware), with app-wide defaults in `<config dir>/settings.yaml`.

A conversation stores its settings as a plain dict (`ConversationStore.save_settings`);
`ChatSettings.from_dict` fills what it lacks from the app defaults.
"""

from __future__ import annotations

import reprlib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from edgespec.engine.events import MODES, GenerationParams
from edgespec.errors import yaml_problem
from edgespec.limits import LIMITS, ascii_number
from edgespec.load_settings import FLASH_ATTN, LOAD_LIMITS, LoadSettings
from edgespec.modes import DEFAULT_MODE, reply_decoding

SETTINGS_FILE = "settings.yaml"
SAMPLING = ("temperature", "top_k", "top_p", "max_tokens", "k")
"""The settings that are generation parameters, checked against their ranges in edgespec/limits.py."""
AUTO = "auto"
"""How a LoadSettings field left to the load (None) is shown and may be written."""
PAIRS_OWN = {"mode": str, "k": int}
"""Settings whose None is the pair's (models.yaml's mode and k), and their types."""
LOAD_FIELDS = (*LOAD_LIMITS, "exact", "flash_attn", "rpc")
"""The LoadSettings fields a conversation keeps (the cache is the app's), stored flat beside the others."""
OLD_NAMES = {"gpu_layers_target": "n_gpu_layers", "gpu_layers_draft": "n_gpu_layers_draft", "threads": "n_threads"}
"""Load settings stored under their earlier names (`threads: 0` meant all cores)."""


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
    mode: str | None = None
    """Speculation mode: plain, draft, lookup or auto; None: the pair's (models.yaml)."""
    k: int | None = None
    """Maximum draft length per cycle; None: the pair's."""
    private: bool = False
    """Kept out of the lookup pool: its text is never drafted from in other conversations."""
    load: LoadSettings = LoadSettings()
    """How the models are loaded: context size, threads, GPU layers, kernels, RPC workers
    (their workers only: the command line's tensor split goes with the same workers)."""

    def __post_init__(self) -> None:
        for name in SAMPLING:
            LIMITS[name].check(getattr(self, name))
        _check(self.mode is None or self.mode in MODES, f"mode must be one of {', '.join(MODES)}")

    @classmethod
    def from_dict(cls, data: dict | None, *, defaults: ChatSettings | None = None) -> ChatSettings:
        """Settings from a stored dict; missing or unknown keys fall back to `defaults`
        (a load setting stored as None or "auto" is left to the load).

        Raises ValueError (with a message for the user) when a value is out of range
        or of the wrong type.
        """
        base = defaults or cls()
        data = data or {}
        values = {}
        for f in fields(cls):
            if f.name in PAIRS_OWN and f.name in data:  # None: the pair's
                values[f.name] = None if data[f.name] is None else _typed(f.name, data[f.name], PAIRS_OWN[f.name])
            elif f.name != "load" and data.get(f.name) is not None:
                values[f.name] = _typed(f.name, data[f.name], type(getattr(base, f.name)))
        return replace(base, **values, load=_load_from_dict(data, base.load))

    def to_dict(self) -> dict:
        """Flat, as stored: the load settings beside the others (None: left to the load), the workers as text."""
        values = {name: value for name, value in asdict(self).items() if name != "load"}
        load = self.load
        values.update({name: getattr(load, name) for name in LOAD_LIMITS})
        values.update(exact=load.exact, flash_attn=load.flash_attn_name, rpc=workers_text(load))
        return values

    def params(self, decoding: tuple[str, int] = (DEFAULT_MODE, LIMITS["k"].default)) -> GenerationParams:
        """The generation parameters these settings describe; `decoding`: the mode and k
        of the pair the models are (Library.decoding), for what the settings leave to it."""
        mode, k = reply_decoding(self.mode, self.k, decoding)
        return GenerationParams(
            mode=mode, k=k, temperature=self.temperature,
            top_k=self.top_k, top_p=self.top_p, max_tokens=self.max_tokens,
        )

    def hardware(self) -> LoadSettings:
        """The settings that need the models reloaded when they change."""
        return self.load.hardware()


def workers_text(load: LoadSettings) -> str:
    """The RPC workers as 'HOST:PORT[,HOST:PORT...]' ('': none)."""
    return ",".join(str(e) for e in load.rpc.workers) if load.rpc else ""


def _load_from_dict(data: dict, base: LoadSettings) -> LoadSettings:
    """The load settings `data` holds (under their names or OLD_NAMES), over `base`."""
    from edgespec.net import Split, parse_endpoints

    data = {**{new: data[old] for old, new in OLD_NAMES.items() if old in data}, **data}
    values = {}
    for name in LOAD_LIMITS:
        if name in data:
            value = data[name]
            if value in (None, AUTO, "") or (name == "n_threads" and value == 0):
                values[name] = None
            else:
                values[name] = _typed(name, value, int)
    if data.get("exact") is not None:
        values["exact"] = _typed("exact", data["exact"], bool)
    if data.get("flash_attn") is not None:
        _check(isinstance(data["flash_attn"], str) and data["flash_attn"] in FLASH_ATTN,
               f"flash attention must be one of {', '.join(FLASH_ATTN)}")
        values["flash_attn"] = FLASH_ATTN[data["flash_attn"]]
    if data.get("rpc") is not None:
        text = str(data["rpc"]).strip()
        values["rpc"] = Split(parse_endpoints(text)) if text else None  # a ValueError says what is wrong
    return replace(base, **values)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 2, 4, 4, 60, 60
"""How a bad value is shown in a message: cut short (a file's value may be nested without end)."""


def _typed(name: str, value, kind: type):
    """`value` as `kind`; ValueError naming the setting where it is not one (a number
    written with digits other than 0-9 too: limits.ascii_number)."""
    if isinstance(value, str) and kind in (int, float):
        ascii_number(value, what=name.replace("_", " "))
    try:
        if (kind is bool) != isinstance(value, bool):
            raise TypeError  # bool("no") is True, int(True) is 1
        if kind is str and not isinstance(value, str):
            raise TypeError  # str() of a list or mapping (YAML's aliases may nest billions of items)
        if not isinstance(value, (str, int, float)):
            raise TypeError
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(.inf)
        raise ValueError(f"{name.replace('_', ' ')}: {_SHOWN.repr(value)} is not a valid {kind.__name__}") from None


def store_settings(store, conversation_id: int, settings: ChatSettings) -> None:
    """Store `settings` as the conversation's (next to what the chat session stores there)."""
    store.save_settings(conversation_id, {**store.settings(conversation_id), **settings.to_dict()})


def give_session(session, settings: ChatSettings, store, decoding: tuple[str, int]) -> None:
    """Give a chat session `settings`: its generation parameters (`decoding`: the pair's
    mode and k, ChatSettings.params), and its system prompt (in the stored conversation
    too, or starting an empty chat with it)."""
    session.params = settings.params(decoding)
    if session.private != settings.private:
        session.keep_private(settings.private)
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
    except RecursionError:  # YAML nested deeper than Python's stack
        raise ValueError(f"{path}: it is nested too deeply to be settings (fix or delete the file to use the "
                         f"built-in defaults)") from None
    except (yaml.YAMLError, ValueError, OSError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        if isinstance(e, yaml.YAMLError):
            reason = yaml_problem(e)
        raise ValueError(f"{path}: {reason} (fix or delete the file to use the built-in defaults)") from None


def save_defaults(settings: ChatSettings, path: str | Path | None = None) -> Path:
    """Write the app-wide defaults; returns the file written. Raises ValueError naming
    the file when it cannot be written."""
    from edgespec.errors import WriteError
    from edgespec.workspace.apply import write_atomic

    path = Path(path) if path is not None else defaults_path()
    text = yaml.safe_dump(settings.to_dict(), sort_keys=False, allow_unicode=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"could not write {path}: {e.strerror or e}") from None
    try:
        # whole or not at all: a full disk or a kill midway keeps the settings saved before;
        # a settings.yaml linked elsewhere (dotfiles) is written where it points and stays a link
        write_atomic(path.resolve(), text.encode("utf-8"), str(path))
    except WriteError as e:
        raise ValueError(str(e)) from None
    return path
