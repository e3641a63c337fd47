"""A model's reply into file edits, and the unified diff a user reviews. Pure text: no files.

Three forms are read, whichever the model wrote:
  - whole: the file's path alone on a line (or in the fence's info string), then a fenced
    block with the complete new content. EDIT_INSTRUCTIONS asks for this one: Aider's
    "whole" format is what small coding models (Qwen2.5-Coder 1.5B) follow best.
  - diff: a ```diff block with ---/+++ headers; hunks are placed by their context lines,
    so wrong line numbers in @@ headers do no harm.
  - replace: a path line, then <<<<<<< SEARCH / ======= / >>>>>>> REPLACE blocks; as in
    Aider, a block may edit what an earlier block for the same file wrote.
An edit that cannot be applied exactly as meant raises EditError; nothing is half-applied.
Every edit keeps the file's newline style (CRLF stays CRLF, CR alone stays CR; in a file
that mixes CRLF and LF, each line its own), its BOM and its final-newline state, and the
lines a search/replace block or a diff hunk keeps stay as the file has them (trailing
spaces the model dropped included).
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from edgespec.errors import EditError
from edgespec.workspace.root import language_for, quoted_path

WHOLE, DIFF, REPLACE = "whole", "diff", "replace"


@dataclass(frozen=True)
class FileEdit:
    """One file's new content, as a reply asks for it."""

    path: str
    """The attached file's relative path (as given in `files`), or the new path the reply names."""
    new_text: str
    """The complete new content, in the original's newline style."""
    kind: str
    """The form the reply used: "whole", "diff" or "replace"."""
    new: bool = False
    """The path is not an attached file: the user confirms before it is created."""
    versions: int = 1
    """How many different whole versions of the file the reply wrote; `new_text` is the last.
    More than one, the faces say so beside the diff: it shows only the version applied."""


_EXAMPLE_PATH = "shapes.py"
_EXAMPLE_TEXT = """\
def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""
"""The file EDIT_INSTRUCTIONS shows; a small model sometimes writes it out again as a new file."""

EDIT_INSTRUCTIONS = f"""\
When you change a file, write its path alone on one line, then the complete new content of \
the file in a fenced code block, like this:

{_EXAMPLE_PATH}
```python
{_EXAMPLE_TEXT}```

Rules:
- The path line holds only the path, exactly as the file was given to you.
- Write every line of the file, the unchanged ones too. Never shorten it with "..." or \
comments such as "rest of the code unchanged".
- Repeat this for each file you change, and leave out the files you do not change.
- To create a new file, do the same with the new file's path.
"""
"""What the chat layer tells the model about answering with changed files (the whole format)."""


def parse_edits(reply: str, files: Mapping[str, str], *,
                same_file: Callable[[str], str | None] | None = None) -> list[FileEdit]:
    """The edits a reply asks for, in the order it names them; `files` maps attached paths to their text.
    `same_file(path)`: the attached path that a path the reply names and no attached path
    matches is on disk (a symlink to it, inside the project folder), or None; the caller
    that knows the files says so, as this function reads text only.

    Edits that change nothing are left out. A path that is not attached comes back as a
    whole-file edit with new=True. A block the reply gives no path for is a file's whole
    new content only where that is clear: the one attached file (one block, not under half
    its lines), the one attached file the prose names in backticks, or the attached file the
    block clearly is a version of (RESEMBLANCE), which also catches a made-up name for an
    attached file. Raises EditError when an edit is there but cannot be applied as written
    (then none is returned)."""
    scan = _Scan(reply.replace("\r\n", "\n").split("\n"), files, same_file)
    scan.run()
    edits = []
    for path, pieces in scan.pieces.items():
        edit = _build(path, pieces, files)
        if edit is not None:
            edits.append(edit)
    return edits


def unified_diff(path: str, old: str, new: str) -> str:
    """A unified diff from `old` to `new` (a/path, b/path headers, 3 lines of context); "" when equal."""
    lines = difflib.unified_diff(
        _with_ends(old), _with_ends(new), fromfile=quoted_path(f"a/{path}"), tofile=quoted_path(f"b/{path}"), n=3
    )
    out = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _with_ends(text: str) -> list[str]:
    """A text's lines with their ends, split at "\\n" alone as the parser splits (str.splitlines
    also ends a line at a form feed, U+2028 and other separators, which are inside lines here);
    a file that ends its lines in CR alone is shown with LF ends, line by line."""
    lines = [line + "\n" for line in (text.replace("\r", "\n") if _cr_only(text) else text).split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


# ---------------------------------------------------------------------------
# Scanning a reply: fences, path lines, search/replace blocks, diffs


@dataclass
class _Whole:
    lines: list[str]
    inferred: bool = False
    """No path was written next to the block: it must look like the whole file."""
    info: str = ""


@dataclass
class _Block:
    """A search/replace pair, or a diff hunk (search: context and removed lines)."""

    search: list[str]
    replace: list[str]
    near: int | None = None
    """A diff hunk's line number (1-based) from its @@ header, used only to break a tie."""


