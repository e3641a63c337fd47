"""The project folder: paths that stay inside it, and its files read as text within limits.

Every path a user types or a model names goes through `Workspace.resolve`, which follows
symlinks and `..` first and refuses whatever lands outside the root. `read` opens only
regular files (a FIFO or a device never blocks it), checks the size before reading, and
keeps the text exactly as it is on disk (CRLF stays CRLF), so its sha256 is the file's.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePath

from edgespec.errors import FileAccessError, FileTooLargeError, NotTextError, OutsideRootError

MAX_FILE_BYTES = 512 * 1024
"""The largest file that can be attached (bytes): a model's context holds far less anyway."""

SKIPPED_NAMES = frozenset({".git", "__pycache__", "node_modules", ".venv"})
"""Folders completion leaves out unless the prefix names them."""


@dataclass(frozen=True)
class FileText:
    """A text file of the project, as read from disk."""

    path: str
    """POSIX path relative to the root."""
    text: str
    """The content, exactly (newline style and final newline included)."""
    sha256: str
    """Hex digest of the bytes on disk."""
    size: int
    """Size in bytes."""


class Workspace:
    """The project folder (the current directory or --root) and the files under it."""

    def __init__(self, root: str | Path):
        try:
            resolved = Path(root).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            raise FileAccessError(f"The project folder {root} does not exist; choose an existing folder.") from None
        if not resolved.is_dir():
            raise FileAccessError(f"The project folder {root} is not a folder; choose a folder.")
        self.root: Path = resolved

    def resolve(self, path: str | Path) -> Path:
        """The absolute path, symlinks and `..` resolved; relative paths are taken from the root."""
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError, ValueError):
            raise FileAccessError(f"The path {path} cannot be resolved (a symlink loop or a bad name).") from None
        if not resolved.is_relative_to(self.root):
            raise OutsideRootError(f"{path} is outside the project folder {self.root}; only files inside it can be used.")
        return resolved

    def relative(self, path: str | Path) -> str:
        """The path relative to the root, with forward slashes ("." for the root itself)."""
        return self.resolve(path).relative_to(self.root).as_posix()

    def read(self, path: str | Path) -> FileText:
        """A regular text file under the root, within MAX_FILE_BYTES, decoded as UTF-8."""
        full = self.resolve(path)
        rel = full.relative_to(self.root).as_posix()
        data = read_regular(full, rel)
        if data is None:
            raise FileAccessError(f"{rel} does not exist in the project folder; check the path.")
        return FileText(path=rel, text=decode_text(data, rel), sha256=sha256_hex(data), size=len(data))

    def sha256_of(self, path: str | Path) -> str | None:
        """The sha256 of a file's bytes, or None when it does not exist (read as `read` reads it)."""
        full = self.resolve(path)
        data = read_regular(full, full.relative_to(self.root).as_posix())
        return None if data is None else sha256_hex(data)

    def complete(self, prefix: str, limit: int = 50) -> list[str]:
        """Paths under the root starting with `prefix`, one folder level deep; folders end with "/".

        Hidden entries and SKIPPED_NAMES are left out unless the prefix names them
        (".g" offers hidden names, "node_modules" offers node_modules/), and nothing
        that resolves outside the root is offered."""
        folder_part, slash, name_part = prefix.rpartition("/")
        folder_text = folder_part + slash
        try:
            folder = self.resolve(folder_part or ".")
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except (FileAccessError, OSError):
            return []
        found: list[str] = []
        for entry in entries:
            name = entry.name
            if not name.startswith(name_part) or not _offered(name, name_part):
                continue
            try:
                target = Path(entry.path).resolve()
                inside = target.is_relative_to(self.root)
                is_folder = inside and entry.is_dir()
            except (OSError, RuntimeError):
                continue
            if not inside:
                continue
            found.append(folder_text + name + ("/" if is_folder else ""))
            if len(found) >= limit:
                break
        return found


def _offered(name: str, typed: str) -> bool:
    """Whether completion shows `name` when the user typed `typed` at its level."""
    if name in SKIPPED_NAMES:
        return typed == name
    return not name.startswith(".") or typed.startswith(".")


