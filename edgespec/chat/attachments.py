"""Files attached to a conversation: what each turn shows the model of them, and
the edits a reply makes to them.

The model reads a user message as its attached files first (each under its path,
in a fenced block with the language's tag) and then the user's text, the order
in which a reply that copies a file drafts best. What it reads is built from the
stored attachments alone, so a conversation renders the same text every turn
and the KV cache keeps its prefix:

- a file is shown once per conversation: attached again unchanged, a later
  message only names it;
- a file that changed on disk since the conversation last saw it is attached
  again by the next turn (origin "changed"), and that turn says so;
- an edit the user applied is recorded on its reply (origin "applied"): the
  reply already holds that content, so it is not shown again.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from edgespec.errors import ContextFullError, FileAccessError, OutsideRootError, StaleFileError
from edgespec.workspace.apply import Applied, apply_all, undo
from edgespec.workspace.edits import EDIT_INSTRUCTIONS, FileEdit, parse_edits, unified_diff
from edgespec.workspace.root import FileText, Workspace, fence_for, language_for, quoted_path

ORIGINS = ("attached", "changed", "applied")
MAX_ATTACHMENTS = 32
"""Files one message may attach: more than this is a folder, not a question about files."""


class TooManyFilesError(FileAccessError):
    """A message attaches more files than MAX_ATTACHMENTS."""


class FilesDoNotFitError(ContextFullError):
    """The attached files and the message need more tokens than the context has room for."""


@dataclass(frozen=True)
class Attachment:
    """One version of a file, as a message carries it."""

    path: str
    """Relative to the project folder, POSIX."""
    content: str
    sha256: str
    added: float = field(default_factory=time.time)
    origin: str = "attached"
    """"attached" (by the user), "changed" (sent again: the file changed on disk) or
    "applied" (an edit of the reply it is recorded on, written to the file)."""

    @classmethod
    def of(cls, file: FileText, *, origin: str = "attached") -> Attachment:
        return cls(file.path, file.text, file.sha256, origin=origin)


@dataclass(frozen=True)
class PendingEdit:
    """A change a reply makes to a file, before the user applies it."""

    edit: FileEdit
    base_sha256: str | None
    """The version the reply was based on (None: a file the conversation never had)."""
    old_text: str
    """The file's text that the diff is against (what the conversation last saw)."""

    @property
    def path(self) -> str:
        return self.edit.path

    @property
    def diff(self) -> str:
        return unified_diff(self.edit.path, self.old_text, self.edit.new_text)


def read_files(workspace: Workspace, paths: Iterable[str]) -> list[Attachment]:
    """Attachments for `paths`, each read once (the same path twice is one
    attachment); raises a FileAccessError naming the first file that cannot be."""
    attachments: dict[str, Attachment] = {}
    for path in paths:
        file = workspace.read(path)
        attachments.setdefault(file.path, Attachment.of(file))
        if len(attachments) > MAX_ATTACHMENTS:
            raise TooManyFilesError(f"A message can attach at most {MAX_ATTACHMENTS} files; attach the ones the "
                                    f"question is about.")
    return list(attachments.values())


def check_fit(attached: Sequence[Attachment], engine, room: int) -> None:
    """Raise FilesDoNotFitError, naming each file with its tokens, when `attached` and
    `room` tokens for the reply need more than `engine.n_ctx`: refused before any
    reading, as a user can act only on which files, and how big."""
    sizes = {a.path: len(engine.tokenize(a.content, special=False)) for a in attached}
    if sum(sizes.values()) + room > engine.n_ctx:
        listed = ", ".join(f"{path} {n:,}" for path, n in sizes.items())
        raise FilesDoNotFitError(
            f"The attached files need {sum(sizes.values()):,} tokens ({listed}) and a reply needs room for "
            f"{room:,}, but the context holds {engine.n_ctx:,}: attach at most "
            f"{engine.n_ctx - room:,} tokens of files, or load the model with a larger context.")


def latest(messages: Iterable) -> dict[str, Attachment]:
    """The newest version of each file the conversation holds, by path."""
    files: dict[str, Attachment] = {}
    for message in messages:
        for a in message.attachments:
            files[a.path] = a
    return files