@dataclass
class _Pieces:
    kind: str
    wholes: list[_Whole] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)
    creates: bool = False
    """A diff from /dev/null or a search/replace with an empty SEARCH: the file is created."""


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(.*?)\s*$")
_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\b.*$", re.IGNORECASE)
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\b.*$", re.IGNORECASE)
_HUNK = re.compile(r"^@@\s*(?:-(\d+))?")
_DIFF_INFOS = frozenset({"diff", "patch", "udiff"})


class _Scan:
    """One pass over a reply's lines, collecting the pieces of each file's edit."""

    def __init__(self, lines: list[str], files: Mapping[str, str], same_file: Callable[[str], str | None] | None):
        self.lines = lines
        self.files = files
        self.same_file = same_file
        self.spellings = _spellings(files)
        self.pieces: dict[str, _Pieces] = {}
        self.pathless: list[_Whole] = []
        self.hint: str | None = None
        """The path named by the last non-blank line (None when that line was prose)."""
        self.mentioned: set[str] = set()
        """Attached paths named in backticks in the prose since the last block."""
        self.replacing: str | None = None
        """The path of the last search/replace block: the next one without a path is for the same file."""

    def run(self) -> None:
        i = 0
        while i < len(self.lines):
            line = self.lines[i]
            fence = _FENCE.match(line)
            if _SEARCH.match(line):
                i = self._search_replace(self.lines, i, self.hint or self.replacing)
            elif fence:
                i = self._fence(i, fence)
            else:
                if line.strip():
                    self.hint = _path_of_line(line, self.spellings)
                    self.mentioned |= _mentions(line, self._match)
                i += 1
        if not self.pieces:
            self._guess_pathless()

    def _guess_pathless(self) -> None:
        """Blocks without a path, when the reply names none: the one attached file, or the one a block resembles."""
        if len(self.files) == 1:
            (path,) = self.files
            if len(self.pathless) == 1 and _same_language(self.pathless[0].info, path):
                self._add(path, WHOLE).wholes.append(self.pathless[0])
            return
        for block in self.pathless:
            path = _resembled(block, self.files)
            if path is not None and path not in self.pieces:
                self._add(path, WHOLE).wholes.append(block)

    def _fence(self, start: int, match: re.Match[str]) -> int:
        indent, marks, info = match.groups()
        info_path = _path_in_info(info)
        path = info_path or self.hint
        named = path or (next(iter(self.mentioned)) if len(self.mentioned) == 1 else None)
        end = _closing(self.lines, start, marks, attached=self.files.get(self._match(named)[0]) if named else None)
        closed = end < len(self.lines)
        body = [line[len(indent):] if line.startswith(indent) else line for line in self.lines[start + 1 : end]]
        if any(_SEARCH.match(line) for line in body):
            self._search_replace(body, 0, path or self.replacing, until=len(body))
        elif info.lower() in _DIFF_INFOS or _looks_like_diff(body):
            if not closed:
                raise EditError("The reply ends inside a diff, so it was cut short; ask the model to finish it.")
            self._diff(body, path)
        else:
            self._code(body, path, info, closed)
        self.hint = None
        self.mentioned = set()
        return end + 1

    def _code(self, body: list[str], path: str | None, info: str, closed: bool) -> None:
        named = _comment_path(body[0]) if body else None  # a first line "# src/x.py"
        path = path or named
        inferred = path is None and len(self.mentioned) == 1
        if inferred:
            (path,) = self.mentioned
        if path is None:
            if closed:
                self.pathless.append(_Whole(body, inferred=True, info=info))
            return
        target, attached = self._match(path)
        if inferred and (not closed or not _same_language(info, target)):
            return
        resembled = None if attached or not closed else _resembled(_Whole(body, info=info), self.files)
        if resembled is not None and resembled not in self.pieces:
            # a small model's slip: an attached file under a made-up name (but not a second file beside it)
            target, attached = resembled, True
        if not closed:
            raise EditError(f"The reply ends inside the code block for {target}, so it was cut short; ask the model to finish it.")
        if named and attached and self._match(named) == (target, True) and _without_bom(_split(self.files[target])[:1]) != body[:1]:
            body = body[1:]
        self._add(target, WHOLE).wholes.append(_Whole(body, inferred=inferred, info=info))

    def _search_replace(self, lines: list[str], i: int, path: str | None, until: int | None = None) -> int:
        """Read search/replace blocks from lines[i:until]; returns where scanning goes on."""
        end = len(lines) if until is None else until
        while i < end:
            line = lines[i]
            if not _SEARCH.match(line):
                if until is None:
                    return i
                if line.strip() and not _FENCE.match(line):
                    path = _path_of_line(line, self.spellings) or path
                i += 1
                continue
            search, replace, i = _read_block(lines, i, end)
            if path is None and len(self.files) == 1:
                (path,) = self.files
            if path is None:
                raise EditError("A search/replace block in the reply names no file; ask the model to put the file's path before it.")
            target, attached = self._match(path)
            pieces = self._add(target, REPLACE)
            if not attached and any(line.strip() for line in search):
                raise EditError(f"The reply edits {target}, which is not attached; attach it and ask again.")
            if not attached:
                pieces.creates = True
            pieces.blocks.append(_Block(search, replace))
            self.hint = self.replacing = path
            while until is None and i < end and not lines[i].strip():
                i += 1
        return i

    def _diff(self, body: list[str], default: str | None) -> None:
        for raw_path, hunks, creates in _diff_sections(body):
            path = raw_path or default
            if path is None and len(self.files) == 1:
                (path,) = self.files
            if path is None:
                raise EditError("A diff in the reply names no file; ask the model for ---/+++ lines with the path.")
            target, attached = self._match(path, diff=True)
            if not attached and not creates:
                raise EditError(f"The reply's diff changes {target}, which is not attached; attach it and ask again.")
            pieces = self._add(target, WHOLE if not attached else DIFF)
            if not attached:
                pieces.wholes.append(_Whole([line for hunk in hunks for line in hunk.replace]))
            else:
                pieces.blocks.extend(hunks)

    def _match(self, path: str, *, diff: bool = False) -> tuple[str, bool]:
        """_match, and else the attached file the path is on disk (same_file): a model may
        name a symlink where the attachment shows the file it links to, or the other way."""
        target, attached = _match(path, self.files, diff=diff)
        if not attached and self.same_file is not None and (same := self.same_file(target)) in self.files:
            return same, True
        return target, attached

    def _add(self, path: str, kind: str) -> _Pieces:
        pieces = self.pieces.setdefault(path, _Pieces(kind))
        if pieces.kind != kind:
            raise EditError(f"The reply changes {path} twice in different forms; ask for one complete version of the file.")
        return pieces


