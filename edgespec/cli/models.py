"""`edgespec models`, `pull`, `rm`, `path`, `check` and `paths`: the model files and where things are kept."""

from __future__ import annotations

import argparse
import json
import sys

from edgespec.cli.bars import ProgressBars
from edgespec.cli.output import print_table
from edgespec.errors import EdgespecError


def add_parsers(sub) -> None:
    """`models`, `pull`, `rm`, `path`, `check` and `paths`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("models", help="the model catalog: models and pairs, sizes, installed or not",
                       description="List the registry's models and pairs: size, where each comes from, "
                                   "whether it is here, and which can draft for which (same vocab).")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(handler=_cmd_models)

    p = sub.add_parser("pull", help="download (or assemble) a model or both models of a pair",
                       description="Get a model's file, or a pair's two files, with progress. "
                                   "Downloads resume. A file is checked against the size and sha256 "
                                   "that models.yaml gives for it, where it gives them; the shipped hub "
                                   "entries give neither, so for them (as for hf: names) a download is "
                                   "checked to be GGUF.")
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="a model or pair name (see `edgespec models`), or hf:OWNER/REPO/FILE.gguf")
    p.set_defaults(handler=_cmd_pull)

    p = sub.add_parser("rm", help="delete a downloaded or assembled model file",
                       description="Delete the local file of a model (a pair name: both of its models).")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(handler=_cmd_rm)

    p = sub.add_parser("path", help="print the local file of a model (or a pair's two files)",
                       description="Print where a model's file is. Never downloads: a model not here yet "
                                   "is an error that says how to get it.")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(handler=_cmd_path)

    p = sub.add_parser("check", help="can these two models be paired? (reads only the GGUF headers)",
                       description="Read both files' GGUF headers (no weights are loaded) and say whether "
                                   "DRAFT can draft for TARGET, and if not why. Exit status 1 if not.")
    p.add_argument("target", metavar="TARGET", help="a .gguf path or a model name")
    p.add_argument("draft", metavar="DRAFT", help="a .gguf path or a model name")
    p.set_defaults(handler=_cmd_check)

    p = sub.add_parser("paths", help="print edgespec's directories",
                       description="Print where edgespec keeps settings, models, caches and your models.yaml. "
                                   "Set EDGESPEC_HOME to keep everything under one directory.")
    p.set_defaults(handler=_cmd_paths)


def _cmd_models(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from edgespec.models.catalog import model_rows, pair_rows, vocab_groups
    from edgespec.models.progress import human_bytes
    from edgespec.models.registry import load_registry

    registry = load_registry()
    models = model_rows(registry)
    pairs = pair_rows(registry, models)
    if args.json:
        json.dump({"models": [asdict(m) for m in models], "pairs": [asdict(p) for p in pairs],
                   "vocab_groups": vocab_groups(registry)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print("MODELS")
    print_table(["name", "model", "size", "vocab", "state", "from"],
                [[m.name + (" (?)" if m.unverified else ""), m.title, human_bytes(m.size) if m.size else "?",
                  m.vocab or "-", m.state, m.origin] for m in models])
    print("\nPAIRS (target + draft)")
    print_table(["name", "target", "draft", "mode/k", "state", "when"],
                [[p.name + (" *" if p.default else ""), p.target, p.draft or "-", f"{p.mode}/{p.k}",
                  p.state, p.description] for p in pairs])
    print("\n* the default pair.  (?) file name not confirmed on the hub page.")
    print("Same vocab = can draft for each other: "
          + "; ".join(f"{v}: {len(names)} models" for v, names in vocab_groups(registry).items())
          + ". `edgespec check TARGET DRAFT` verifies any two files.")
    todo = sorted({m.hint for m in models if m.hint and m.state != "not downloaded"})
    if todo:
        print("To install: " + "; ".join(todo))
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import pull

    bars = ProgressBars(sys.stderr)
    try:
        for name in args.names:
            for entry, path in pull(name, progress=bars):
                print(f"{entry.name}: {path}")
    finally:
        bars.close()
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import is_path_like, kept_note, remove, shared_with
    from edgespec.models.registry import load_registry

    registry = load_registry()
    for name in args.names:
        if is_path_like(name):
            raise EdgespecError(f"{name} is a path: rm deletes the models edgespec downloaded, by name "
                                f"(`edgespec models` lists them); a file of your own is yours to delete")
    # every name is looked up before anything is deleted: a typo in the last one deletes nothing
    entries = {entry.name: entry for name in args.names for entry in registry.members(name)}
    for entry in entries.values():
        users = shared_with(entry, registry=registry, along=entries)
        if users:
            print(f"{entry.name}: {kept_note(entry, users)}")
            continue
        removed = remove(entry, registry=registry, along=entries)
        print(f"{entry.name}: removed {removed[0]}" if removed else f"{entry.name}: nothing to remove")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import fetch, is_path_like, resolve_model
    from edgespec.models.registry import load_registry

    if is_path_like(args.name):
        print(resolve_model(args.name, download=False))
        return 0
    registry = load_registry()
    for entry in registry.members(args.name):
        print(fetch(entry, download=False, registry=registry))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from edgespec.models.compat import ensure_compatible
    from edgespec.models.fetch import resolve_model
    from edgespec.models.gguf_header import read_metadata, read_vocab_info

    infos = []
    for role, name in (("target", args.target), ("draft", args.draft)):
        path = resolve_model(name, download=False)
        meta, vocab = read_metadata(path), read_vocab_info(path)
        infos.append((name, vocab))
        print(f"{role}: {path}")
        print(f"  {meta.get('name') or '?'} | {meta.get('architecture')} | {meta.get('file_type') or '?'} | "
              f"context {meta.get('context_length') or '?'} | vocab {vocab.vocab_type}, {vocab.n_tokens} tokens, "
              f"BOS {vocab.bos}, EOS {vocab.eos}, add BOS {vocab.add_bos}")
    (target_name, target), (draft_name, draft) = infos
    ensure_compatible(target, draft, target_name=target_name, draft_name=draft_name)
    print(f"ok: {draft_name} can draft for {target_name}")
    return 0


def _cmd_paths(args: argparse.Namespace) -> int:
    import os

    from edgespec.config import HOME_ENV, dirs

    d = dirs()
    hub = d.hub_cache
    if hub is None:
        from huggingface_hub import constants

        hub = constants.HF_HUB_CACHE
    rows = [["config", d.config], ["user models.yaml", d.user_registry], ["data", d.data],
            ["models", d.models], ["cache", d.cache], ["HF cache (read)", hub]]
    for label, path in rows:
        print(f"{label + ':':20s} {path}")
    home = os.environ.get(HOME_ENV)
    print(f"({HOME_ENV}={home})" if home else f"(set {HOME_ENV} to keep all of these under one directory)")
    return 0