def changed_on_disk(workspace: Workspace, messages: Sequence) -> list[Attachment]:
    """Files of the conversation whose bytes on disk differ from its newest version,
    read again (origin "changed"); a file gone, or no longer readable (not_sent_again
    names it), is left out."""
    return [read for _, read in _changed(workspace, messages) if isinstance(read, Attachment)]


def not_sent_again(workspace: Workspace, messages: Sequence) -> list[str]:
    """A one-line notice per file of the conversation that changed on disk but can no longer
    be read (no longer UTF-8, grown past the limit): the next turn cannot send it, and the
    model answers from the version it saw before, which the user should know."""
    return [f"{path} changed on disk but cannot be sent to the model again, which still has its earlier "
            f"version: {read}" for path, read in _changed(workspace, messages) if not isinstance(read, Attachment)]


def _changed(workspace: Workspace, messages: Sequence) -> Iterator[tuple[str, Attachment | FileAccessError]]:
    """Each file of the conversation whose bytes on disk differ from its newest version (a file
    gone is not), with its content read again or why it cannot be."""
    for path, seen in latest(messages).items():
        try:
            if workspace.sha256_of(path) in (None, seen.sha256):
                continue
            yield path, Attachment.of(workspace.read(path), origin="changed")
        except FileAccessError as error:
            yield path, error


def model_messages(messages: Sequence) -> list[dict]:
    """The messages as the chat template takes them, attachments rendered into the
    user messages that carry them (see the module's docstring). Each file shown
    is a labelled span of its message ("file:<path>"), so that what is drafted
    from it is credited to it. How to answer with changed files (EDIT_INSTRUCTIONS)
    comes once, in the first user message, with files shown by then, that does not
    only ask about them (only_asks)."""
    shown: dict[str, str] = {}  # path -> sha256 the model has seen, within these messages
    instructed = False
    out = []
    for m in messages:
        message = {"role": m.role, "content": m.content}
        if m.role == "user":
            instruct = not instructed and bool(shown or m.attachments) and not only_asks(m.content)
            instructed = instructed or instruct
            if m.attachments:
                message["content"], message["spans"] = _with_files(m.content, m.attachments, shown, instruct=instruct)
            elif instruct:
                message["content"] = _INSTRUCTIONS + m.content
        for a in m.attachments:
            shown[a.path] = a.sha256
        out.append(message)
    return out


QUESTION_OPENERS = frozenset("""what why how where which who whom whose when is are was were does do did can could
    should would will explain summarise summarize summary describe tell list compare review""".split())
"""First words of a message that asks about the files rather than for a change to them."""
CHANGE_VERBS = ("add", "append", "apply", "change", "clean", "convert", "correct", "create", "delete", "drop", "edit",
                "extract", "fix", "format", "implement", "improve", "insert", "make", "merge", "modify", "move",
                "refactor", "remove", "rename", "reorder", "replace", "rewrite", "sort", "split", "translate", "turn",
                "update", "write")
"""Verbs that may ask for a changed file: a message with any of them (however inflected) gets the rules."""
_CHANGE_WORDS = frozenset(w + end for w in CHANGE_VERBS for end in ("", "s", "es", "d", "ed", "ing")) | frozenset(
    w[:-1] + end for w in CHANGE_VERBS if w.endswith("e") for end in ("ing", "ed")) | frozenset(
    w + w[-1] + end for w in CHANGE_VERBS for end in ("ed", "ing")) | {"made", "wrote", "written"}
_INSTRUCTIONS = EDIT_INSTRUCTIONS.rstrip("\n") + "\n\n"


def only_asks(text: str) -> bool:
    """Whether a message only asks about the files (opens as a question or ends with a question mark,
    and names no change): it is sent without EDIT_INSTRUCTIONS, before which a small model answers
    "Summarise this" by writing the file out again. Any other message gets them, in any language."""
    words = re.findall(r"[a-z]+", text.lower())
    if not words or not (words[0] in QUESTION_OPENERS or text.rstrip().endswith("?")):
        return False
    return not any(w in _CHANGE_WORDS for w in words)


