"""The model catalog: models.yaml (shipped) plus the user's own file, as entries
to look names up in.

This module is the only reader of models.yaml; schema.py checks what it reads,
and each source kind (hub.py, bundled.py, derived.py) knows how to get its file.
The entries it reads into, ModelEntry and PairEntry, stand beside Source in
source.py, which every source kind imports (and this module hands on).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from edgespec.config import dirs, read_kept
from edgespec.errors import RegistryError, yaml_problem
from edgespec.models.bundled import DEFAULT_PAIR
from edgespec.models.hub import HubSource
from edgespec.models.progress import human_bytes
from edgespec.models.schema import check_pairs, parse, path_problem, repo_problem
from edgespec.models.source import ModelEntry, PairEntry

__all__ = ["DEFAULT_PAIR", "HUB_PREFIX", "ModelEntry", "PairEntry", "Registry", "hub_model", "is_path_like",
           "load_registry"]

HUB_PREFIX = "hf:"


def is_path_like(name_or_path: str) -> bool:
    """True for things that can only be paths: *.gguf, or containing a directory separator
    or ~ (registry names contain neither; hub repos are written owner/name only inside models.yaml)."""
    s = str(name_or_path)
    if s.startswith(HUB_PREFIX):
        return False
    return (s.lower().endswith(".gguf") or os.sep in s or (os.altsep is not None and os.altsep in s)
            or s.startswith(("~", ".")))


def hub_model(spec: str) -> ModelEntry:
    """Any GGUF file on the Hugging Face hub, without a registry entry, written as
    hf:OWNER/REPO/FILE.gguf (FILE may sit in a folder of the repo), optionally
    followed by @REVISION. No size or checksum is known: the file is checked to
    be GGUF and what the hub sends is trusted."""
    body, _, revision = spec[len(HUB_PREFIX):].partition("@")
    parts = body.split("/")
    if (len(parts) < 3 or not parts[-1].lower().endswith(".gguf") or repo_problem("/".join(parts[:2]))
            or path_problem("/".join(parts[2:]), folders=True)):
        raise RegistryError(
            f"{spec!r}: write a file on the Hugging Face hub as hf:OWNER/REPO/FILE.gguf (FILE may sit in "
            "a folder of the repo, never above it: no '..'), e.g. "
            "hf:Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    return ModelEntry(name=spec, source=HubSource(repo="/".join(parts[:2]), file="/".join(parts[2:]),
                                                  revision=revision or "main"),
                      description="a hub file named on the command line")


@dataclass
class Registry:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    files: tuple[Path, ...] = ()
    """The files it was read from, shipped first."""

    def model(self, name: str) -> ModelEntry:
        """The model called `name` (or a hub file named as hf:OWNER/REPO/FILE.gguf);
        RegistryError with suggestions if there is none."""
        if name in self.models:
            return self.models[name]
        if name.startswith(HUB_PREFIX):
            return hub_model(name)
        if name in self.pairs:
            raise RegistryError(f"{name!r} is a pair, not a model; its target is {self.pairs[name].target!r}")
        raise RegistryError(self._unknown("model", name, self.models))

    def pair(self, name: str) -> PairEntry:
        """The pair called `name`; RegistryError with suggestions if there is none."""
        if name in self.pairs:
            return self.pairs[name]
        if name in self.models:
            raise RegistryError(f"{name!r} is a model, not a pair")
        raise RegistryError(self._unknown("pair", name, self.pairs))

    def pair_or_model(self, name: str) -> PairEntry:
        """The pair called `name`, or else the model called `name` (or a hub file)
        alone, as a pair without a draft (prompt lookup needs none)."""
        if name in self.pairs:
            return self.pairs[name]
        if name in self.models or name.startswith(HUB_PREFIX):
            return PairEntry(name=name, target=name, draft=None, mode="lookup")
        raise RegistryError(self._unknown("pair or model", name, {**self.pairs, **self.models}))

    def members(self, name: str) -> list[ModelEntry]:
        """The models a name stands for: a pair's target and draft, or the model itself."""
        pair = self.pair_or_model(name)
        return [self.model(n) for n in (pair.target, pair.draft) if n]

    def suggest(self, name: str, n: int = 3, *, kind: str | None = None) -> list[str]:
        """The closest names to `name`: models, pairs, or both (kind=None)."""
        names = [*(self.pairs if kind != "model" else ()), *(self.models if kind != "pair" else ())]
        close = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
        if not close:  # a fragment like "7b" or "gemma" matches by substring
            close = [c for c in names if name.lower() in c.lower()][:n]
        return close

    def _unknown(self, kind: str, name: str, names: dict) -> str:
        close = self.suggest(name, kind=kind)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return (f"unknown {kind} {name!r}.{hint} `edgespec models` lists them all; "
                f"a path to a .gguf file works too.")


def load_registry(*, user_file: str | Path | None = None) -> Registry:
    """The shipped models.yaml plus the user's file (default: the one `edgespec paths`
    shows), whose entries replace shipped ones of the same name."""
    shipped = _shipped_file()
    models, pairs = _entries(_read(shipped), shipped)
    files = [shipped]
    user = Path(user_file) if user_file is not None else dirs().user_registry
    if user.exists():
        user_models, user_pairs = _entries(_read(user), user)
        models.update(user_models)
        pairs.update(user_pairs)
        files.append(user)
    elif user_file is not None:
        raise RegistryError(f"{user}: no such file")
    check_pairs(pairs, models, files[-1])
    return Registry(models=models, pairs=pairs, files=tuple(files))


def _shipped_file() -> Path:
    packaged = resources.files("edgespec").joinpath("models.yaml")
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "models.yaml"  # a source checkout


MAX_BYTES = 1 << 20
"""The largest models.yaml read (some 5,000 entries; the shipped one is 20 kB): YAML is parsed at
about 300 kB a second, and every command reads it."""


def _read(path: Path) -> Any:
    try:
        data = read_kept(path, limit=MAX_BYTES)  # never blocks: every command reads it, a FIFO would hang them all
    except OSError as e:
        raise RegistryError(f"{path}: cannot read it ({e.strerror or e})") from e
    except ValueError:
        raise RegistryError(f"{path}: more than a models.yaml holds (at most {human_bytes(MAX_BYTES)})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RegistryError(f"{path}: not a text file (byte {e.start} is not UTF-8); "
                            f"models.yaml must be YAML text") from e
    try:
        return yaml.load(text, Loader=_UniqueKeys) or {}  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise RegistryError(f"{path}: not valid YAML: {yaml_problem(e)}") from e
    except RecursionError:  # YAML nested deeper than Python's stack
        raise RegistryError(f"{path}: it is nested too deeply to be a models.yaml") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: YAML keeps the
    last, so a second model of one name would silently replace the first."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # (an unhashable key is refused by the loader itself)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _entries(doc: Any, path: Path) -> tuple[dict[str, ModelEntry], dict[str, PairEntry]]:
    models, pairs = parse(doc, path)
    for kind, names in (("model", models), ("pair", pairs)):
        for name in names:  # `path`, `rm`, --target and --pair would take it for a file
            if is_path_like(name) or name.startswith(HUB_PREFIX):
                raise RegistryError(f"{path}: {kind} {name!r}: the name reads as a path (a '.gguf' end, a '/', a "
                                    f"leading '~' or '.') or a hub file ('hf:'), and would be taken for one; "
                                    f"give it a plain name")
    return ({name: ModelEntry(name=name, **fields) for name, fields in models.items()},
            {name: PairEntry(name=name, **fields) for name, fields in pairs.items()})