def _closing(lines: list[str], start: int, marks: str, *, attached: str | None) -> int:
    """The index of the fence closing the block opened at lines[start] (len(lines): none does).

    `attached`: the file the block is for. Where it has fenced examples of its own (as a
    README does), a fence inside the block may open one, which the next bare fence closes,
    since a model often wraps such a file in a fence no longer than its examples'. A fence
    with a language opens one; so does a bare fence led in, or followed, by a line that leads
    in or starts one of the file's untagged examples (_around). Any other bare fence closes
    the block, as in a reply of several separate blocks. Where the examples do not pair up,
    the block ends at its first closing fence, as it does otherwise."""
    tagged = attached is not None and _has_examples(attached)
    leads, firsts = _untagged_openings(attached) if attached else (frozenset(), frozenset())
    first, depth = len(lines), 0
    for end in range(start + 1, len(lines)):
        fence = _FENCE.match(lines[end])
        if fence is None or fence.group(2)[0] != marks[0]:
            continue
        if fence.group(3):
            if tagged and "`" not in fence.group(3):
                depth += 1
            continue
        lead, after = _around(lines, end)
        opens = not depth and (lead in leads or after in firsts)
        if len(fence.group(2)) >= len(marks):
            first = min(first, end)
            if not depth and not opens:
                return end
        depth = 1 if opens else max(depth - 1, 0)
    return first


def _has_examples(text: str) -> bool:
    """Whether a file holds a fenced block with a language (a Markdown example, a docstring's)."""
    return any((fence := _FENCE.match(line)) and fence.group(3) for line in text.split("\n"))


