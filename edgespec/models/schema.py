"""What a valid models.yaml looks like, checked by hand: every problem is
reported with the file, the entry and the field, so a typo in a user file is
one fix away, and every file name is checked to stay inside its folder."""

from __future__ import annotations

import difflib
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import RegistryError
from edgespec.models.bundled import PackageFileSource, PartsSource
from edgespec.models.derived import REQUANTIZE_TYPES, RequantizeSource
from edgespec.models.download import ETAG_SUFFIX, PART_SUFFIX
from edgespec.models.hub import HubSource
from edgespec.models.source import ModelEntry, PairEntry, Source
from edgespec.limits import LIMITS
from edgespec.modes import DEFAULT_MODE, MODES

ROLES = ("target", "draft")


_HUB_NAME = re.compile(r"(?!.*(?:--|\.\.))\w(?:[\w.-]{0,94}\w)?", re.ASCII)
"""One part of a hub repository id, as huggingface_hub's validate_repo_id has it (ASCII here): at
most 96 letters, digits, '-', '_' and '.', starting and ending with a letter, digit or '_', never
'--' or '..'. The hub refuses any other id, and '--' is what joins owner and name into the
download folder's name, so two repos never share one."""


def repo_problem(repo: str) -> str | None:
    """What is wrong with a hub repository id, or None: 'owner/name', each part a _HUB_NAME,
    the name not ending in '.git' (the hub's rule too)."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(_HUB_NAME.fullmatch(p) for p in parts) or repo.endswith(".git"):
        return ("must look like 'owner/name': letters, digits, '-', '_' and '.', each part starting and "
                "ending with a letter, digit or '_', without '--' or '..'")
    return None


def path_problem(path: str, *, folders: bool = False) -> str | None:
    """What is wrong with a file name from models.yaml, or None. A file name is
    joined to one of edgespec's folders (or a package's, or a hub repo's), so it
    must stay inside it: a plain name, or with `folders` plain names joined by
    '/'; never absolute, never '..', no backslash (a separator on Windows)."""
    names = path.split("/") if folders else [path]
    if not path or any(n in ("", ".", "..") or "/" in n or "\\" in n or "\0" in n for n in names):
        return ("must be a relative path inside its folder, without '..' or '\\'" if folders
                else "must be a plain file name (no folders, no '..'): it is a file in the models folder")
    return None


def parse(doc: Any, path: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """The models and pairs of a models.yaml document at `path`: for each name, its
    checked fields (the keyword arguments of ModelEntry or PairEntry, less the name)."""
    if not isinstance(doc, dict):
        raise RegistryError(f"{path}: expected a mapping with 'models' and/or 'pairs'")
    unknown = set(doc) - {"models", "pairs"}
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key(s) {sorted(unknown)}; expected 'models' and 'pairs'")
    models = {}
    for name, raw in _section(doc, "models", path).items():
        models[str(name)] = _model_fields(raw, _Where(path, "model", str(name)))
    pairs = {}
    for name, raw in _section(doc, "pairs", path).items():
        pairs[str(name)] = _pair_fields(raw, _Where(path, "pair", str(name)))
    return models, pairs


def _section(doc: dict, key: str, path: Path) -> dict:
    section = doc.get(key) or {}
    if not isinstance(section, dict):
        raise RegistryError(f"{path}: '{key}' must be a mapping of name -> entry")
    return section


MAX_PARTS = 1000
"""Most parts a model's file comes in (PyPI caps a package at some 100 MB: 100 GB in
all); each part is listed when models.yaml is read."""

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 2, 4, 4, 4, 60, 60


def _shown(value: Any) -> str:
    """A value from models.yaml as an error message shows it: cut short, since YAML's
    aliases nest a few lines into billions of items."""
    return _SHOWN.repr(value)


@dataclass(frozen=True)
class _Where:
    path: Path
    kind: str
    name: str

    def error(self, field_name: str, problem: str) -> RegistryError:
        return RegistryError(f"{self.path}: {self.kind} {_shown(self.name)}: field '{field_name}' {problem}")


_MODEL_FIELDS = {"title", "description", "params", "quant", "license", "context_length", "min_ram_gb", "vocab",
                 "roles", "size", "approx_size", "sha256", "unverified", "source"}
_PAIR_FIELDS = {"description", "target", "draft", "mode", "k"}


def _model_fields(raw: Any, where: _Where) -> dict:
    raw = _mapping(raw, where, _MODEL_FIELDS)
    if "source" not in raw:
        raise where.error("source", "is missing (where does the file come from?)")
    roles = raw.get("roles", [])
    if not isinstance(roles, list) or any(r not in ROLES for r in roles):
        raise where.error("roles", f"must be a list of {list(ROLES)} (got {_shown(roles)})")
    sha = _opt(raw, "sha256", str, where)
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha.lower())):
        raise where.error("sha256", f"must be 64 hex digits (got {_shown(sha)})")
    return dict(
        source=_source(raw["source"], where),
        title=_opt(raw, "title", str, where),
        description=_opt(raw, "description", str, where) or "",
        params=_opt(raw, "params", str, where),
        quant=_opt(raw, "quant", str, where),
        license=_opt(raw, "license", str, where),
        context_length=_positive(raw, "context_length", where),
        min_ram_gb=_opt(raw, "min_ram_gb", (int, float), where),
        vocab=_opt(raw, "vocab", str, where),
        roles=tuple(roles),
        size=_positive(raw, "size", where),
        approx_size=_positive(raw, "approx_size", where),
        sha256=sha.lower() if sha else None,
        unverified=bool(_opt(raw, "unverified", bool, where)),
    )


def _source(raw: Any, where: _Where) -> Source:
    if not isinstance(raw, dict):
        raise where.error("source", "must be a mapping with a 'kind'")
    kind = raw.get("kind")
    fields = {k: v for k, v in raw.items() if k != "kind"}
    sub = where

    def need(key: str, typ: type = str) -> Any:
        value = fields.get(key)
        if value is None:
            raise sub.error(f"source.{key}", f"is missing (required for kind {_shown(kind)})")
        if not isinstance(value, typ) or isinstance(value, bool):
            raise sub.error(f"source.{key}", f"must be {typ.__name__} (got {_shown(value)})")
        return value

    def only(allowed: set[str]) -> None:
        extra = set(fields) - allowed
        if extra:
            raise sub.error(f"source.{sorted(extra)[0]}", f"is not a field of kind {_shown(kind)} (allowed: {sorted(allowed)})")

    def path(key: str, value: str | None = None, *, folders: bool = False) -> str:
        """A required file name (or the given value of that field) that stays inside its folder."""
        value = need(key) if value is None else value
        problem = path_problem(value, folders=folders)
        if problem:
            raise sub.error(f"source.{key}", f"{problem} (got {_shown(value)})")
        return value

    if kind == "hub":
        only({"repo", "file", "revision"})
        repo = need("repo")
        problem = repo_problem(repo)
        if problem:
            raise sub.error("source.repo", f"{problem} (got {_shown(repo)})")
        file = path("file", folders=True)
        if file.endswith((PART_SUFFIX, ETAG_SUFFIX)):  # beside a hub file in its folder: its unfinished download
            raise sub.error("source.file", f"must not end in '{PART_SUFFIX}' or '{ETAG_SUFFIX}', the names of "
                                           f"another file's unfinished download (got {_shown(file)})")
        revision = fields.get("revision")
        if revision is not None and not isinstance(revision, str):  # YAML reads 1.10 as 1.1, 0123 as 83
            raise sub.error("source.revision", f"must be text: a tag, branch or commit, in quotes if YAML would "
                                               f"read it as a number ('1.10') (got {_shown(revision)})")
        return HubSource(repo=repo, file=file, revision=revision or "main")
    if kind == "pypi_parts":
        only({"packages", "file", "count", "pip", "extra", "filename"})
        count = need("count", int)
        if not 1 <= count <= MAX_PARTS:
            raise sub.error("source.count", f"must be at least 1 and at most {MAX_PARTS} (got {count})")
        source = PartsSource(packages=need("packages"), file=need("file"), count=count, pip=need("pip"),
                             filename=path("filename"), extra=fields.get("extra"))
        try:
            parts = source.parts()
            source.pip.format(i=1, i0=0)
        except (KeyError, IndexError, ValueError) as e:
            raise sub.error("source", f"has a bad template ({e}); use {{i}} (from 1) or {{i0}} (from 0)") from e
        for _, file in parts:
            path("file", file, folders=True)
        return source
    if kind == "package_file":
        only({"package", "path", "pip"})
        return PackageFileSource(package=need("package"), path=path("path", folders=True), pip=need("pip"))
    if kind == "requantize":
        only({"model", "type", "filename"})
        type_name = need("type")
        if type_name not in REQUANTIZE_TYPES:
            raise sub.error("source.type", f"must be one of {list(REQUANTIZE_TYPES)} (got {_shown(type_name)})")
        return RequantizeSource(model=need("model"), type=type_name, filename=path("filename"))
    raise sub.error("source.kind",
                    f"must be one of 'hub', 'pypi_parts', 'package_file', 'requantize' (got {_shown(kind)})")


def _pair_fields(raw: Any, where: _Where) -> dict:
    raw = _mapping(raw, where, _PAIR_FIELDS)
    target = raw.get("target")
    if not isinstance(target, str):
        raise where.error("target", f"must be a model name (got {_shown(target)})")
    draft = _opt(raw, "draft", str, where)
    mode = raw.get("mode", DEFAULT_MODE)
    if mode not in MODES:
        raise where.error("mode", f"must be one of {list(MODES)} (got {_shown(mode)})")
    if mode == "draft" and draft is None:  # every reply of the pair would be refused
        raise where.error("mode", "'draft' needs a draft model: name one in 'draft', or use mode 'lookup' or 'auto'")
    k, limit = raw.get("k", LIMITS["k"].default), LIMITS["k"]
    if not isinstance(k, int) or isinstance(k, bool) or not limit.allows(k):
        raise where.error("k", f"must be a whole number {limit.range()} (got {_shown(k)})")
    return dict(target=target, draft=draft, mode=mode, k=k, description=_opt(raw, "description", str, where) or "")


def check_pairs(pairs: dict[str, PairEntry], models: dict[str, ModelEntry], path: Path) -> None:
    """No name is both a model and a pair (`pull` and `rm` would take the pair, `--target` the
    model), every pair names known models, and every requantized model another model that is
    not requantized."""
    both = sorted(set(models) & set(pairs))
    if both:
        raise RegistryError(f"{path}: {_shown(both[0])} is both a model and a pair (`pull` and `rm` would take "
                            f"the pair, --target the model); give one of them another name")
    for model in models.values():
        source = model.source
        if isinstance(source, RequantizeSource) and (source.model not in models or source.model == model.name
                                                     or isinstance(models[source.model].source, RequantizeSource)):
            raise RegistryError(f"{path}: model {_shown(model.name)}: field 'source.model' must name another model "
                                f"that is not itself made by requantizing (got {_shown(source.model)})")
    for pair in pairs.values():
        for role in ("target", "draft"):
            name = getattr(pair, role)
            if name is not None and name not in models:
                close = difflib.get_close_matches(name, list(models), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise RegistryError(f"{path}: pair {_shown(pair.name)}: field '{role}' names unknown model {_shown(name)}{hint}")


def _mapping(raw: Any, where: _Where, allowed: set[str]) -> dict:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where.path}: {where.kind} {_shown(where.name)} must be a mapping of fields")
    extra = set(raw) - allowed
    if extra:
        bad = sorted(map(str, extra))[0]
        close = difflib.get_close_matches(bad, list(allowed), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known fields: {', '.join(sorted(allowed))})"
        raise where.error(bad, f"is not a known field{hint}")
    return raw


def _opt(raw: dict, key: str, typ: type | tuple[type, ...], where: _Where) -> Any:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise where.error(key, f"must be {names} (got {_shown(value)})")
    return value


def _positive(raw: dict, key: str, where: _Where) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise where.error(key, f"must be a positive integer (got {_shown(value)})")
    return value
