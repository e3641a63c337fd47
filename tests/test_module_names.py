"""No two modules of edgespec/ share a file name (__init__.py and __main__.py aside):
a name such as settings.py or app.py then says which module it is, in a traceback,
an editor's tab or a search, without its folder."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edgespec"

SHARED_ON_PURPOSE = frozenset({"__init__.py", "__main__.py"})
"""A package's face and its launcher: named by Python, not by what they hold."""


def shared_names(root: Path) -> dict[str, list[str]]:
    """File name -> the modules under `root` that have it (paths from root's parent),
    for every name that more than one module has."""
    paths = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name not in SHARED_ON_PURPOSE:
            paths[path.name].append(path.relative_to(root.parent).as_posix())
    return {name: found for name, found in sorted(paths.items()) if len(found) > 1}


def test_no_two_modules_share_a_file_name():
    shared = shared_names(PACKAGE)
    assert not shared, "\n".join(["modules that share a file name (rename one of each):",
                                  *(f"{name}: {', '.join(found)}" for name, found in shared.items())])


def test_shared_names_are_found(tmp_path):
    root = tmp_path / "pkg"
    for name in ("__init__.py", "a/__init__.py", "a/app.py", "b/app.py", "b/__main__.py", "__main__.py", "c.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    assert shared_names(root) == {"app.py": ["pkg/a/app.py", "pkg/b/app.py"]}