def _untagged_openings(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The lines that lead in to, and that start, the blocks without a language in `text`
    (_around), pairing its fences as Markdown does: a bare fence of the same mark, as long
    or longer, closes a block."""
    lines = text.split("\n")
    leads, firsts, open_marks = set(), set(), ""
    for i, line in enumerate(lines):
        fence = _FENCE.match(line)
        if fence is None:
            continue
        marks, info = fence.group(2), fence.group(3)
        if not open_marks:
            open_marks = marks
            if not info:
                lead, after = _around(lines, i)
                leads.add(lead)
                firsts.add(after)
        elif not info and marks[0] == open_marks[0] and len(marks) >= len(open_marks):
            open_marks = ""
    return frozenset(leads - {""}), frozenset(firsts - {""})


def _around(lines: list[str], i: int) -> tuple[str, str]:
    """The fence at lines[i]'s lead-in (the last non-blank line before it) and the line after
    it, stripped; "" for either where it is a fence or there is none, as no evidence."""
    lead = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
    after = lines[i + 1].strip() if i + 1 < len(lines) else ""
    return ("" if _FENCE.match(lead) else lead), ("" if _FENCE.match(after) else after)


def _read_block(lines: list[str], i: int, end: int) -> tuple[list[str], list[str], int]:
    """One <<<<<<< SEARCH ... ======= ... >>>>>>> REPLACE block starting at lines[i]."""
    divider = next((j for j in range(i + 1, end) if _DIVIDER.match(lines[j])), None)
    close = next((j for j in range(divider + 1, end) if _REPLACE.match(lines[j])), None) if divider else None
    if divider is None or close is None:
        raise EditError("The reply has an unfinished search/replace block (no ======= or >>>>>>> REPLACE); ask the model to finish it.")
    return lines[i + 1 : divider], lines[divider + 1 : close], close + 1


def _looks_like_diff(body: list[str]) -> bool:
    text = [line for line in body if line.strip()]
    if not text:
        return False
    first = text[0]
    return (
        first.startswith(("diff --git ", "@@"))
        or (len(text) > 1 and first.startswith("--- ") and text[1].startswith("+++ "))
    )


def _diff_sections(body: list[str]) -> list[tuple[str | None, list[_Block], bool]]:
    """(path from the headers or None, hunks, whether it creates the file) per file in a diff."""
    sections: list[tuple[str | None, list[_Block], bool]] = []
    path: str | None = None
    creates = False
    hunks: list[_Block] = []
    hunk: _Block | None = None
    raw: list[str] = []  # the current hunk's lines, with their markers

    def end_hunk() -> None:
        nonlocal hunk, raw
        if hunk is not None:
            while raw and raw[-1] == "":  # a blank line after the hunk, not a context line
                raw.pop()
            for entry in raw:
                marker, content = (entry[0], entry[1:]) if entry[:1] in (" ", "-", "+") else (" ", entry)
                if marker in " -":
                    hunk.search.append(content)
                if marker in " +":
                    hunk.replace.append(content)
            hunks.append(hunk)
        hunk, raw = None, []

    def end_section() -> None:
        nonlocal hunks
        end_hunk()
        if hunks:
            sections.append((path, hunks, creates))
        hunks = []

    i = 0
    while i < len(body):
        line = body[i]
        if line.startswith("--- ") and i + 1 < len(body) and body[i + 1].startswith("+++ "):
            end_section()
            old, new = _header_path(line), _header_path(body[i + 1])
            if new is None:
                raise EditError(f"The reply deletes {old}; deleting files is not done from a reply, delete it yourself.")
            path, creates = new, old is None
            i += 2
            continue
        if line.startswith("diff --git "):
            end_section()
        elif (header := _HUNK.match(line)) is not None:
            end_hunk()
            hunk = _Block([], [], near=int(header.group(1)) if header.group(1) else None)
        elif hunk is not None and not line.startswith("\\"):
            raw.append(line)
        elif hunk is None and line[:1] in ("-", "+", " ") and not line.startswith(("index ", "new file", "deleted file")):
            hunk = _Block([], [])  # a diff without @@ lines: one hunk placed by its context
            raw.append(line)
        i += 1
    end_section()
    return sections


def _header_path(line: str) -> str | None:
    """The path on a ---/+++ line (None for /dev/null), timestamps and quotes removed."""
    text = line[4:].split("\t")[0].strip().strip('"')
    return None if text == "/dev/null" else text


# ---------------------------------------------------------------------------
# Paths in a reply


_PATH = re.compile(r"^(?:\.{0,2}/)?[\w.@+\-]+(?:/[\w.@+\-]+)*$")
_EXTENSION = re.compile(r"[^./]\.[A-Za-z][A-Za-z0-9_+\-]*$")
_LABEL = re.compile(r"^[a-z ]{0,20}?\b(?:file(?:\s*name)?|path)\s*:\s*", re.IGNORECASE)
_LEADERS = re.compile(r"^(?:#{1,6}\s+|[-*+]\s+|\d+[.)]\s+)+")
_KNOWN_NAMES = frozenset({"Makefile", "Dockerfile", "LICENSE", "README", "Gemfile", "Rakefile", "Procfile"})


def _path_of_line(line: str, attached: Mapping[str, str]) -> str | None:
    """The path when a line holds a path alone (in backticks, bold, after ### or "File:"): one
    that looks like a path, or one of the `attached` spellings (_spellings) whatever it holds, as
    a space: by its looks alone, a line with spaces is prose."""
    text = _LABEL.sub("", _LEADERS.sub("", line.strip())).strip()
    for _ in range(3):
        if text in attached:  # before its quotes or its white space are taken for decoration
            return text
        text = text.rstrip(":").strip("`*'\"").strip()
    return text if _plausible_path(text) or text in attached else None


def _plausible_path(text: str) -> bool:
    text = text.replace("\\", "/")
    if not text or not _PATH.match(text) or text.endswith((".", "/")):
        return False
    name = text.rsplit("/", 1)[-1]
    return bool(_EXTENSION.search(name)) or name in _KNOWN_NAMES or "/" in text and name[:1] != "."


def _path_in_info(info: str) -> str | None:
    """A path in a fence's info string: ```python path/x.py, ```x.py, ```python:x.py, ```py title="x.py"."""
    for token in re.split(r"[\s:,]+", info):
        token = token.split("=", 1)[-1].strip("`'\"")
        if _plausible_path(token) and ("/" in token or _EXTENSION.search(token)):
            return token
    return None


_COMMENT_PATH = re.compile(r"^\s*(?:#|//|--|;|/\*|<!--)\s*(?:(?:file(?:name)?|path)\s*:\s*)?(\S+?)\s*(?:\*/|-->)?\s*$", re.IGNORECASE)


def _comment_path(line: str) -> str | None:
    """A path named by a comment on a block's first line ("# src/x.py", "// file: x.js")."""
    match = _COMMENT_PATH.match(line)
    return match.group(1) if match and _plausible_path(match.group(1)) else None


def _mentions(line: str, match: Callable[[str], tuple[str, bool]]) -> set[str]:
    """Attached paths a prose line names in backticks (`match`: _Scan._match)."""
    found = set()
    for quoted in re.findall(r"`([^`\s]+)`", line):
        target, attached = match(quoted.rstrip(".:,;"))
        if attached:
            found.add(target)
    return found


def _spellings(files: Mapping[str, str]) -> dict[str, str]:
    """Each attached path by the ways a reply writes it exactly: as it is, and as quoted_path
    spells it, with its quotes and with them removed (as a diff header's are)."""
    quoted = {spelling: key for key in files if quoted_path(key) != key
              for spelling in (quoted_path(key), quoted_path(key)[1:-1])}
    return {**quoted, **{key: key for key in files}}


def _match(path: str, files: Mapping[str, str], *, diff: bool = False) -> tuple[str, bool]:
    """The attached path a reply's path means, and True; or the path as a new one, and False.

    Accepts an attached path as it is or as quoted_path spells it (_spellings), ./ and a/ b/
    prefixes (diffs), an absolute or longer path ending with the attached one, and a bare
    name when exactly one attached file has it."""
    spellings = _spellings(files)
    for exact in [path, path[2:]] if diff and path.startswith(("a/", "b/")) else [path]:
        if exact in spellings:
            return spellings[exact], True
    candidate = posixpath.normpath(path.replace("\\", "/"))
    options = [candidate]
    if diff and candidate.startswith(("a/", "b/")):
        options.append(candidate[2:])
    normalized = {posixpath.normpath(key): key for key in files}
    for option in options:
        if option in normalized:
            return normalized[option], True
    for option in options:
        ends = [key for norm, key in normalized.items() if option.endswith("/" + norm) or norm.endswith("/" + option)]
        if len(ends) == 1:
            return ends[0], True
    return options[-1], False


_ALIASES = {
    "py": "python", "python3": "python", "py3": "python", "javascript": "js", "node": "js", "typescript": "ts",
    "sh": "bash", "shell": "bash", "zsh": "bash", "c++": "cpp", "cc": "cpp", "rs": "rust", "yml": "yaml",
    "md": "markdown", "golang": "go", "rb": "ruby", "text": "", "txt": "", "plaintext": "", "plain": "",
}


def _same_language(info: str, path: str) -> bool:
    """Whether a fence's language could be the file's (either unknown counts as yes)."""
    tag = info.split()[0].lower() if info.split() else ""
    tag = _ALIASES.get(tag, tag)
    wanted = language_for(path)
    return not tag or not wanted or tag == _ALIASES.get(wanted, wanted)


def _resembled(block: _Whole, files: Mapping[str, str]) -> str | None:
    """The attached file a pathless block is clearly a new version of (most lines alike, well ahead of the next)."""
    scores = []
    for path, text in files.items():
        old = _split(text)
        if _same_language(block.info, path) and _looks_whole(block.lines, old):
            scores.append((difflib.SequenceMatcher(None, old, block.lines, autojunk=False).ratio(), path))
    scores.sort(reverse=True)
    if not scores or scores[0][0] < RESEMBLANCE:
        return None
    if len(scores) > 1 and scores[1][0] > scores[0][0] - RESEMBLANCE_MARGIN:
        return None
    return scores[0][1]


RESEMBLANCE = 0.6
"""How alike (difflib's ratio of lines) a pathless block and an attached file must be to be taken as its new version."""
RESEMBLANCE_MARGIN = 0.2
"""How far ahead of the next file that match must be."""


# ---------------------------------------------------------------------------
# Building each file's new text


def _build(path: str, pieces: _Pieces, files: Mapping[str, str]) -> FileEdit | None:
    original = files.get(path)
    if original is None:
        lines = pieces.wholes[-1].lines if pieces.wholes else [line for b in pieces.blocks for line in b.replace]
        new_text = _finish(None, lines)
        if _echoes_example(path, new_text):
            return None
        _refuse_elision(path, "", new_text)
        return FileEdit(path, new_text, WHOLE, new=True, versions=_versions(pieces.wholes))
    bom = BOM if original.startswith(BOM) else ""
    body = original[len(bom) :]  # a BOM is not part of the first line: the model rarely copies it
    old_lines = _split(body)
    versions = 1
    if pieces.kind == WHOLE:
        candidates = _candidates(pieces.wholes, old_lines)
        if not candidates:
            return None
        new_lines, versions = _without_bom(candidates[-1].lines), _versions(candidates)
    else:
        blocks = [_Block(_without_bom(b.search), _without_bom(b.replace), b.near) for b in pieces.blocks]
        new_lines = _apply_blocks(path, old_lines, blocks, pieces.kind)
    new_text = _finish(body, new_lines)
    new_text = bom + new_text if new_text else ""
    _refuse_elision(path, original, new_text)
    return None if new_text == original else FileEdit(path, new_text, pieces.kind, versions=versions)


def _candidates(wholes: list[_Whole], old: list[str]) -> list[_Whole]:
    """The blocks that may be a file's new content, the last of which is: those that could be
    all of it (after it, a snippet showing how to use the file is not); else the blocks under
    the file's path, however short; a block without a path must look whole ([]: no edit)."""
    complete = [whole for whole in wholes if _looks_whole(whole.lines, old)]
    return complete or [whole for whole in wholes if not whole.inferred]


def _versions(wholes: list[_Whole]) -> int:
    """How many different texts `wholes` hold (the same version written twice is one)."""
    return len({tuple(_without_bom(whole.lines)) for whole in wholes})


def _echoes_example(path: str, text: str) -> bool:
    """A new file that is EDIT_INSTRUCTIONS' example written out again (names changed or not)."""
    return path == _EXAMPLE_PATH and difflib.SequenceMatcher(None, text, _EXAMPLE_TEXT).ratio() >= RESEMBLANCE


def _split(text: str) -> list[str]:
    """A text's lines without their ends (CRLF read as LF, and CR in a file that ends its lines in CR alone)."""
    text = text.replace("\r", "\n") if _cr_only(text) else text.replace("\r\n", "\n")
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n") if text else []


def _finish(original: str | None, lines: list[str]) -> str:
    """Lines joined in the original's newline style, ending as the original ends (new files: with a newline).

    A file that mixes CRLF and LF keeps each line's own end where the line is kept or changed
    in place, and new lines take the more common end: only the edited lines differ on disk."""
    if not lines:
        return ""
    crlf = bool(original) and original.count("\r\n") * 2 > original.count("\n")
    newline = "\r" if _cr_only(original) else "\r\n" if crlf else "\n"
    final = original.endswith(newline[-1]) if original else True
    ends = [newline] * len(lines)
    if original and 0 < original.count("\r\n") < original.count("\n"):
        ends = _line_ends(original, lines, newline)
    ends[-1] = ends[-1] if final else ""
    return "".join(line + end for line, end in zip(lines, ends))


def _cr_only(text: str | None) -> bool:
    """Whether a text ends its lines in CR alone (classic Mac OS): a CR and no LF anywhere. Such a
    text is lines split at each CR, so reading it and joining it again gives back the same text."""
    return bool(text) and "\r" in text and "\n" not in text


def _line_ends(original: str, lines: list[str], newline: str) -> list[str]:
    """Each new line's end: the one of the original line it keeps or replaces one for one, else `newline`."""
    pieces = original.split("\n")
    old = [piece.removesuffix("\r") for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    old_ends = ["\r\n" if piece.endswith("\r") else "\n" for piece in pieces[:-1]] + [newline]
    ends = [newline] * len(lines)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, lines, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            ends[j1:j2] = old_ends[i1:i2]
    return ends


BOM = "\ufeff"
"""A UTF-8 byte order mark, as decoded text: kept at the start of a file that has one."""


def _without_bom(lines: list[str]) -> list[str]:
    """`lines` without a BOM at the start of the first (the file's own is put back by _build)."""
    return [lines[0].removeprefix(BOM), *lines[1:]] if lines else lines


def _looks_whole(new: list[str], old: list[str]) -> bool:
    """A block without a path replaces the file only if it could be all of it."""
    return len(old) < 10 or len(new) * 2 >= len(old)


def _apply_blocks(path: str, old: list[str], blocks: list[_Block], kind: str) -> list[str]:
    """The blocks placed together in the original, refused if two overlap, then all applied.

    A search/replace block whose SEARCH is not in the original is placed in the text the
    blocks before it produce, as Aider applies a file's blocks in order (block 2 edits the
    line block 1 renamed); the blocks after it are placed in that text too. A diff's hunks
    all describe the file as attached, so each is placed in it."""
    names = [_named(blocks, index, kind) for index in range(len(blocks))]
    text, placed = old, []
    for index, block in enumerate(blocks):
        span = _place_or_insert(path, text, block, kind, names[index])
        chained = kind == REPLACE and span is None and bool(placed)
        if chained:
            text, placed = _applied(path, text, placed, names), []
            span = _place_or_insert(path, text, block, kind, names[index])
        if span is None:
            raise EditError(_not_found(path, names[index], kind, chained=chained))
        placed.append((*span, index))
    return _applied(path, text, placed, names)


def _place_or_insert(path: str, old: list[str], block: _Block, kind: str, name: str) -> tuple[int, int, list[str]] | None:
    """_place, or the start of an empty file for a block with nothing to look for (refused in any other file)."""
    if any(line.strip() for line in block.search):
        return _place(path, old, block, name)
    if old:
        lacks = "an empty SEARCH" if kind == REPLACE else "no lines of the file around it"
        raise EditError(f"The reply's {name} for {path} has {lacks}, so where it goes is unclear; ask for the lines it changes.")
    return 0, 0, block.replace


def _applied(path: str, old: list[str], placed: list[tuple[int, int, list[str], int]], names: list[str]) -> list[str]:
    """`old` with each placed replacement in its span, refused if two spans overlap (naming both blocks)."""
    placed = sorted(placed, key=lambda span: span[0])
    for (_, stop, _, index), (next_start, _, _, next_index) in zip(placed, placed[1:]):
        if next_start < stop:
            first, second = sorted((index, next_index))
            raise EditError(f"The reply's {names[first]} and {names[second]} to {path} overlap; ask the model for one edit of those lines.")
    new = list(old)
    for start, stop, lines, _ in reversed(placed):
        new[start:stop] = lines
    return new


def _named(blocks: list[_Block], index: int, kind: str) -> str:
    """How a refusal names blocks[index], so a reply with several for one file says which to fix:
    its number among them (when there are several) and the start of what it looks for."""
    noun = "diff hunk" if kind == DIFF else "edit"
    which = f" {index + 1} of {len(blocks)}" if len(blocks) > 1 else ""
    first = next((line.strip() for line in blocks[index].search if line.strip()), "")
    if len(first) > 60:
        first = first[:59] + "…"
    return f"{noun}{which} (starting {first!r})" if first else f"{noun}{which}"


def _not_found(path: str, name: str, kind: str, *, chained: bool) -> str:
    """Why the block named `name` (see _named) was refused, and where what it looks for was looked for."""
    if kind == DIFF:
        what = f"the lines the reply's {name} changes are"
    else:
        what = f"the SEARCH text of the reply's {name} is"
    after = ", nor after the reply's edits before it" if chained else ""
    return f"In {path}, {what} not in the file as attached{after}; ask the model to copy the lines exactly."


Reindent = Callable[[list[str]], list[str]]


def _place(path: str, old: list[str], block: _Block, name: str) -> tuple[int, int, list[str]] | None:
    """Where a block's search lines are in `old`, and its replacement as it fits there (None: not there).

    The ladder: exact lines; then trailing spaces and whitespace-only lines ignored; then
    the same lines at a uniform indentation offset, re-applied to the replacement; then all
    of these again without blank lines around the search. A second match anywhere is refused,
    naming the block by `name` (see _named)."""
    search, replace = block.search, block.replace
    for trimmed in (False, True):
        if trimmed:
            search, replace = _trim_blank(block.search, block.replace)
            if search == block.search:
                break
        size = len(search)
        for same in (_exact, _loose, _offset):
            hits = []
            for start in range(len(old) - size + 1):
                reindent = same(old[start : start + size], search)
                if reindent is not None:
                    hits.append((start, reindent))
            if len(hits) > 1 and block.near is not None:
                hits = [hit for hit in hits if hit[0] == block.near - 1] or hits
            if len(hits) > 1:
                raise EditError(f"In {path}, what the reply's {name} looks for occurs {len(hits)} times; ask for an edit with more surrounding lines.")
            if hits:
                start, reindent = hits[0]
                return start, start + size, _keep_unchanged(old[start : start + size], search, replace, reindent(replace))
    return None


def _keep_unchanged(found: list[str], search: list[str], replace: list[str], placed: list[str]) -> list[str]:
    """`placed` (the replacement as it fits the file) with each line the edit leaves as its search
    had it taken from the file (`found`): a kept line keeps its exact whitespace, whatever the
    model's copy of it (trailing spaces dropped, another indentation) looked like."""
    kept = list(placed)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, search, replace, autojunk=False).get_opcodes():
        if tag == "equal":
            kept[j1:j2] = found[i1:i2]
    return kept


def _trim_blank(search: list[str], replace: list[str]) -> tuple[list[str], list[str]]:
    """Blank lines around the search dropped, and as many around the replacement where it has them."""
    lead = next((i for i, line in enumerate(search) if line.strip()), len(search))
    tail = next((i for i, line in enumerate(reversed(search)) if line.strip()), 0)
    search = search[lead : len(search) - tail]
    while lead and replace and not replace[0].strip():
        replace, lead = replace[1:], lead - 1
    while tail and replace and not replace[-1].strip():
        replace, tail = replace[:-1], tail - 1
    return search, replace


def _exact(old: list[str], search: list[str]) -> Reindent | None:
    return _unchanged if old == search else None


def _loose(old: list[str], search: list[str]) -> Reindent | None:
    return _unchanged if all(o.rstrip() == s.rstrip() for o, s in zip(old, search)) else None


def _offset(old: list[str], search: list[str]) -> Reindent | None:
    """The search lines indented by one constant amount more or less than the file's."""
    shift: tuple[bool, str] | None = None
    for o, s in zip(old, search):
        if not o.strip() and not s.strip():
            continue
        o_body, s_body = o.lstrip(), s.lstrip()
        if o_body.rstrip() != s_body.rstrip():
            return None
        o_lead, s_lead = o[: len(o) - len(o_body)], s[: len(s) - len(s_body)]
        if o_lead.endswith(s_lead):
            here = (True, o_lead[: len(o_lead) - len(s_lead)])
        elif s_lead.endswith(o_lead):
            here = (False, s_lead[: len(s_lead) - len(o_lead)])
        else:
            return None
        if shift is None:
            shift = here
        elif shift != here:
            return None
    if shift is None or not shift[1]:
        return None
    add, delta = shift
    if add:
        return lambda lines: [delta + line if line.strip() else line for line in lines]
    return lambda lines: [line[len(delta) :] if line.startswith(delta) else line.lstrip() for line in lines]


def _unchanged(lines: list[str]) -> list[str]:
    return lines


# ---------------------------------------------------------------------------
# Elisions: "# ... rest of the code unchanged" where lines should be


_ELISION_WORDS = re.compile(
    r"rest of (the )?(code|file|class|function|functions|methods|implementation|content|module)|"
    r"existing (code|implementation|methods|functions|content)|"
    r"(code|rest|everything else|remaining \w+|other \w+) (remains?|stays?|is|are)?\s*(unchanged|the same)|"
    r"unchanged (code|lines|parts?|content)|same as (before|above|the original)|previous (code|implementation)|"
    r"for brevity|(code|lines|content) omitted|keep (the )?existing",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"^\s*(?:#|//|--|;|/\*|\*|<!--|%|')\s*(.*?)\s*(?:\*/|-->)?\s*$")
_ELLIPSIS = ("...", "…")


def _refuse_elision(path: str, original: str, new_text: str) -> None:
    """Refuse a new text with a placeholder where the model left lines out (unless the original has that line)."""
    before = {line.strip() for line in _split(original)}
    python = language_for(path) == "python"
    for line in _split(new_text):
        if line.strip() not in before and _elided(line, python):
            raise EditError(
                f"The reply's version of {path} leaves lines out ({line.strip()!r}); ask the model for the complete file."
            )


def _elided(line: str, python: bool) -> bool:
    text = line.strip().strip("[](){}").strip()
    if text in _ELLIPSIS:
        return not python  # a bare `...` is Python code (a stub body)
    comment = _COMMENT.match(line)
    if comment:
        text = comment.group(1)
    elif not text.startswith(_ELLIPSIS):
        return False
    return text.startswith(_ELLIPSIS) or bool(_ELISION_WORDS.search(text))
