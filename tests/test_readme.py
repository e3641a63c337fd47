"""The README's first screen: the two commands that work on a fresh machine and the app's keys;
and every relative link of the README and docs/ points to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgespec.tui.screens.chat import ChatScreen

ROOT = Path(__file__).resolve().parent.parent
FIRST_SCREEN_LINES = 40
LINK = re.compile(r"\]\(([^)\s]+)\)")


def first_screen() -> str:
    return "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN_LINES])


def ci_command(start: str) -> str:
    """The command line of .ci/run that starts with `start`, without its comment."""
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        if line.startswith(start):
            return line.split("#")[0].strip()
    raise AssertionError(f".ci/run has no line starting with {start!r}")


def test_first_screen_holds_the_test_command_ci_runs():
    command = f"{ci_command('scripts/install.sh')} && {ci_command('.venv/bin/python -m pytest')}"
    assert command == "scripts/install.sh --test && .venv/bin/python -m pytest -q"
    assert command in first_screen().splitlines()


def test_first_screen_holds_the_install_and_chat_command():
    assert "scripts/install.sh && .venv/bin/edgespec" in first_screen().splitlines()


def test_first_screen_holds_every_key_of_the_chat_screen():
    screen = first_screen()
    keys = {key.replace("question_mark", "?") for binding in ChatScreen.BINDINGS for key in binding.key.split(",")}
    assert {"ctrl+q", "f1", "ctrl+s", "f3", "f4"} <= keys
    missing = sorted(key for key in keys if f"`{key}`" not in screen)
    assert missing == []


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files(path: Path):
    targets = [t.split("#")[0] for t in LINK.findall(path.read_text(encoding="utf-8"))
               if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert missing == []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_anchors_name_existing_headings(path: Path):
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if "#" not in target or re.match(r"[a-z]+:", target):
            continue
        file, anchor = target.split("#", 1)
        text = (path.parent / file if file else path).read_text(encoding="utf-8")
        headings = {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
        if anchor not in headings:
            broken.append(target)
    assert broken == []


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(readme) if t.startswith("docs/")}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked
