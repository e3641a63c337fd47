"""edgespec.workspace: the project folder, replies into edits, atomic apply and undo (tmp_path only, fast)."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import pytest

from edgespec.errors import (
    EditError,
    FileAccessError,
    FileTooLargeError,
    NotTextError,
    OutsideRootError,
    StaleFileError,
    WriteError,
)
from edgespec.workspace import (
    EDIT_INSTRUCTIONS,
    MAX_FILE_BYTES,
    Applied,
    FileEdit,
    Workspace,
    apply_edit,
    fence_for,
    language_for,
    parse_edits,
    undo,
    unified_diff,
)
from edgespec.workspace import apply as apply_module
from edgespec.workspace.apply import apply_all


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    return root


# ---------------------------------------------------------------------------
# root.py


def test_paths_outside_the_root_are_refused(project, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("no\n")
    (project / "link.txt").symlink_to(outside)
    (project / "linkdir").symlink_to(tmp_path)
    ws = Workspace(project)
    for path in ("../secret.txt", str(outside), "link.txt", "linkdir/secret.txt", "src/../../secret.txt"):
        with pytest.raises(OutsideRootError):
            ws.read(path)
    assert ws.resolve("src/../src/main.py") == project.resolve() / "src" / "main.py"
    assert ws.relative(project / "src" / "main.py") == "src/main.py"


def test_a_root_that_is_not_a_folder_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileAccessError):
        Workspace(tmp_path / "file")
    with pytest.raises(FileAccessError):
        Workspace(tmp_path / "missing")


def test_read_keeps_the_text_exactly(project):
    data = "a\r\nb\r\nno final newline \u00e9".encode()
    (project / "crlf.txt").write_bytes(data)
    got = Workspace(project).read("crlf.txt")
    assert got.text.encode() == data
    assert (got.path, got.sha256, got.size) == ("crlf.txt", sha(data), len(data))


def test_a_fifo_is_refused_without_blocking(project):
    os.mkfifo(project / "pipe")
    ws = Workspace(project)
    with pytest.raises(FileAccessError):
        ws.read("pipe")
    with pytest.raises(FileAccessError):
        ws.sha256_of("pipe")
    with pytest.raises(FileAccessError):
        ws.read("src")


def test_binary_and_invalid_utf8_are_not_text(project):
    (project / "bin").write_bytes(b"abc\0def")
    (project / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    ws = Workspace(project)
    for name in ("bin", "latin1.txt"):
        with pytest.raises(NotTextError):
            ws.read(name)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_text_is_named_as_such_not_called_binary(project, encoding):
    """Notepad's "Unicode" and PowerShell's `>` write UTF-16 with a BOM: its NUL bytes do not
    make it a binary file, and the user is told which encoding to convert from."""
    data = "caf\u00e9\n".encode(encoding)
    (project / "notes.txt").write_bytes(data if data[:2] in (b"\xff\xfe", b"\xfe\xff") else b"\xfe\xff" + data)
    with pytest.raises(NotTextError, match=f"notes.txt is {encoding[:6].upper()} text; convert it to UTF-8"):
        Workspace(project).read("notes.txt")


def test_a_large_file_is_refused_before_reading(project):
    with open(project / "big.txt", "wb") as handle:
        handle.truncate(50 * 1024 * 1024)  # sparse: reading it all would be slow
    started = time.perf_counter()
    with pytest.raises(FileTooLargeError):
        Workspace(project).read("big.txt")
    assert time.perf_counter() - started < 1.0
    (project / "limit.txt").write_bytes(b"x" * MAX_FILE_BYTES)
    assert Workspace(project).read("limit.txt").size == MAX_FILE_BYTES


def test_a_file_just_over_the_limit_is_said_to_be_over_it(project):
    """Rounded to the nearest KiB, a file a few bytes over was "512 KiB, over the 512 KiB limit"."""
    (project / "just.txt").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(FileTooLargeError, match=f"is {MAX_FILE_BYTES // 1024 + 1} KiB, over the {MAX_FILE_BYTES // 1024} KiB"):
        Workspace(project).read("just.txt")


def test_sha256_of(project):
    ws = Workspace(project)
    assert ws.sha256_of("src/main.py") == sha(b"print('hi')\n")
    assert ws.sha256_of("src/missing.py") is None


def test_completion(project, tmp_path):
    (project / "src" / "model.py").write_text("")
    (project / "src" / "sub").mkdir()
    (project / ".git").mkdir()
    (project / ".github").mkdir()
    (project / "node_modules").mkdir()
    (project / "notes.md").write_text("")
    (project / "out").symlink_to(tmp_path)
    ws = Workspace(project)
    assert ws.complete("") == ["notes.md", "src/"]
    assert ws.complete("src/m") == ["src/main.py", "src/model.py"]
    assert ws.complete("src/") == ["src/main.py", "src/model.py", "src/sub/"]
    assert ws.complete(".") == [".github/"]
    assert ws.complete(".git") == [".git/", ".github/"]
    assert ws.complete("node_modules") == ["node_modules/"]
    assert ws.complete("n") == ["notes.md"]
    assert ws.complete("src/", limit=1) == ["src/main.py"]
    assert ws.complete("../") == []
    assert ws.complete("out/") == []
    assert ws.complete("nothing/") == []


def test_language_and_fence():
    assert [language_for(p) for p in ("a.py", "b.rs", "c.h", "d.md", "e.yml", "f.sh", "g.txt", "Makefile", "x")] == [
        "python", "rust", "c", "markdown", "yaml", "bash", "", "makefile", "",
    ]
    assert fence_for("no fences") == "```"
    assert fence_for("x\n```python\ny\n```\n") == "````"
    assert fence_for("  `````\n") == "``````"


# ---------------------------------------------------------------------------
# edits.py

MAIN = "import sys\n\n\ndef greet(name):\n    print(f'Hello {name}')\n\n\nif __name__ == '__main__':\n    greet(sys.argv[1])\n"
NEW_MAIN = MAIN.replace("Hello", "Hey")


@pytest.mark.parametrize("path_line", ["src/main.py", "`src/main.py`", "**src/main.py**", "### src/main.py", "File: `src/main.py`", "main.py"])
def test_whole_file_under_a_path_line(path_line):
    reply = f"Here is the change.\n\n{path_line}\n```python\n{NEW_MAIN}```\n\nDone."
    assert parse_edits(reply, {"src/main.py": MAIN}) == [FileEdit("src/main.py", NEW_MAIN, "whole")]


def test_whole_file_named_in_the_fence_info():
    for info in ("python src/main.py", "src/main.py", "python:src/main.py"):
        reply = f"```{info}\n{NEW_MAIN}```\n"
        assert parse_edits(reply, {"src/main.py": MAIN, "other.py": ""}) == [FileEdit("src/main.py", NEW_MAIN, "whole")]


def test_whole_file_named_by_a_first_line_comment():
    reply = f"```python\n# src/main.py\n{NEW_MAIN}```\n"
    assert parse_edits(reply, {"src/main.py": MAIN, "b.py": ""}) == [FileEdit("src/main.py", NEW_MAIN, "whole")]


def test_one_attached_file_and_one_pathless_block():
    files = {"main.py": MAIN}
    assert parse_edits(f"Sure:\n```python\n{NEW_MAIN}```\n", files) == [FileEdit("main.py", NEW_MAIN, "whole")]
    # a snippet much shorter than a 10+ line file is an example, not the file
    long = "".join(f"x{i} = {i}\n" for i in range(20))
    assert parse_edits("Use this:\n```python\nx1 = 2\n```\n", {"main.py": long}) == []
    # two blocks, or another language: no guess
    assert parse_edits(f"```python\n{NEW_MAIN}```\n```python\n{NEW_MAIN}```\n", files) == []
    assert parse_edits("Run it:\n```bash\npython main.py\n```\n", files) == []


def test_prose_naming_the_file_in_backticks():
    reply = f"Here is the updated `src/main.py`:\n\n```python\n{NEW_MAIN}```\n"
    assert parse_edits(reply, {"src/main.py": MAIN, "b.py": ""}) == [FileEdit("src/main.py", NEW_MAIN, "whole")]
    assert parse_edits("Run `src/main.py` with:\n```bash\npython src/main.py\n```\n", {"src/main.py": MAIN, "b.py": ""}) == []


def test_diff_with_wrong_line_numbers():
    reply = (
        "```diff\n--- a/src/main.py\n+++ b/src/main.py\n@@ -40,3 +40,3 @@\n"
        " def greet(name):\n-    print(f'Hello {name}')\n+    print(f'Hey {name}')\n \n```\n"
    )
    assert parse_edits(reply, {"src/main.py": MAIN}) == [FileEdit("src/main.py", NEW_MAIN, "diff")]


def test_diff_whose_context_is_missing_is_refused():
    reply = "```diff\n--- a/main.py\n+++ b/main.py\n@@ -1 +1 @@\n-print('bye')\n+print('x')\n```\n"
    with pytest.raises(EditError, match=r"the lines the reply's diff hunk \(starting \"print\('bye'\)\"\) changes are not in the file"):
        parse_edits(reply, {"main.py": MAIN})


def test_search_replace_with_an_indentation_offset():
    # the model dropped the class's indentation: found one level in, the replacement re-indented
    original = "class A:\n    def greet(self):\n        print('Hello')\n\n    def other(self):\n        pass\n"
    reply = (
        "a.py\n```python\n<<<<<<< SEARCH\ndef greet(self):\n    print('Hello')\n=======\n"
        "def greet(self):\n    print('Hey')\n\n    print('bye')\n>>>>>>> REPLACE\n```\n"
    )
    expected = "class A:\n    def greet(self):\n        print('Hey')\n\n        print('bye')\n\n    def other(self):\n        pass\n"
    assert parse_edits(reply, {"a.py": original}) == [FileEdit("a.py", expected, "replace")]


def test_search_replace_blocks_all_apply_or_none():
    files = {"a.py": "x = 1\ny = 2\nz = 3\n"}
    two = "a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 10\n>>>>>>> REPLACE\n\n<<<<<<< SEARCH\nz = 3\n=======\nz = 30\n>>>>>>> REPLACE\n"
    assert parse_edits(two, files) == [FileEdit("a.py", "x = 10\ny = 2\nz = 30\n", "replace")]
    missing = two.replace("z = 3\n=", "w = 3\n=")
    with pytest.raises(EditError):
        parse_edits(missing, files)


def _blocks(path: str, *pairs: tuple[str, str]) -> str:
    return path + "\n" + "".join(f"<<<<<<< SEARCH\n{s}=======\n{r}>>>>>>> REPLACE\n\n" for s, r in pairs)


def test_ambiguous_search_is_refused():
    reply = "a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n"
    with pytest.raises(EditError, match=r"In a\.py, what the reply's edit \(starting 'x = 1'\) looks for occurs 2 times;"):
        parse_edits(reply, {"a.py": "x = 1\nx = 1\n"})


def test_an_ambiguous_block_among_several_is_named():
    """With several blocks for one file, the refusal says which one to fix, as for a block found nowhere."""
    reply = _blocks("a.py", ("y = 2\n", "y = 20\n"), ("x = 1\n", "x = 10\n"), ("z = 3\n", "z = 30\n"))
    with pytest.raises(EditError, match=r"the reply's edit 2 of 3 \(starting 'x = 1'\) looks for occurs 2 times"):
        parse_edits(reply, {"a.py": "x = 1\ny = 2\nx = 1\nz = 3\n"})


def test_a_block_with_nothing_to_look_for_in_a_file_with_text_is_refused_naming_it():
    """An empty SEARCH (or a diff hunk that only adds) can only go into an empty file:
    elsewhere where it goes is unclear, and the refusal says which block it is."""
    reply = _blocks("a.py", ("x = 1\n", "x = 10\n"), ("", "y = 2\n"))
    with pytest.raises(EditError, match=r"^The reply's edit 2 of 2 for a\.py has an empty SEARCH, so where it goes is "
                                        r"unclear; ask for the lines it changes\.$"):
        parse_edits(reply, {"a.py": "x = 1\n"})
    hunk = "```diff\n--- a/a.py\n+++ b/a.py\n@@ -0,0 +1 @@\n+y = 2\n```\n"
    with pytest.raises(EditError, match=r"^The reply's diff hunk for a\.py has no lines of the file around it, so where it "
                                        r"goes is unclear"):
        parse_edits(hunk, {"a.py": "x = 1\n"})
    assert parse_edits(_blocks("a.py", ("", "y = 2\n")), {"a.py": ""}) == [FileEdit("a.py", "y = 2\n", "replace")]


def test_overlapping_blocks_are_refused_naming_both_in_reply_order():
    files = {"a.py": "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"}
    # edit 4 starts above edit 2 in the file; the refusal names them as the reply numbers them
    reply = _blocks(
        "a.py",
        ("a = 1\n", "a = 10\n"),
        ("c = 3\nd = 4\n", "cd = 34\n"),
        ("e = 5\n", "e = 50\n"),
        ("b = 2\nc = 3\n", "bc = 23\n"),
    )
    named = r"The reply's edit 2 of 4 \(starting 'c = 3'\) and edit 4 of 4 \(starting 'b = 2'\) to a\.py overlap;"
    with pytest.raises(EditError, match=named):
        parse_edits(reply, files)


def test_a_block_that_edits_what_an_earlier_block_wrote_applies_after_it():
    """Aider applies a file's blocks in order: block 2 finds the line block 1 renamed (absent
    from the file as attached), and a block after it that matches the original applies too."""
    original = "def old(x):\n    return x\n\n\nprint(old(1))\n"
    reply = _blocks(
        "a.py",
        ("def old(x):\n", "def new(x):\n"),
        ("def new(x):\n    return x\n", "def new(x):\n    return x + 1\n"),
        ("print(old(1))\n", "print(new(1))\n"),
    )
    expected = "def new(x):\n    return x + 1\n\n\nprint(new(1))\n"
    assert parse_edits(reply, {"a.py": original}) == [FileEdit("a.py", expected, "replace")]


def test_a_chained_block_keeps_the_rules_of_any_other():
    files = {"a.py": "x = 1\ny = 2\nz = 3\n"}
    # its search text in none of the texts: refused, naming the block and its first line
    missing = _blocks("a.py", ("x = 1\n", "x = 10\n"), ("w = 3\nq = 4\n", "w = 30\n"))
    with pytest.raises(EditError, match=r"edit 2 of 2 \(starting 'w = 3'\) is not in the file as attached, nor after"):
        parse_edits(missing, files)
    # twice in the text the block before it wrote: refused as ambiguous
    twice = _blocks("a.py", ("x = 1\n", "x = 10\nx = 10\n"), ("x = 10\n", "x = 11\n"))
    with pytest.raises(EditError, match=r"edit 2 of 2 \(starting 'x = 10'\) looks for occurs 2 times"):
        parse_edits(twice, files)
    # the same insertion twice matches the original twice over: refused, not inserted twice
    again = _blocks("a.py", ("y = 2\n", "import os\ny = 2\n"), ("y = 2\n", "import os\ny = 2\n"))
    with pytest.raises(EditError, match=r"edit 1 of 2 \(starting 'y = 2'\) and edit 2 of 2 \(starting 'y = 2'\) to a\.py overlap"):
        parse_edits(again, files)


@pytest.mark.parametrize("placeholder", ["    # ... existing code ...", "# rest of the code unchanged", "// ...", "... rest unchanged"])
def test_an_elided_whole_file_is_refused(placeholder):
    reply = f"main.py\n```python\nimport sys\n{placeholder}\n```\n"
    with pytest.raises(EditError):
        parse_edits(reply, {"main.py": MAIN})


def test_a_placeholder_already_in_the_file_is_not_an_elision():
    original = "class P:\n    def f(self): ...\n    # ... existing code ...\n"
    new = original + "x = 1\n"
    assert parse_edits(f"p.py\n```python\n{new}```\n", {"p.py": original}) == [FileEdit("p.py", new, "whole")]


def test_crlf_and_a_missing_final_newline_are_kept():
    original = "a = 1\r\nb = 2"
    reply = "x.py\n```python\na = 1\nb = 3\n```\n"
    assert parse_edits(reply, {"x.py": original}) == [FileEdit("x.py", "a = 1\r\nb = 3", "whole")]
    replace = "x.py\n<<<<<<< SEARCH\nb = 2\n=======\nb = 4\n>>>>>>> REPLACE\n"
    assert parse_edits(replace, {"x.py": original}) == [FileEdit("x.py", "a = 1\r\nb = 4", "replace")]


def test_a_new_path_is_flagged_not_refused():
    reply = "src/util.py\n```python\ndef helper():\n    return 1\n```\n"
    assert parse_edits(reply, {"src/main.py": MAIN}) == [
        FileEdit("src/util.py", "def helper():\n    return 1\n", "whole", new=True)
    ]
    diff = "```diff\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n```\n"
    assert parse_edits(diff, {}) == [FileEdit("new.txt", "one\ntwo\n", "whole", new=True)]


def test_editing_an_unattached_file_by_search_is_refused():
    reply = "other.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n"
    with pytest.raises(EditError):
        parse_edits(reply, {"main.py": MAIN})


def test_a_reply_cut_short_inside_a_file_is_refused():
    with pytest.raises(EditError):
        parse_edits("main.py\n```python\nimport sys\n", {"main.py": MAIN})


def test_no_edits_in_plain_prose():
    assert parse_edits("The function greets the user by name.", {"main.py": MAIN}) == []
    assert parse_edits(f"main.py\n```python\n{MAIN}```\n", {"main.py": MAIN}) == []  # unchanged


def test_unified_diff():
    diff = unified_diff("a.py", "x\ny\n", "x\nz\n")
    assert diff.splitlines() == ["--- a/a.py", "+++ b/a.py", "@@ -1,2 +1,2 @@", " x", "-y", "+z"]
    assert unified_diff("a.py", "x\n", "x\n") == ""
    # the diff we show parses back into the same edit
    assert parse_edits(f"```diff\n{unified_diff('m.py', MAIN, NEW_MAIN)}```\n", {"m.py": MAIN}) == [
        FileEdit("m.py", NEW_MAIN, "diff")
    ]


def test_the_instructions_example_is_the_whole_format_and_an_echo_of_it_is_no_edit():
    example = EDIT_INSTRUCTIONS.split("like this:\n\n", 1)[1].split("\nRules:", 1)[0]
    assert example.startswith("shapes.py\n```python\ndef area(width, height):\n")
    assert parse_edits(example, {}) == []
    # the bundled coder wrote it out again, names shortened, beside the file it was asked to change
    echo = "shapes.py\n```python\ndef area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n```\n"
    assert parse_edits(echo, {"main.py": MAIN}) == []
    other = "shapes.py\n```python\nclass Circle:\n    radius: float\n```\n"
    assert [e.path for e in parse_edits(other, {})] == ["shapes.py"]


# ---------------------------------------------------------------------------
# apply.py


@pytest.fixture
def backups(tmp_path) -> Path:
    return tmp_path / "home" / "data" / "undo"


def test_apply_and_undo_restore_the_bytes_exactly(project, backups):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = b"print('hi')\r\n"
    target.write_bytes(before)
    target.chmod(0o640)
    edit = FileEdit("src/main.py", "print('bye')\r\n", "whole")
    applied = apply_edit(ws, edit, base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == b"print('bye')\r\n"
    assert (target.stat().st_mode & 0o777) == 0o640
    assert applied == Applied("src/main.py", before, sha(b"print('bye')\r\n"), backups / sha(before))
    assert applied.backup.read_bytes() == before
    undo(ws, Applied.from_backup(applied.path, applied.after_sha256, applied.backup))
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["main.py"]


def test_a_read_only_file_is_not_written_over(project, backups):
    """A file whose mode lets no one write it was replaced all the same (a rename needs
    only the folder's permission, and root may write anything): its owner meant it kept."""
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = b"print('hi')\n"
    target.write_bytes(before)
    target.chmod(0o444)
    edit = FileEdit("src/main.py", "print('bye')\n", "whole")
    with pytest.raises(WriteError, match="read-only"):
        apply_edit(ws, edit, base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == before and (target.stat().st_mode & 0o777) == 0o444
    assert [p.name for p in target.parent.iterdir()] == ["main.py"]


def test_a_new_file_needs_allow_new_and_undo_deletes_it(project, backups):
    ws = Workspace(project)
    edit = FileEdit("src/pkg/new.py", "x = 1\n", "whole", new=True)
    with pytest.raises(EditError):
        apply_edit(ws, edit, base_sha256=None, backups=backups)
    applied = apply_edit(ws, edit, base_sha256=None, allow_new=True, backups=backups)
    assert (project / "src" / "pkg" / "new.py").read_text() == "x = 1\n"
    assert (applied.before, applied.backup) == (None, None)
    with pytest.raises(StaleFileError):
        apply_edit(ws, edit, base_sha256=None, allow_new=True, backups=backups)
    undo(ws, applied)
    assert not (project / "src" / "pkg" / "new.py").exists()


def test_a_stale_file_is_refused(project, backups):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    base = sha(target.read_bytes())
    target.write_text("print('changed')\n")
    edit = FileEdit("src/main.py", "print('bye')\n", "whole")
    with pytest.raises(StaleFileError):
        apply_edit(ws, edit, base_sha256=base, backups=backups)
    assert target.read_text() == "print('changed')\n"
    target.unlink()
    with pytest.raises(StaleFileError):
        apply_edit(ws, edit, base_sha256=base, backups=backups)


def test_undo_refuses_when_the_file_changed_since(project, backups):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    applied = apply_edit(ws, FileEdit("src/main.py", "a\n", "whole"), base_sha256=sha(target.read_bytes()), backups=backups)
    target.write_text("edited by hand\n")
    with pytest.raises(StaleFileError):
        undo(ws, applied)
    assert target.read_text() == "edited by hand\n"


def test_apply_outside_the_root_is_refused(project, backups):
    with pytest.raises(OutsideRootError):
        apply_edit(Workspace(project), FileEdit("../x.py", "x\n", "whole", new=True), base_sha256=None, allow_new=True, backups=backups)
    assert not (project.parent / "x.py").exists()


def _failing(real, error):
    """A stand-in for `real` that fails the way a full disk or a read-only folder does, for main.py's temp file only."""

    def call(*args, **kwargs):
        if any(".main.py." in str(arg) and apply_module.TEMP_SUFFIX in str(arg) for arg in args):
            raise error
        return real(*args, **kwargs)

    return call


@pytest.mark.parametrize("name", ["replace", "open"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_failed_write_leaves_the_file_and_no_temp(project, backups, monkeypatch, name, code):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = target.read_bytes()
    monkeypatch.setattr(os, name, _failing(getattr(os, name), OSError(code, os.strerror(code))))
    with pytest.raises(WriteError):
        apply_edit(ws, FileEdit("src/main.py", "print('bye')\n", "whole"), base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["main.py"]


def test_a_full_disk_for_the_undo_copy_names_the_file_and_writes_nothing(project, backups, monkeypatch):
    """The copy undo needs is written first: when the disk is full there, the message says
    whose copy it is and that nothing was written (not a hash-named path "left as it was")."""
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = target.read_bytes()
    real_open = os.open

    def full_under_backups(path, *args, **kwargs):
        if Path(path).parent == backups:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_under_backups)
    with pytest.raises(WriteError) as caught:
        apply_edit(ws, FileEdit("src/main.py", "print('bye')\n", "whole"), base_sha256=sha(before), backups=backups)
    assert str(caught.value) == (f"The copy of src/main.py that undo needs could not be saved in {backups} (the disk is "
                                 f"full; free some space); nothing was written.")
    assert target.read_bytes() == before
    assert list(backups.iterdir()) == []


def _two_files(project):
    """src/a.py, then src/main.py: the edits of a reply that changes both, and their bytes before."""
    (project / "src" / "a.py").write_text("a = 1\n")
    before = {name: (project / "src" / name).read_bytes() for name in ("a.py", "main.py")}
    edits = [(FileEdit("src/a.py", "a = 2\n", "whole"), sha(before["a.py"])),
             (FileEdit("src/main.py", "print('bye')\n", "whole"), sha(before["main.py"]))]
    return edits, before


def test_a_read_only_second_file_writes_neither(project, backups):
    """Everything that can be checked is checked for every file before any is written."""
    edits, before = _two_files(project)
    (project / "src" / "main.py").chmod(0o444)
    with pytest.raises(WriteError, match="src/main.py is read-only.*Nothing was written"):
        apply_all(Workspace(project), edits, backups=backups)
    assert {name: (project / "src" / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in (project / "src").iterdir()) == ["a.py", "main.py"]


def test_a_new_file_in_a_folder_that_cannot_be_made_writes_nothing(project, backups):
    edits, before = _two_files(project)
    (project / "src" / "pkg").write_text("a file where the folder would be\n")
    edits.append((FileEdit("src/pkg/new.py", "x = 1\n", "whole", new=True), None))
    with pytest.raises(FileAccessError, match="src/pkg/new.py"):
        apply_all(Workspace(project), edits, allow_new=True, backups=backups)
    assert {name: (project / "src" / name).read_bytes() for name in before} == before


def test_a_second_write_that_fails_puts_the_first_back(project, backups, monkeypatch):
    """A write that fails midway (a full disk) undoes the files this apply already wrote."""
    edits, before = _two_files(project)
    monkeypatch.setattr(os, "replace", _failing(os.replace, OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(WriteError) as caught:
        apply_all(Workspace(project), edits, backups=backups)
    message = str(caught.value)
    assert "src/main.py could not be written (the disk is full" in message
    assert "src/a.py was put back; nothing was changed" in message
    assert caught.value.left_changed == ()
    assert {name: (project / "src" / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in (project / "src").iterdir()) == ["a.py", "main.py"]


def test_a_file_that_cannot_be_put_back_is_named_with_its_saved_copy(project, backups, monkeypatch):
    edits, before = _two_files(project)
    real = os.replace
    calls = {"a.py": 0}

    def replace(source, target):
        if ".main.py." in str(source):
            raise OSError(errno.ENOSPC, "No space left on device")
        if ".a.py." in str(source):
            calls["a.py"] += 1
            if calls["a.py"] > 1:  # the write goes through, putting it back does not
                raise OSError(errno.EACCES, "Permission denied")
        return real(source, target)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(WriteError) as caught:
        apply_all(Workspace(project), edits, backups=backups)
    message = str(caught.value)
    assert "nothing was changed" not in message.lower() and "nothing was written" not in message.lower()
    assert "src/a.py" in message and str(backups / sha(before["a.py"])) in message
    assert caught.value.left_changed == ("src/a.py",)
    assert (project / "src" / "a.py").read_text() == "a = 2\n"
    assert (backups / sha(before["a.py"])).read_bytes() == before["a.py"]
    assert (project / "src" / "main.py").read_bytes() == before["main.py"]


def test_ctrl_c_mid_write_leaves_the_old_bytes_and_no_temp(project, backups, monkeypatch):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = target.read_bytes()

    real_fsync = os.fsync

    def interrupted(fd):
        if "main.py" in os.readlink(f"/proc/self/fd/{fd}"):  # the temp file of main.py, not the backup
            raise KeyboardInterrupt
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        apply_edit(ws, FileEdit("src/main.py", "print('bye')\n", "whole"), base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["main.py"]


def test_search_replace_blocks_after_the_first_keep_its_path():
    files = {"a.py": "x = 1\ny = 2\n", "b.py": "y = 2\n"}
    reply = (
        "a.py\n```python\n<<<<<<< SEARCH\nx = 1\n=======\nx = 10\n>>>>>>> REPLACE\n```\n\nAnd then:\n\n"
        "```python\n<<<<<<< SEARCH\ny = 2\n=======\ny = 20\n>>>>>>> REPLACE\n```\n"
    )
    assert parse_edits(reply, files) == [FileEdit("a.py", "x = 10\ny = 20\n", "replace")]


def test_an_attached_file_under_a_made_up_name_is_that_file():
    # Qwen2.5-Coder 1.5B, asked to change util.py beside greet.py, named its whole new util.py "mean.py"
    util = "def clamp(value, low, high):\n    return max(low, min(high, value))\n\n\ndef mean(values):\n    return sum(values) / len(values)\n"
    new = util.replace("def mean(values):\n", "def mean(values):\n    if not values:\n        return 0.0\n")
    files = {"greet.py": MAIN, "util.py": util}
    assert parse_edits(f"mean.py\n```python\n{new}```\n", files) == [FileEdit("util.py", new, "whole")]
    test_file = "from util import mean\n\n\ndef test_mean():\n    assert mean([]) == 0.0\n"
    assert parse_edits(f"tests/test_util.py\n```python\n{test_file}```\n", files) == [
        FileEdit("tests/test_util.py", test_file, "whole", new=True)
    ]


def test_a_pathless_block_goes_to_the_attached_file_it_resembles():
    other = "".join(f"value_{i} = {i}\n" for i in range(12))
    files = {"main.py": MAIN, "values.py": other}
    assert parse_edits(f"Here you go:\n```python\n{NEW_MAIN}```\n", files) == [FileEdit("main.py", NEW_MAIN, "whole")]
    assert parse_edits("Here you go:\n```python\nimport os\n```\n", files) == []


def test_a_repeated_hunk_context_is_placed_by_its_line_number():
    original = "a\nx\nb\na\nx\nb\n"
    hunk = "```diff\n--- a/f.txt\n+++ b/f.txt\n@@ -4,3 +4,3 @@\n a\n-x\n+y\n b\n```\n"
    assert parse_edits(hunk, {"f.txt": original}) == [FileEdit("f.txt", "a\nx\nb\na\ny\nb\n", "diff")]
    with pytest.raises(EditError):
        parse_edits(hunk.replace("@@ -4,3 +4,3 @@", "@@ -9,3 +9,3 @@"), {"f.txt": original})


def test_two_forms_for_one_file_and_a_deletion_are_refused():
    mixed = f"main.py\n```python\n{NEW_MAIN}```\n\nmain.py\n<<<<<<< SEARCH\nimport sys\n=======\nimport os\n>>>>>>> REPLACE\n"
    with pytest.raises(EditError):
        parse_edits(mixed, {"main.py": MAIN})
    deletion = "```diff\n--- a/main.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-import sys\n```\n"
    with pytest.raises(EditError):
        parse_edits(deletion, {"main.py": MAIN})


def test_unified_diff_marks_a_missing_final_newline():
    diff = unified_diff("a.txt", "x\ny", "x\nz")
    assert diff.endswith("-y\n\\ No newline at end of file\n+z\n\\ No newline at end of file\n")


def test_unified_diff_shows_the_lines_of_a_file_ending_them_in_cr_alone():
    """A classic Mac OS file (no LF at all) is seen line by line, as the model reads it."""
    old, new = "x\ry\rz\r", "x\rY\rz\r"
    diff = unified_diff("a.txt", old, new)
    assert diff.split("\n") == ["--- a/a.txt", "+++ b/a.txt", "@@ -1,3 +1,3 @@", " x", "-y", "+Y", " z", ""]
    assert parse_edits(f"```diff\n{diff}```\n", {"a.txt": old}) == [FileEdit("a.txt", new, "diff")]


def test_an_edit_over_the_size_limit_is_not_written(project, backups):
    ws = Workspace(project)
    target = project / "src" / "main.py"
    before = target.read_bytes()
    with pytest.raises(FileTooLargeError):
        apply_edit(ws, FileEdit("src/main.py", "x" * (MAX_FILE_BYTES + 1), "whole"), base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == before


def test_a_second_block_under_a_new_name_is_a_new_file_not_the_attached_one():
    """The bundled coder's habit: the renamed file under its path, then an invented file
    that resembles it; the attached file keeps the block named for it."""
    from edgespec.workspace.edits import parse_edits

    old = "def area(w, h):\n    return w * h\n\n\ndef describe(w, h):\n    return area(w, h)\n"
    renamed = old.replace("area", "rectangle_area")
    invented = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    reply = f"geometry.py\n```python\n{renamed}```\n\nplanes.py\n```python\n{invented}```\n"
    edits = parse_edits(reply, {"geometry.py": old})
    assert [(e.path, e.new, e.new_text) for e in edits] == [("geometry.py", False, renamed),
                                                           ("planes.py", True, invented)]
    # under the instructions example's own name it is that example written out again: no edit
    echoed = parse_edits(reply.replace("planes.py", "shapes.py"), {"geometry.py": old})
    assert [(e.path, e.new_text) for e in echoed] == [("geometry.py", renamed)]


# ---------------------------------------------------------------------------
# A user's file keeps its shape: only the line the reply changes differs on disk

FILE_SHAPES = {  # the bytes before, and after a reply changes "a = 1" into "a = 9"
    "lf": (b"a = 1\nb = 2\n", b"a = 9\nb = 2\n"),
    "crlf": (b"a = 1\r\nb = 2\r\n", b"a = 9\r\nb = 2\r\n"),
    "mixed crlf and lf": (b"x = 0\na = 1\r\nb = 2\nc = 3\n", b"x = 0\na = 9\r\nb = 2\nc = 3\n"),
    "cr only (classic mac os)": (b"a = 1\rb = 2\r", b"a = 9\rb = 2\r"),
    "no final newline": (b"a = 1\nb = 2", b"a = 9\nb = 2"),
    "utf-8 bom": (b"\xef\xbb\xbfa = 1\nb = 2\n", b"\xef\xbb\xbfa = 9\nb = 2\n"),
    "bom and crlf": (b"\xef\xbb\xbfa = 1\r\nb = 2\r\n", b"\xef\xbb\xbfa = 9\r\nb = 2\r\n"),
    "tabs": (b"a = 1\n\tb = 2\n", b"a = 9\n\tb = 2\n"),
    "trailing spaces": (b"a = 1\nb = 2  \n\t\n", b"a = 9\nb = 2  \n\t\n"),
    "one long line": (b"a = 1" + b" + 1" * 20_000, b"a = 9" + b" + 1" * 20_000),
}


def _reply(form: str, data: bytes) -> str:
    """A reply changing "a = 1" into "a = 9" as a model writes it: LF lines, no BOM; the
    whole form copies every line, the others give their context without trailing spaces."""
    text = data.decode("utf-8").removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.removesuffix("\n").split("\n")
    index = next(i for i, line in enumerate(lines) if line.startswith("a = 1"))
    new = [*lines[:index], lines[index].replace("a = 1", "a = 9", 1), *lines[index + 1 :]]
    if form == "whole":
        return "x.py\n```python\n" + "\n".join(new) + "\n```\n"
    old_part, new_part = [line.rstrip() for line in lines], [line.rstrip() for line in new]
    if form == "replace":
        return "x.py\n<<<<<<< SEARCH\n" + "\n".join(old_part) + "\n=======\n" + "\n".join(new_part) + "\n>>>>>>> REPLACE\n"
    hunk = [f" {line}" for line in old_part[:index]] + [f"-{old_part[index]}", f"+{new_part[index]}"]
    hunk += [f" {line}" for line in old_part[index + 1 :]]
    return "```diff\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n" + "\n".join(hunk) + "\n```\n"


@pytest.mark.parametrize("form", ["whole", "replace", "diff"])
@pytest.mark.parametrize("shape", FILE_SHAPES)
def test_apply_changes_only_the_edited_line(tmp_path, backups, shape, form):
    """After apply, a git diff shows the model's change alone: the file's line ends (each
    line's own, in a mixed file), BOM, final newline, trailing spaces and mode are kept,
    and undo gives back the exact bytes."""
    before, after = FILE_SHAPES[shape]
    target = tmp_path / "x.py"
    target.write_bytes(before)
    target.chmod(0o751)
    ws = Workspace(tmp_path)
    (edit,) = parse_edits(_reply(form, before), {"x.py": ws.read("x.py").text})
    applied = apply_edit(ws, edit, base_sha256=sha(before), backups=backups)
    assert target.read_bytes() == after
    assert target.stat().st_mode & 0o777 == 0o751
    undo(ws, applied)
    assert target.read_bytes() == before


def test_unified_diff_ends_lines_at_newlines_only():
    """A form feed (in C and Python sources) or U+2028 is inside a line: the diff shows that
    line once, with no "No newline at end of file" in the middle, and parses back."""
    old, new = "x = 1\x0c\ny\u2028z\na\n", "x = 1\x0c\ny\u2028z\nb\n"
    diff = unified_diff("a.py", old, new)
    assert diff.split("\n") == ["--- a/a.py", "+++ b/a.py", "@@ -1,3 +1,3 @@", " x = 1\x0c", " y\u2028z", "-a", "+b", ""]
    assert parse_edits(f"```diff\n{diff}```\n", {"a.py": old}) == [FileEdit("a.py", new, "diff")]


README = "# Tool\n\nInstall:\n\n```bash\npip install tool\n```\n\nThen run `tool`.\n"


def test_a_markdown_file_with_code_examples_in_a_three_backtick_block_is_whole():
    """A small model wraps a README in ``` although its own examples use ```: the block ends
    at the fence that closes it, not at the end of the first example (which cut the file)."""
    new = README.replace("# Tool", "# Tool 2")
    for reply in (f"README.md\n```markdown\n{new}```\n", f"```markdown README.md\n{new}```\n\nRun `tool --help`:\n```\ntool --help\n```\n"):
        assert parse_edits(reply, {"README.md": README, "b.py": ""}) == [FileEdit("README.md", new, "whole")]
    # a file whose own fences do not pair up is cut at its block's first closing fence, as before
    odd = "TEMPLATE = '''\n```python\n'''\n"
    reply = f"t.py\n```python\n{odd.replace('TEMPLATE', 'T')}```\n"
    assert parse_edits(reply, {"t.py": odd}) == [FileEdit("t.py", odd.replace("TEMPLATE", "T"), "whole")]


BARE_README = "# Tool\n\nInstall:\n\n```\npip install tool\n```\n\nThen run it:\n\n```\ntool --help\n```\n"


@pytest.mark.parametrize("change", [("# Tool", "# Tool 2"), ("--help", "--version"), ("Then run it:", "Then:")])
def test_a_markdown_file_with_untagged_examples_in_a_three_backtick_block_is_whole(change):
    """Untagged examples: a bare fence inside the block opens one of the file's own examples
    when the line that leads in to it, or its first line, is one that leads in to or starts
    an example in the attached file, as a fence with a language does."""
    new = BARE_README.replace(*change)
    for reply in (f"README.md\n```markdown\n{new}```\n",
                  f"```markdown README.md\n{new}```\n\nTry it:\n```\npip install tool\n```\n",
                  f"Here is the new `README.md`:\n\n```\n{new}```\n"):
        assert parse_edits(reply, {"README.md": BARE_README, "b.py": ""}) == [FileEdit("README.md", new, "whole")]


def test_separate_bare_blocks_after_a_file_with_untagged_examples_stay_separate():
    """The ordinary case: the file's block ends at its closing fence, and the next blocks
    (another file, a snippet to run) are read as their own."""
    new = BARE_README.replace("# Tool", "# Tool 2")
    reply = (f"README.md\n```\n{new}```\n\nb.py\n```\nprint('pip install tool')\n```\n\n"
             f"Run:\n\n```\npip install tool\n```\n")
    assert parse_edits(reply, {"README.md": BARE_README, "b.py": ""}) == [
        FileEdit("README.md", new, "whole"), FileEdit("b.py", "print('pip install tool')\n", "whole")]


def test_a_usage_snippet_after_the_whole_file_does_not_replace_it():
    """The whole file, then a few lines showing how to use it, the prose naming the file
    again (or even its path line): the file's new content is the block that could be all
    of it. The snippet had cancelled the edit, or under a path line became the file."""
    old = "".join(f"x{i} = {i}\n" for i in range(20))
    new = old.replace("x3 = 3", "x3 = 33")
    for after in ("You can check it with `m.py`:\n", "Then `m.py` holds:\n", "m.py\n"):
        reply = f"Here is the updated `m.py`:\n```python\n{new}```\n{after}```python\nimport m\nprint(m.x3)\n```\n"
        assert parse_edits(reply, {"m.py": old, "b.py": ""}) == [FileEdit("m.py", new, "whole")]
    # two complete versions: the later one is meant, and the edit says there were two
    newer = new.replace("x4 = 4", "x4 = 44")
    assert parse_edits(f"m.py\n```python\n{new}```\nBetter:\nm.py\n```python\n{newer}```\n", {"m.py": old}) == [
        FileEdit("m.py", newer, "whole", versions=2)]
    # a single block under the file's path is its new content, however short
    assert parse_edits("m.py\n```python\nx = 1\n```\n", {"m.py": old}) == [FileEdit("m.py", "x = 1\n", "whole")]



def test_a_file_written_whole_more_than_once_says_how_many_versions_the_reply_holds():
    """The last whole version is applied, and the edit counts the different versions so the
    faces can say so: the user reviewing the diff did not know an earlier one was dropped.
    The same version twice, a new file, and search/replace blocks (applied together) too."""
    files = {"a.py": "x = 1\ny = 2\nz = 3\n", "b.py": "b = 1\n"}
    one, two = "x = 5\ny = 2\nz = 3\n", "x = 6\ny = 2\nz = 3\n"
    reply = f"a.py\n```python\n{one}```\nb.py\n```python\nb = 2\n```\nOr rather:\na.py\n```python\n{two}```\n"
    assert parse_edits(reply, files) == [FileEdit("a.py", two, "whole", versions=2), FileEdit("b.py", "b = 2\n", "whole")]
    assert parse_edits(f"a.py\n```python\n{one}```\na.py\n```python\n{one}```\n", files) == [
        FileEdit("a.py", one, "whole")]
    assert parse_edits("n.py\n```python\nn = 1\n```\nn.py\n```python\nn = 2\n```\n", files) == [
        FileEdit("n.py", "n = 2\n", "whole", new=True, versions=2)]
    blocks = "".join(f"a.py\n<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE\n\n"
                     for s, r in (("x = 1", "x = 10"), ("z = 3", "z = 30")))
    assert parse_edits(blocks, files) == [FileEdit("a.py", "x = 10\ny = 2\nz = 30\n", "replace")]
    with pytest.raises(EditError, match="twice in different forms"):  # whole and search/replace: refused
        parse_edits(f"a.py\n```python\n{one}```\n{blocks}", files)

def test_a_first_line_naming_its_own_file_is_kept_in_a_file_with_a_bom():
    """The file's first comment names it: the model's copy of that line is content, not a
    path label to drop, though the file starts with a BOM the model did not copy."""
    old = "\ufeff# src/x.py\nimport os\n"
    reply = "```python\n# src/x.py\nimport sys\n```\n"
    assert parse_edits(reply, {"src/x.py": old, "b.py": ""}) == [FileEdit("src/x.py", "\ufeff# src/x.py\nimport sys\n", "whole")]


def test_a_path_the_caller_says_is_an_attached_file_on_disk_edits_it():
    """same_file: the chat layer's answer for a symlink's name; a path it maps to no attached
    file stays a new one."""
    old, new = "x = 1\n", "x = 2\n"
    files = {"src/real.py": old}
    for reply in (f"link.py\n```\n{new}```\n", f"Change `link.py`:\n\n```\n{new}```\n",
                  f"link.py\n```\n<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE\n```\n"):
        [edit] = parse_edits(reply, files, same_file={"link.py": "src/real.py"}.get)
        assert (edit.path, edit.new_text, edit.new) == ("src/real.py", new, False), reply
    [edit] = parse_edits(f"link.py\n```\n{new}```\n", files, same_file={"link.py": "elsewhere.py"}.get)
    assert (edit.path, edit.new) == ("link.py", True)


def test_a_diff_with_git_quoted_headers_edits_the_file_whose_name_holds_a_newline():
    files = {"odd\nname.py": "a = 1\n", "name.py": "a = 1\n"}
    reply = '```diff\n--- "a/odd\\nname.py"\n+++ "b/odd\\nname.py"\n@@ -1 +1 @@\n-a = 1\n+a = 2\n```\n'
    assert parse_edits(reply, files) == [FileEdit("odd\nname.py", "a = 2\n", "diff")]
    assert unified_diff("odd\nname.py", "a = 1\n", "a = 2\n").startswith('--- "a/odd\\nname.py"\n+++ "b/odd\\nname.py"\n@@')


@pytest.mark.parametrize("name", ["my notes.md", "odd\nname with space.md", "trailing space.md ", " leading.md"])
def test_a_path_line_naming_an_attached_file_edits_it_whatever_its_name_holds(name):
    """A name with a space is no path by its looks (a prose line can hold spaces); named
    exactly as it was given, it is the attached file, and the rewrite is its new content."""
    from edgespec.workspace.root import quoted_path

    files = {name: "# Notes\n\n- one\n- two\n", "other.md": "# Other\n"}
    reply = f"{quoted_path(name)}\n```markdown\n# Rewritten\n```\n"
    assert parse_edits(reply, files) == [FileEdit(name, "# Rewritten\n", "whole")]
