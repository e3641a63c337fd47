"""A conversation as a document: export to JSON (which imports back) or Markdown.

An import is checked whole before anything is written, so a hand-edited or
hostile file is refused with a message naming the field, and nothing later
trips on its shape.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import time
from datetime import datetime, timezone
from pathlib import Path

from edgespec.chat.attachments import ORIGINS, Attachment
from edgespec.chat.store import EARLIEST, LATEST, ROLES, STATUSES, ConversationStore, Message, StoreError
from edgespec.chat.template import BUILTIN_FORMATS
from edgespec.chat.words import stats_line
from edgespec.engine.events import Stats
from edgespec.limits import LIMITS
from edgespec.modes import MODES
from edgespec.workspace.root import fence_for, language_for, quoted_path

EXPORT_FORMAT = "edgespec.conversation"
EXPORT_VERSION = 2
"""Version 2 adds messages' attachments; a conversation without any is written as
version 1, which older edgespecs read."""


def export_json(store: ConversationStore, conversation_id: int) -> dict:
    """The conversation as a JSON-ready document (import_json() reads it back)."""
    info = store.info(conversation_id)
    messages = store.messages(conversation_id)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION if any(m.attachments for m in messages) else 1,
        "title": info.title,
        "created": info.created.astimezone().isoformat(),
        "updated": info.updated.astimezone().isoformat(),
        "settings": _without_machine(store.settings(conversation_id)),
        "messages": [
            {"role": m.role, "content": m.content, "status": m.status,
             "stats": m.stats.to_dict() if m.stats is not None else None,
             "from_draft": m.from_draft,
             **({"attachments": [dataclasses.asdict(a) for a in m.attachments]} if m.attachments else {})}
            for m in messages
        ],
    }


def export_markdown(store: ConversationStore, conversation_id: int) -> str:
    """The conversation as Markdown for people: a heading per message, with its statistics."""
    data = export_json(store, conversation_id)
    lines = [f"# {data['title']}", "", f"*{data['created'][:16].replace('T', ' ')}*"]
    models = [data["settings"].get(k) for k in ("target", "draft")]
    if models[0]:
        lines[-1] += " · " + " + ".join(Path(str(m)).name for m in models if m)
    for m in data["messages"]:
        lines += ["", f"## {m['role'].capitalize()}", ""]
        for a in m.get("attachments", ()):
            name = quoted_path(a["path"])  # one line, as the model saw it
            if a["origin"] == "applied":
                lines += [f"*applied to {name}*", ""]
            else:
                fence = fence_for(a["content"])
                lines += [f"**{name}**" + (" (changed on disk)" if a["origin"] == "changed" else ""), "",
                          f"{fence}{language_for(a['path'])}", a["content"].rstrip("\n"), fence, ""]
        lines.append(m["content"])
        notes = [] if m["status"] == "done" else [m["status"]]
        if m["stats"]:
            notes.append(stats_line(Stats.from_dict(m["stats"])))
        if notes:
            lines += ["", "*" + " · ".join(notes) + "*"]
    return "\n".join(lines) + "\n"


def write_markdown(store: ConversationStore, conversation_id: int, directory: str | Path) -> Path:
    """Write export_markdown() to a new file in `directory` named after the conversation's
    id and title, `-2`, `-3`, ... added while that name is taken (an earlier export is
    never overwritten); returns its absolute path (raises OSError when it cannot be written)."""
    title = store.title(conversation_id) or "chat"
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in title).strip("-")[:40] or "chat"
    text = export_markdown(store, conversation_id)
    stem = Path(directory).resolve() / f"edgespec-{conversation_id}-{safe}"
    for n in itertools.count(1):
        path = stem.with_name(stem.name + (f"-{n}" if n > 1 else "") + ".md")
        try:
            with path.open("x", encoding="utf-8") as f:  # "x": created here, or FileExistsError
                f.write(text)
            return path
        except FileExistsError:
            continue


def import_json(store: ConversationStore, data: dict) -> int:
    """Store an export_json() document as a new conversation; returns its id."""
    where = invalid_text(data)
    if where is not None:
        raise StoreError(f"The export holds text that is not valid Unicode (a lone surrogate) in {where}; "
                         "nothing was imported. Export it again, or correct that text.")
    messages = _validated_messages(data)
    created = _timestamp(data, "created")
    return store.create(title=str(data.get("title") or "Imported chat"), settings=_without_machine(data.get("settings") or {}),
                        messages=messages, created=created, updated=_timestamp(data, "updated", default=created))


MACHINE_SETTINGS = ("root", "rpc")
"""Settings an import leaves out and an export does not write, as this machine's user's to
choose: a file from elsewhere
must not decide where `edgespec apply` writes or `edgespec chat` reads ("root"; without
one they use --root or the current folder), nor which hosts the app sends the model's
work to ("rpc": it loads on a conversation's workers)."""


def _without_machine(settings: dict) -> dict:
    """`settings` less MACHINE_SETTINGS: an import takes none from a file, and an export
    gives none away (where this machine keeps the project, which hosts it uses)."""
    return {key: value for key, value in settings.items() if key not in MACHINE_SETTINGS}


def invalid_text(data) -> str | None:
    """Where `data` (parsed JSON) holds a text that is not valid Unicode, such as
    JSON's "\\ud800" (a lone surrogate, which UTF-8 and so the store cannot hold):
    "messages[0].content", "title", ...; None when every text is valid."""
    todo = collections.deque([("", data)])
    while todo:  # not recursive: the JSON may be nested nearly as deep as Python's stack
        where, value = todo.popleft()
        if isinstance(value, str) and not _valid(value):
            return where or "the document"
        if isinstance(value, dict):
            for key, item in value.items():
                if not _valid(key):
                    return f"a name in {where or 'the document'}"
                named = f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"  # escapes shown escaped
                todo.append((named.lstrip("."), item))
        elif isinstance(value, list):
            todo.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_NUMBER, _INT, _COUNT, _TEXT = "a number", "a whole number", "a whole number, 0 or more", "a text"
_COUNTS = "an object of whole numbers"
SETTINGS_TYPES = {
    "target": _TEXT, "draft": _TEXT, "template": _TEXT, "system_prompt": _TEXT, "mode": _TEXT,
    "temperature": _NUMBER, "top_p": _NUMBER, "top_k": _INT, "max_tokens": _INT, "k": _INT,
    "gpu_layers_target": _INT, "gpu_layers_draft": _INT, "threads": _INT, "rpc": _TEXT, "root": _TEXT,
    "n_ctx": _INT, "n_threads": _INT, "n_gpu_layers": _INT, "n_gpu_layers_draft": _INT, "flash_attn": _TEXT,
}
"""What a conversation's settings may hold (the session's and the app's); other keys are kept as they are
(MACHINE_SETTINGS are checked, then left out)."""
TEMPLATE_NAMES = (*BUILTIN_FORMATS, "gguf", "custom")
"""The template names a session stores: a built-in format's, "gguf" (the model's own)
or "custom" (a Jinja source given with --template, not stored)."""
PARAMS_TYPES = {
    "mode": _TEXT, "k": _INT, "temperature": _NUMBER, "top_k": _INT, "top_p": _NUMBER, "seed": _INT,
    "max_tokens": _INT, "p_min": _NUMBER, "p_draft": _NUMBER,
}
"""The generation parameters stored in settings["params"]."""
STATS_TYPES = {
    "mode": _TEXT, "drafter": _TEXT, "reason": _TEXT, "stop_reason": _TEXT, "prompt_cache": _TEXT, "plan_kind": _TEXT,
    "ttft_s": _NUMBER, "decode_s": _NUMBER, "acceptance_rate": _NUMBER, "tokens_per_pass": _NUMBER,
    "tokens_per_s": _NUMBER,
    **{name: _COUNT for name in ("prompt_tokens", "prompt_evaluated", "prompt_cached", "generated_tokens", "drafted",
                                 "accepted", "target_passes", "k", "dropped_messages")},
    "accepted_by": _COUNTS,
}
"""A reply's statistics (Stats.to_dict()): every field Stats.from_dict() reads, so that
showing them (chat/words.py) never trips on a list where a text belongs, or a negative count."""


def _check_fields(values, types: dict[str, str], where: str) -> None:
    """Raise StoreError unless `values` is an object whose known fields (null or) have their type."""
    if not isinstance(values, dict):
        raise StoreError(f"{where} must be an object, not {type(values).__name__}.")
    for name, kind in types.items():
        value = values.get(name)
        ok = (value is None or (kind == _TEXT and isinstance(value, str))
              or (kind in (_INT, _COUNT) and isinstance(value, int) and not isinstance(value, bool)
                  and (kind == _INT or value >= 0))
              or (kind == _NUMBER and isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value))
              or (kind == _COUNTS and isinstance(value, dict)
                  and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value.values())))
        if not ok:
            raise StoreError(f"{where}: {name} must be {kind}, not {value!r}.")