def _require_regular(info: os.stat_result, rel: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise FileAccessError(f"{rel} is a folder; attach the files inside it one by one.")
    if not stat.S_ISREG(info.st_mode):
        raise FileAccessError(f"{rel} is not a regular file (a pipe, socket or device); only text files can be used.")


def _open_nonblocking(full: Path):
    """Open for reading without ever blocking (a FIFO swapped in after the stat check)."""
    fd = os.open(full, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        _require_regular(os.fstat(fd), full.name)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(full: Path, rel: str, *, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The bytes of a regular file (None when missing), refusing folders, FIFOs, devices and files over `limit`.

    `full` is an already resolved path inside the root; `rel` names it in messages."""
    try:
        info = os.stat(full)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FileAccessError(f"{rel} cannot be read ({error.strerror}).") from None
    _require_regular(info, rel)
    if info.st_size > limit:
        raise FileTooLargeError(_too_large(rel, info.st_size, limit))
    try:
        with _open_nonblocking(full) as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FileAccessError(f"{rel} cannot be read ({error.strerror}).") from None
    if len(data) > limit:
        raise FileTooLargeError(_too_large(rel, len(data), limit))
    return data


def _too_large(rel: str, size: int, limit: int) -> str:
    """Its size rounded up, so that a file a byte over the limit is not said to be the limit."""
    return f"{rel} is {-(-size // 1024):,} KiB, over the {limit // 1024} KiB limit for files in a chat; attach a smaller file or a part of it."


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
              (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
"""Byte order marks of the wide encodings, UTF-32's first (its LE mark begins with UTF-16's)."""


def decode_text(data: bytes, rel: str) -> str:
    """UTF-8 text, exactly; binary data (NUL bytes) or other encodings raise NotTextError."""
    wide = next((name for bom, name in _WIDE_BOMS if data.startswith(bom)), None)
    if wide is not None:  # text all the same, whose NUL bytes would call it binary
        raise NotTextError(f"{rel} is {wide} text; convert it to UTF-8 to attach it.")
    if b"\0" in data:
        raise NotTextError(f"{rel} is a binary file; only text files can be attached.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotTextError(f"{rel} is not UTF-8 text; convert it to UTF-8 to attach it.") from None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_LANGUAGES = {
    "py": "python", "pyi": "python", "js": "js", "mjs": "js", "cjs": "js", "jsx": "jsx", "ts": "ts", "tsx": "tsx",
    "rs": "rust", "go": "go", "c": "c", "h": "c", "cc": "cpp", "cpp": "cpp", "cxx": "cpp", "hpp": "cpp",
    "hh": "cpp", "java": "java", "kt": "kotlin", "swift": "swift", "cs": "csharp", "php": "php", "rb": "ruby",
    "md": "markdown", "markdown": "markdown", "rst": "rst", "json": "json", "yaml": "yaml", "yml": "yaml",
    "toml": "toml", "ini": "ini", "cfg": "ini", "xml": "xml", "sh": "bash", "bash": "bash", "zsh": "bash",
    "ps1": "powershell", "html": "html", "htm": "html", "css": "css", "scss": "scss", "sql": "sql", "lua": "lua",
    "r": "r", "jl": "julia", "scala": "scala", "dart": "dart", "zig": "zig", "vue": "vue", "tcss": "css",
    "txt": "",
}
_LANGUAGES_BY_NAME = {"makefile": "makefile", "dockerfile": "dockerfile", "cmakelists.txt": "cmake"}


def language_for(path: str) -> str:
    """The code fence's language tag for a file ("" when unknown or plain text)."""
    name = PurePath(path).name.lower()
    if name in _LANGUAGES_BY_NAME:
        return _LANGUAGES_BY_NAME[name]
    _, dot, extension = name.rpartition(".")
    return _LANGUAGES.get(extension, "") if dot else ""


def quoted_path(path: str) -> str:
    """`path` as one line of text shows it (to the model, in a diff's headers): as it is, or,
    where it holds a control character (a newline would make it two lines, the second a path
    of its own), starts with a double quote or with or ends in white space (which a line's
    reader strips), in double quotes with C escapes, as git quotes such names. Unambiguous: a
    name shown in quotes never stands as it is."""
    if not path.startswith('"') and path == path.strip() and not any(map(_control, path)):
        return path
    return '"' + "".join(_ESCAPES.get(ch) or (f"\\x{ord(ch):02x}" if _control(ch) else ch) for ch in path) + '"'


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
"""quoted_path's escapes by name; the other control characters (all below U+00A0) are \\xNN."""


def _control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc"


def fence_for(text: str) -> str:
    """A backtick fence longer than any run of backticks that starts a line of `text` (at least three)."""
    longest = 0
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        run = len(stripped) - len(stripped.lstrip("`"))
        longest = max(longest, run)
    return "`" * max(3, longest + 1)
