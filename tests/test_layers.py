"""The import graph of edgespec/: no circles, and nothing imports upward.

Every import is read with `ast`, at the top of a file, inside a function and
under TYPE_CHECKING alike (a circle through types only is still a circle, and
an import inside a function is still an arrow). A module is placed by its
package (edgespec/<package>/...), so a new module in a known package needs no
entry here; a new package or a new module directly under edgespec/ does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgespec"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("__main__",),  # the launcher: `edgespec` and `python -m edgespec`
    ("cli", "tui", "server", "bench"),  # the faces
    ("load", "chat"),  # siblings: neither imports the other
    ("load_settings",),  # what a face asks to load (names the engine's CacheSettings)
    ("engine",),
    ("models",),
    ("llama",),  # the only package that touches ctypes
    ("placement", "workspace"),  # pure: they import only the ground
    ("ground",),
)
"""Rooms, top floor first. A room imports rooms on lower floors only (it may skip
floors), never one on its own floor or above, except as SIDEWAYS allows."""

GROUND = frozenset({"__init__", "errors", "config", "limits", "modes", "machine", "net"})
"""The modules directly under edgespec/ that make up the ground (stdlib and platformdirs only)."""

SIDEWAYS = frozenset({("cli", "tui"), ("cli", "server"), ("cli", "bench")})
"""The command line starts the other faces (the app, the server, the benchmark)."""

INSIDE = {"tui": ("app", "screens", "widgets")}
"""Floors inside a package, top first, by the first name under it: a screen may import
widgets, a widget imports no screen (it posts a message, and the screen pushes the
dialog). Its other modules (the package's own helpers) stand below these, its
__init__ (the package's face) above them."""


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """The edgespec modules `module` imports, anywhere in its file: (module, line).
    `from edgespec.cli import chats` imports the module edgespec.cli.chats;
    `from edgespec.llama import system_info` imports edgespec.llama's __init__."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*above, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import edgespec.llama.rpc.x`: the module that holds x
                name = name.rpartition(".")[0]
            if name and name != module and (name, node.lineno) not in found:
                found.append((name, node.lineno))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def room(module: str) -> str:
    """The room a module stands in: its package under edgespec/, or for a module
    directly under it, its own name (the ground's modules: "ground")."""
    parts = module.split(".")
    if len(parts) == 1:
        return "ground"  # edgespec/__init__.py: the version
    if len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").exists():
        return "ground" if parts[1] in GROUND else parts[1]
    return parts[1]


def floor(room_name: str) -> int:
    for i, rooms in enumerate(FLOORS):
        if room_name in rooms:
            return i
    raise KeyError(room_name)


def inside_floor(module: str) -> int | None:
    """The floor of `module` inside its package, where INSIDE orders that package."""
    parts = module.split(".")
    order = INSIDE.get(room(module))
    if order is None:
        return None
    if len(parts) == 2:
        return -1  # the package's face
    return order.index(parts[2]) if parts[2] in order else len(order)


def test_every_module_stands_in_a_room_with_a_floor():
    unplaced = sorted({f"{room(m)} ({MODULES[m].relative_to(PACKAGE.parent)})" for m in MODULES
                       if not any(room(m) in rooms for rooms in FLOORS)})
    assert unplaced == [], "place these in FLOORS (or the ground's modules in GROUND)"


def test_nothing_imports_upward_or_sideways():
    wrong = []
    for module, imports in GRAPH.items():
        for target, line in imports:
            a, b = room(module), room(target)
            if a == b:
                continue
            if floor(b) <= floor(a) and (a, b) not in SIDEWAYS:
                wrong.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target} ({a} -> {b})")
    assert not wrong, "\n".join(["against the floors:", *wrong])


def test_inside_a_package_nothing_imports_upward():
    wrong = []
    for module, imports in GRAPH.items():
        for target, line in imports:
            if room(module) == room(target) and room(module) in INSIDE:
                if inside_floor(target) < inside_floor(module):
                    wrong.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not wrong, "\n".join(["against the floors inside a package:", *wrong])


def test_a_package_s_modules_import_nothing_from_its_face():
    """A package's __init__ is its face for the modules outside it; its own modules
    import what they need from the module that defines it (edgespec's own
    __init__, the version, is the ground's)."""
    wrong = [f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}"
             for module, imports in GRAPH.items() for target, line in imports
             if target != "edgespec" and module.startswith(target + ".")]
    assert not wrong, "\n".join(["from their package's face:", *wrong])


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_circles():
    circles = _circles({m: [t for t, _ in imports] for m, imports in GRAPH.items()})
    assert not circles, "\n".join(["circles:", *(" <-> ".join(c) for c in circles)])


@pytest.mark.parametrize("graph, circles", [
    ({"a": ["b"], "b": ["c"], "c": []}, []),
    ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}, [["a", "b", "c"]]),
    ({"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}, [["a", "b"], ["c", "d"]]),
])
def test_circles_are_found(graph, circles):
    assert sorted(_circles(graph)) == circles


def test_imports_are_read_inside_functions_and_under_type_checking(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from edgespec.errors import EdgespecError\n"
                      "def f():\n    from edgespec.cli import output\n    import edgespec.llama.rpc\n"
                      "from . import config\n")
    assert sorted(_imports("edgespec.sample", source)) == [
        ("edgespec.cli.output", 5), ("edgespec.config", 7), ("edgespec.errors", 3), ("edgespec.llama.rpc", 6)]


def test_rooms_are_by_package():
    assert [room(m) for m in ("edgespec", "edgespec.errors", "edgespec.load", "edgespec.cli.output",
                              "edgespec.tui.widgets.sidebar")] == ["ground", "ground", "load", "cli", "tui"]
    assert [inside_floor(m) for m in ("edgespec.tui", "edgespec.tui.app", "edgespec.tui.screens.chat",
                                      "edgespec.tui.widgets.sidebar", "edgespec.tui.stream")] == [-1, 0, 1, 2, 3]