def _validated_messages(data) -> list[Message]:
    """The messages of an export_json() document, after checking all of it: an
    import is written whole or not at all, and nothing later trips on its shape."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise StoreError(f"Not an edgespec conversation export (expected \"format\": \"{EXPORT_FORMAT}\").")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"The export has no version number (\"version\": 1 for this edgespec's exports), "
                         f"got {version!r}.")
    if version > EXPORT_VERSION:
        raise StoreError(f"This export has version {data.get('version')!r}; this edgespec reads up to "
                         f"{EXPORT_VERSION}. Upgrade edgespec to import it.")
    for key in ("title", "created", "updated"):
        if not isinstance(data.get(key), (str, type(None))):
            raise StoreError(f"The export's {key} must be a text, not {data[key]!r}.")
    _check_settings(data.get("settings") or {})
    raw = data.get("messages")
    if not isinstance(raw, list):
        raise StoreError("The export has no \"messages\" list.")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise StoreError(f"Message {i} of the export needs a role ({', '.join(ROLES)}) and a text content.")
        if m["role"] == "system" and i > 0:
            raise StoreError(f"Message {i} of the export is a system message; only the first message may be one.")
        status, stats, origins = m.get("status", "done"), m.get("stats"), m.get("from_draft")
        if status not in STATUSES:
            raise StoreError(f"Message {i} of the export has status {status!r}; expected one of {', '.join(STATUSES)}.")
        if stats is not None:
            _check_fields(stats, STATS_TYPES, f"Message {i} of the export: stats")
            _check_accepted(stats, f"Message {i} of the export: stats")
        if origins is not None and not (isinstance(origins, list) and all(x in (0, 1) for x in origins)):
            raise StoreError(f"Message {i} of the export: from_draft must be a list of true/false, one per token.")
        messages.append(Message(m["role"], m["content"], status=status,
                                stats=_stats(stats) if stats is not None else None,
                                from_draft=[bool(x) for x in origins] if origins is not None else None,
                                attachments=_validated_attachments(m.get("attachments"), i)))
    return messages


def _check_settings(settings) -> None:
    """Raise StoreError unless `settings` have their types, and name a template this edgespec
    knows: `edgespec chat` uses it again, and an unknown one would fail there, far from its cause."""
    _check_fields(settings, SETTINGS_TYPES, "The export's settings")
    _check_ranges(settings, SETTINGS_TYPES, "The export's settings")
    if settings.get("params") is not None:
        _check_fields(settings["params"], PARAMS_TYPES, "The export's settings: params")
        _check_ranges(settings["params"], PARAMS_TYPES, "The export's settings: params")
    template = settings.get("template")
    if template is not None and template not in TEMPLATE_NAMES:
        raise StoreError(f"The export's settings: template {template!r} is not a chat format this edgespec knows "
                         f"({', '.join(BUILTIN_FORMATS)}, or gguf for the model's own). Correct it, or remove it.")


def _check_ranges(values: dict, types: dict[str, str], where: str) -> None:
    """Raise StoreError unless `values` (of checked types) hold a mode of MODES and sampling
    within LIMITS, the ranges the app reads a conversation's settings with (tui's ChatSettings)
    and the engine checks parameters against: an import that let them in left a chat whose
    settings the app refused when it was opened."""
    mode = values.get("mode")
    if "mode" in types and mode is not None and mode not in MODES:
        raise StoreError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}. Correct it, or remove it.")
    for name, limit in LIMITS.items():
        if name in types:
            try:
                limit.check(values.get(name))
            except ValueError as e:
                raise StoreError(f"{where}: {e}. Correct it, or remove it.") from None


def _check_accepted(stats: dict, where: str) -> None:
    """Raise StoreError when a reply's statistics accept more draft tokens than were drafted
    (its acceptance rate would read over 100%)."""
    drafted, accepted = stats.get("drafted") or 0, stats.get("accepted") or 0
    if accepted > drafted:
        raise StoreError(f"{where}: accepted ({accepted}) is more than drafted ({drafted}); only drafted tokens "
                         f"can be accepted.")


def _stats(values: dict) -> Stats:
    """Checked statistics as Stats: a field left null reads as its default, as a missing one does
    (a null count or mode would break the line that shows them)."""
    return Stats.from_dict({name: value for name, value in values.items() if value is not None})


def _validated_attachments(raw, i: int) -> list[Attachment]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise StoreError(f"Message {i} of the export: attachments must be a list.")
    attachments = []
    for j, a in enumerate(raw):
        where = f"Message {i} of the export: attachment {j}"
        if not isinstance(a, dict) or not all(isinstance(a.get(k), str) for k in ("path", "content", "sha256")):
            raise StoreError(f"{where} needs a path, a content and a sha256, each a text.")
        added, origin = a.get("added", time.time()), a.get("origin", "attached")
        if origin not in ORIGINS:
            raise StoreError(f"{where} has origin {origin!r}; expected one of {', '.join(ORIGINS)}.")
        if not (isinstance(added, (int, float)) and not isinstance(added, bool) and math.isfinite(added)):
            raise StoreError(f"{where}: added must be a number, not {added!r}.")
        attachments.append(Attachment(a["path"], a["content"], a["sha256"], added=float(added), origin=origin))
    return attachments


def _timestamp(data: dict, field: str, *, default: float | None = None) -> float:
    """The document's `field` time as a Unix time; one that is not an ISO time (or none) reads
    as `default`, else now. A time outside EARLIEST..LATEST is refused: no date holds it in
    every time zone, and listing the conversation would fail."""
    value = data.get(field)
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return default if default is not None else time.time()
    try:
        when = parsed.timestamp()
    except (OverflowError, OSError, ValueError):  # a local time (no offset) in year 1 or 9999
        when = math.nan
    if not EARLIEST <= when <= LATEST:
        raise StoreError(f"The export's {field} time, {value}, is not between {_day(EARLIEST)} and {_day(LATEST)}, "
                         f"the dates edgespec keeps. Correct it, or remove it to import with the time of import.")
    return when


def _day(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).date().isoformat()
