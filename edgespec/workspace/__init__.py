"""The user's project files in a chat: attach, parse a reply into edits, show the diff, apply, undo.

Pure standard library: no engine, no chat, no UI. root.py is the project folder (paths, reading
text within limits), edits.py turns a reply into FileEdits (pure text), apply.py writes them
atomically and undoes them.
"""

from edgespec.workspace.apply import Applied, apply_edit, undo
from edgespec.workspace.edits import EDIT_INSTRUCTIONS, FileEdit, parse_edits, unified_diff
from edgespec.workspace.root import MAX_FILE_BYTES, FileText, Workspace, fence_for, language_for

__all__ = [
    "EDIT_INSTRUCTIONS",
    "MAX_FILE_BYTES",
    "Applied",
    "FileEdit",
    "FileText",
    "Workspace",
    "apply_edit",
    "fence_for",
    "language_for",
    "parse_edits",
    "undo",
    "unified_diff",
]
