"""Typed errors with messages a user can act on.

Everything below the faces (edgespec.cli, the chat app) raises these; the faces
catch `EdgespecError` once and print its message. The exit statuses of the
command line stand here too, where the launcher (edgespec/__main__.py) and the
command line (edgespec/cli/) both read them.
"""

import signal
import unicodedata


def one_line(text: str, limit: int) -> str:
    """`text` as one line of plain text, fit for a terminal, for text a file or a peer
    wrote: control characters (ANSI escapes, NUL, bell, C1 codes) and bidirectional
    overrides removed, line breaks and tabs as single spaces, at most `limit` characters."""
    text = " ".join(text.split())  # every kind of whitespace, line breaks included, as one space
    return cut("".join(ch for ch in text if not _hidden(ch)), limit).rstrip()


def cut(text: str, limit: int) -> str:
    """`text`'s first `limit` characters, or fewer: never a part of a character as a
    reader sees one (a letter and its accents, an emoji sequence), which would show
    as a bare letter, a stray mark or a different emoji."""
    end = min(limit, len(text))
    while 0 < end < len(text) and _inside_grapheme(text, end):
        end -= 1
    return text[:end]


def _inside_grapheme(text: str, i: int) -> bool:
    """Whether text[i - 1] and text[i] belong to one grapheme: a mark (combining accent,
    variation selector), emoji skin tone, tag or ZWJ goes with the character before it,
    the character after a ZWJ with the ZWJ, a low surrogate with its high one, and
    regional indicators pair up into flags."""
    before, ch = text[i - 1], text[i]
    if before == _ZWJ or ch == _ZWJ or unicodedata.category(ch).startswith("M"):
        return True
    if "\U0001f3fb" <= ch <= "\U0001f3ff" or "\U000e0020" <= ch <= "\U000e007f":
        return True
    if "\ud800" <= before <= "\udbff" and "\udc00" <= ch <= "\udfff":
        return True
    return _regional(ch) and _regional_run(text, i) % 2 == 1


def _regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _regional_run(text: str, i: int) -> int:
    """How many regional indicators stand just before text[i]."""
    start = i
    while start > 0 and _regional(text[start - 1]):
        start -= 1
    return i - start


_ZWJ = "\u200d"


def terminal_text(text: str) -> str:
    """`text` fit for a terminal, its lines and tabs kept: the characters one_line
    removes (ANSI escapes, NUL, bell, C1 codes, bidirectional overrides) removed, so a
    pasted log, an attached file or a reply shows what it says and never acts on the
    terminal (a title set, the clipboard written, the screen cleared)."""
    return text.translate(_HIDDEN_IN_TEXT)  # at C speed: a paste may be a megabyte, a reply many small pieces


def _hidden(ch: str) -> bool:
    """A character a terminal acts on instead of showing, or that reorders the text around it."""
    return unicodedata.category(ch) == "Cc" or "\u202a" <= ch <= "\u202e" or "\u2066" <= ch <= "\u2069"


_HIDDEN_IN_TEXT = {code: None for code in range(0x2070) if _hidden(chr(code)) and chr(code) not in "\n\t"}
"""terminal_text's table: every character _hidden names (none is above U+2069), but line breaks and tabs."""


def yaml_problem(error: Exception) -> str:
    """A YAML parser's error (yaml.YAMLError) in one line: the line it is on and what is wrong.
    Its own message spans several lines, quoting the text with a caret under it."""
    mark = getattr(error, "problem_mark", None)
    at = f"line {mark.line + 1}: " if mark is not None else ""
    return f"{at}{getattr(error, 'problem', None) or ' '.join(str(error).split())}"


EXIT_ERROR = 1
"""The exit status of a command that failed with an error it printed."""
EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl+C (128 + SIGINT, as shells report it)."""
EXIT_BROKEN_PIPE = 141
"""The exit status of a command whose reader went away (`edgespec chats | head -1`): 128 + SIGPIPE, as `ls`
ends there."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP came (`args[0]`, the signal's number): raised where the command was, to
    unwind as Ctrl+C does (the models closed, saving what an exit saves), then the launcher ends by
    that signal, as other programs end. Not an Exception: nothing that handles errors may keep it."""


ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Signals that ask edgespec to end (Terminated): `kill`, a service stopped, a terminal closed."""


class EdgespecError(Exception):
    """Base class: the message is written for the user."""


class ModelFileError(EdgespecError):
    """A model file is missing, truncated or not GGUF."""


class ModelLoadError(EdgespecError):
    """llama.cpp refused to load a model or create a context."""


class IncompatibleDraftError(EdgespecError):
    """The draft model cannot be paired with the target (vocabularies differ)."""


class ContextFullError(EdgespecError):
    """The prompt alone does not fit in the context window."""


class NoFimTokensError(EdgespecError):
    """A completion with a suffix asks for a model whose vocabulary has no fill-in-the-middle tokens."""


class InvalidTokenError(EdgespecError, ValueError):
    """A prompt holds a token id that the model's vocabulary does not have."""


class RegistryError(EdgespecError):
    """models.yaml (or the user's override) is malformed, or a name is unknown."""


class DownloadError(EdgespecError):
    """A model file could not be fetched or failed verification."""


class TemplateError(EdgespecError):
    """A chat template is missing or failed to render."""


class ToolsNotTakenError(TemplateError):
    """Tools were offered to a model whose chat template has no place for them."""


class ServeError(EdgespecError):
    """The server cannot start as asked (an address in use, an exposed address without an API key)."""


class WorkerUnreachableError(EdgespecError):
    """An RPC worker (`edgespec worker`, llama.cpp's rpc-server) cannot be reached, or RPC is not built in."""


class WorkerLostError(EdgespecError):
    """An RPC worker holding some of the target's layers went away while in use.
    `fact` names it and says how; the message adds what the user can do (the
    server, which reloads by itself, words that part its own way)."""

    def __init__(self, fact: str):
        super().__init__(f"{fact}. Start it again, then reload the model (the models screen, or run the command again)")
        self.fact = fact


class FileAccessError(EdgespecError):
    """A project file cannot be used as asked (missing, not a regular file, unreadable); the base of the file errors."""

    left_changed: tuple[str, ...] = ()
    """The files a failed apply of several left changed on disk (written, and not put back);
    empty when every file is as it was before, which is what faces may tell from it."""


class OutsideRootError(FileAccessError):
    """A path resolves outside the project folder (through `..`, an absolute path or a symlink)."""


class NotTextError(FileAccessError):
    """A file is binary (NUL bytes) or not valid UTF-8."""


class FileTooLargeError(FileAccessError):
    """A file is over the size limit for attaching (workspace.root.MAX_FILE_BYTES)."""


class StaleFileError(FileAccessError):
    """A file on disk changed (or was deleted) since the reply or the change was based on it."""


class EditError(FileAccessError):
    """A reply's edit does not apply to the file it names (text not found or not unique, overlapping or elided)."""


class WriteError(FileAccessError):
    """Writing a file failed (disk full, read-only folder, no permission); the file on disk is left as it was."""
