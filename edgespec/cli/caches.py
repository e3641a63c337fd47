"""`edgespec cache`: what edgespec keeps in its cache folder, how large it is, and clearing it.

Everything there can be rebuilt: conversations' KV snapshots are read again, the
machine is measured again, a pool of earlier text starts empty. Models and
conversations live elsewhere and are never touched here.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from edgespec.cli.output import note, print_table
from edgespec.errors import EdgespecError

PARTS = {
    "kv": "KV snapshots of conversations (read instead of the prompt when one is reopened)",
    "measured": "what was measured of this machine (flash attention on the CPU)",
    "verified": "markers of model files whose sha256 was checked",
    "pool": "earlier replies, prompts and files the pool drafter proposes from, per tokenizer",
}
"""The cache's folders and what each keeps, for people."""


def add_parsers(sub) -> None:
    """`cache`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("cache", help="show what edgespec keeps in its cache folder, or clear it",
                       description="Show the cache folder's parts and their sizes; `edgespec cache clear [PART ...]` "
                                   "deletes them (all by default). Everything there is rebuilt when needed; models "
                                   "and conversations are kept elsewhere and never touched.")
    p.add_argument("action", nargs="?", choices=("show", "clear"), default="show")
    p.add_argument("parts", nargs="*", metavar="PART", help=f"with clear: {', '.join(PARTS)} (default: all)")
    p.set_defaults(handler=_cmd_cache)


def _cmd_cache(args: argparse.Namespace) -> int:
    from edgespec.config import dirs

    root = dirs().cache
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        raise EdgespecError(f"no cache part named {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    if args.action == "show":
        if args.parts:
            raise EdgespecError("name parts only with `clear`")
        print(f"cache folder: {root}")
        print_table(["part", "size", "keeps"], [[name, _human(_size(root / name)), what] for name, what in PARTS.items()])
        return 0
    for name in args.parts or PARTS:
        folder = root / name
        if folder.is_symlink():  # never followed: what it links to may not be edgespec's
            note(f"left {name} alone: it is a link to {os.readlink(folder)}; clear that folder yourself")
            continue
        if not folder.exists():
            continue
        size = _size(folder) if folder.is_dir() else folder.stat().st_size
        try:
            if folder.is_dir():
                shutil.rmtree(folder)
            else:  # a file where the part's folder belongs: the part is rebuilt as a folder
                folder.unlink()
        except OSError as e:
            raise EdgespecError(f"cannot clear {folder}: {e.strerror or e}") from None
        note(f"cleared {name} ({_human(size)})")
    return 0


def _size(folder: Path) -> int:
    """Bytes of the regular files under `folder` (links are not followed)."""
    if folder.is_symlink() or not folder.is_dir():
        return 0
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def _human(n: int) -> str:
    from edgespec.models.progress import human_bytes

    return human_bytes(n) if n else "0"
