"""Files on the command line: `--file`/`--root` for `chat` and `generate`, and
`edgespec apply`, which shows a reply's changes to attached files and writes them."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from edgespec.cli.output import note
from edgespec.errors import EdgespecError


def add_file_options(p: argparse.ArgumentParser) -> None:
    """--file (repeatable) and --root: files of the project folder attached to the message."""
    g = p.add_argument_group("files")
    g.add_argument("--file", action="append", default=[], metavar="PATH", type=home_path("--file"),
                   help="attach this file to the message (repeatable); its path is relative to --root")
    g.add_argument("--root", metavar="DIR", type=home_path("--root"),
                   help="the project folder files are read from and written to (default: the current folder); "
                        "nothing outside it is read or written")


def home_path(option: str):
    """The argparse type of every option that takes a path: the path with a leading ~ expanded,
    as a model's path and --out are, since the shell leaves `--root=~/project` as it is."""
    def expanded(text: str) -> str:
        from edgespec.config import expand_home

        return str(expand_home(text, what=option))
    return expanded


def workspace_from_args(args: argparse.Namespace, *, stored_root: str | None = None):
    """The project folder: --root, else the one a conversation was held in, else the current folder."""
    from pathlib import Path

    from edgespec.workspace.root import Workspace

    return Workspace(args.root or stored_root or Path.cwd())


def add_parsers(sub) -> None:
    """`apply`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("apply", help="write a reply's changes to the files its conversation attached",
                       description="Show the changes the last reply of a stored conversation (default: the latest) "
                                   "makes to its attached files as a diff, and write them after you confirm (or at "
                                   "once with --yes). A file changed on disk since the reply saw it is refused.")
    p.add_argument("--conversation", type=int, metavar="ID", help="the conversation (see `edgespec chats`)")
    p.add_argument("--root", metavar="DIR", type=home_path("--root"), help="the project folder (default: the conversation's)")
    p.add_argument("--yes", action="store_true", help="apply without asking (for scripts)")
    p.add_argument("--new", action="store_true", help="also create files the conversation never attached")
    p.set_defaults(handler=_cmd_apply)


def _cmd_apply(args: argparse.Namespace) -> int:
    from edgespec.chat.attachments import not_applied, pending_edits
    from edgespec.cli.options import open_store

    store = open_store()
    cid = store.latest() if args.conversation is None else args.conversation
    if cid is None:
        raise EdgespecError("there is no conversation yet: `edgespec chat --file PATH --once ...` starts one")
    messages = store.messages(cid)
    if not messages or messages[-1].role != "assistant":
        raise EdgespecError(f"the last reply of conversation {cid} changes none of its files")
    workspace = workspace_from_args(args, stored_root=store.settings(cid).get("root"))
    edits = pending_edits(messages[-1].content, messages[:-1], workspace=workspace)
    if not edits:
        raise EdgespecError(f"the last reply of conversation {cid} changes none of its files")
    edits = not_applied(edits, messages[-1].attachments, workspace)
    if not edits:
        raise EdgespecError(f"the last reply of conversation {cid} is applied already: its files hold its changes")
    written = apply_edits(edits, workspace, yes=args.yes, allow_new=args.new)
    if written:
        store.attach(messages[-1].id, written)
    return 0


def apply_edits(edits: Sequence, workspace, *, yes: bool, allow_new: bool = False, out=None) -> list:
    """Print each edit's diff, ask (unless `yes`), and write them; returns the
    Attachments of what was written, origin "applied" (ChatSession.record_applied
    keeps them with the reply)."""
    from edgespec.chat import attachments
    from edgespec.config import dirs
    from edgespec.errors import EditError
    from edgespec.workspace.root import quoted_path

    for pending in edits:  # the diffs go to stdout, or to `out` (stderr where stdout holds JSON)
        (out or sys.stdout).write(pending.diff or f"{quoted_path(pending.path)}: no change\n")
    note_versions(edits)
    new = [p.path for p in edits if p.edit.new]
    if new and not allow_new:
        note(f"not creating {', '.join(new)}, which the conversation never attached (--new creates "
             f"{'it' if len(new) == 1 else 'them'})")
        edits = [p for p in edits if not p.edit.new]
        if not edits:
            raise EditError("the reply changes none of the attached files; nothing was applied")
    changes = f"{len(edits)} change{'s' if len(edits) != 1 else ''}"
    if yes:  # the folder is named before anything is written, as the question names it
        note(f"applying {changes} into {workspace.root} (--yes)")
    elif not _confirm(f"apply {changes} into {workspace.root}?"):
        note("nothing applied")
        return []
    _, written = attachments.apply_edits(workspace, edits, allow_new=allow_new, backups=dirs().data / "undo")
    for a in written:
        note(f"applied to {workspace.root / a.path}")
    return written


def note_versions(edits: Sequence) -> None:
    """One note for each file the reply wrote whole more than once (FileEdit.versions): the
    diff shows only the last version, and nothing else says there was another."""
    from edgespec.workspace.root import quoted_path

    for pending in edits:
        if pending.edit.versions > 1:
            note(f"the reply writes {quoted_path(pending.path)} whole {pending.edit.versions} times: "
                 "the last version is the one shown and applied")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise EdgespecError("not applied: stdin is not a terminal to confirm on; pass --yes to apply")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")