def _with_files(text: str, attachments: Sequence[Attachment], shown: Mapping[str, str], *,
                instruct: bool) -> tuple[str, list[tuple[int, int, str]]]:
    """The files, then (where `instruct`) how to answer with changed files, then
    `text`; and the files' spans in it, (start, end, label)."""
    content, spans = "", []
    for a in attachments:
        name = quoted_path(a.path)  # one line, as the reply is asked to write it
        if shown.get(a.path) == a.sha256:
            content += f"{name} (unchanged, as shown above)\n\n"
            continue
        fence = fence_for(a.content)
        body = a.content if a.content.endswith("\n") or not a.content else a.content + "\n"
        head = name if a.origin != "changed" else f"{name} (changed on disk since; this is its current content)"
        content += f"{head}\n{fence}{language_for(a.path)}\n"
        spans.append((len(content), len(content) + len(body), f"file:{a.path}"))
        content += f"{body}{fence}\n\n"
    if instruct:
        content += _INSTRUCTIONS
    return content + text, spans


def pending_edits(reply: str, messages: Sequence, *, workspace: Workspace | None = None) -> list[PendingEdit]:
    """The changes `reply` makes to the files `messages` hold (a path the conversation
    never had is an edit with `edit.new` set, for the user to confirm). With the
    `workspace`, a path that is one of those files on disk (a symlink to it) edits it."""
    files = latest(messages)
    edits = parse_edits(reply, {path: a.content for path, a in files.items()},
                        same_file=None if workspace is None else lambda path: _same_file(workspace, path, files))
    return [PendingEdit(e, files[e.path].sha256 if e.path in files else None,
                        files[e.path].content if e.path in files else "")
            for e in edits]


def _same_file(workspace: Workspace, path: str, files: Iterable[str]) -> str | None:
    """The path among `files` that `path` reaches once symlinks are followed; None for a path
    out of the project folder (apply refuses it as such) or one that reaches none of them."""
    try:
        full = workspace.resolve(path)
    except FileAccessError:
        return None
    for attached in files:
        try:
            if workspace.resolve(attached) == full:
                return attached
        except FileAccessError:
            continue
    return None


def not_applied(edits: Sequence[PendingEdit], reply_attachments: Sequence[Attachment],
                workspace: Workspace | None) -> list[PendingEdit]:
    """`edits` but those the user applied already (the reply's "applied" attachments,
    ChatSession.record_applied) while the file still holds what was written: that file no
    longer matches the version the reply was based on, and is the user's own change, not
    one made behind the conversation's back. Undone, an edit is pending again."""
    applied = {a.path: a.sha256 for a in reply_attachments if a.origin == "applied"}
    if not applied or workspace is None:
        return list(edits)
    return [e for e in edits if e.path not in applied or workspace.sha256_of(e.path) != applied[e.path]]


def apply_edits(workspace: Workspace, edits: Sequence[PendingEdit], *, allow_new: bool,
                backups: Path) -> tuple[list[Applied], list[Attachment]]:
    """Write `edits`: what undo needs, and the Attachments (origin "applied") that
    ChatSession.record_applied keeps with the reply. All or nothing (apply_all): every
    file is checked before any is written, so a stale or read-only one leaves them all as
    they were, and a write that fails midway puts back those written before it."""
    for pending in edits:
        stale = _since_the_reply(workspace, pending)
        if stale:
            raise StaleFileError(stale)
    applied = apply_all(workspace, [(p.edit, p.base_sha256) for p in edits], allow_new=allow_new, backups=backups)
    written = [Attachment(p.path, p.edit.new_text, done.after_sha256, origin="applied")
               for p, done in zip(edits, applied)]
    return applied, written


def _since_the_reply(workspace: Workspace, pending: PendingEdit) -> str | None:
    """Why the file no longer has the version the reply was based on, for the user; None where
    it has. A deleted file is refused too, as applying would create it again, which may not be
    wanted. One that is no longer a regular file within the limit (grown past it, a folder now)
    is refused as changed, not with the advice its refusal as an attachment gives ("attach a
    smaller file")."""
    changed = (f"{pending.path} changed on disk since the reply was written; nothing was applied. "
               f"Send a message to show the model its current content.")
    try:
        now = workspace.sha256_of(pending.path)
    except OutsideRootError:
        raise
    except FileAccessError:
        return changed
    if now == pending.base_sha256:
        return None
    if now is None:
        return (f"{pending.path} was deleted since the reply was written; nothing was applied, so it stays deleted. "
                f"To have the reply's version, restore the file and apply again.")
    return changed


def undo_edits(workspace: Workspace, applied: Sequence[Applied]) -> None:
    """Put the files `applied` wrote back as they were, last first."""
    for done in reversed(applied):
        undo(workspace, done)
