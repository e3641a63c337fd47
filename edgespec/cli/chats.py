"""`edgespec chat` (a stored conversation, headless), `chats`, `export` and `import`."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import sys
import threading

from edgespec.cli.bars import stderr_progress
from edgespec.chat.reply_lock import ReplyWaitStopped
from edgespec.cli.options import (add_model_options, add_sampling_options, add_template_option, decoded,
                                  engine_from_args, model_text, open_store, params_from_args)
from edgespec.cli.files import add_file_options, home_path, note_versions, workspace_from_args
from edgespec.cli.output import error, stderr_stats, note, print_table
from edgespec.cli.signals import unwinding
from edgespec.errors import ContextFullError, EdgespecError


def add_parsers(sub) -> None:
    """`chat`, `chats`, `export` and `import`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("chat", help="continue a stored conversation headlessly",
                       description="Send a message to a stored conversation (default: the latest) and stream "
                                   "the reply to stdout. Without --once, reads messages from stdin, one per line. "
                                   "The conversation's models are used again unless --pair/--target is given.")
    p.add_argument("--once", metavar="MESSAGE", type=model_text("--once"),
                   help="send this one message, print the reply, exit")
    p.add_argument("--conversation", type=int, metavar="ID", help="conversation to continue (see `edgespec chats`)")
    p.add_argument("--new", action="store_true", help="start a new conversation")
    p.add_argument("--system", metavar="TEXT", type=model_text("--system"), help="system prompt of a new conversation")
    p.add_argument("--private", action="store_true",
                   help="keep the conversation out of the lookup pool, from now on (stored with it: the app "
                        "keeps it out too), and remove what it gave the pool before")
    add_template_option(p)
    add_file_options(p)
    p.add_argument("--stats", action="store_true", help="print each reply's statistics to stderr")
    add_model_options(p)
    add_sampling_options(p)
    p.set_defaults(handler=_cmd_chat)

    p = sub.add_parser("chats", help="list stored conversations, most recent first",
                       description="List the stored conversations, most recently updated first: id, when, "
                                   "how many messages, title. `edgespec chat --conversation ID` continues one.")
    p.add_argument("--search", metavar="TEXT", help="only those whose title or messages contain TEXT")
    p.set_defaults(handler=_cmd_chats)

    p = sub.add_parser("export", help="print a stored conversation as Markdown or JSON",
                       description="Print a stored conversation with its statistics: Markdown to read, or JSON "
                                   "that `edgespec import` reads back (on this machine or another).")
    p.add_argument("id", type=int, metavar="ID", help="the conversation (see `edgespec chats`)")
    p.add_argument("--format", choices=("md", "json"), default="md", help="md (default) or json")
    p.add_argument("-o", "--output", metavar="FILE", type=home_path("--output"), help="write to FILE instead of stdout")
    p.set_defaults(handler=_cmd_export)

    p = sub.add_parser("import", help="store a conversation exported as JSON (`edgespec export ID --format json`)",
                       description="Store a conversation exported as JSON as a new conversation. The file is "
                                   "checked whole first: nothing is stored from one that is not an edgespec export.")
    p.add_argument("file", metavar="FILE", type=home_path("FILE"), help="a file written by `edgespec export ID --format json` (- reads stdin)")
    p.set_defaults(handler=_cmd_import)


def _cmd_chat(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec.chat import ChatSession
    from edgespec.chat.attachments import not_sent_again

    if args.once is not None and not args.once.strip():
        raise EdgespecError("the message is empty: pass some text with --once, or leave --once out to read "
                            "messages from stdin")
    if args.new and args.conversation is not None:
        raise EdgespecError("--new starts a conversation and --conversation continues one: pass one of them")
    params = params_from_args(args)
    store = open_store()
    cid = None if args.new else (store.latest() if args.conversation is None else args.conversation)
    stored = store.settings(cid) if cid is not None else {}
    gone = [role for role in ("target", "draft") if stored.get(role) and not Path(stored[role]).exists()]
    if gone and not (args.pair or args.target):
        instead = "the default pair" if "target" in gone else "no draft model"
        note(f"conversation {cid} was held with " + " and ".join(f"{role} {stored[role]}" for role in gone)
             + f", no longer there; answering with {instead} (--pair or --target to choose)")
    if not (args.pair or args.target) and stored.get("target") and Path(stored["target"]).exists():
        args.target = stored["target"]  # the models the conversation was held with
        if not args.draft and stored.get("draft") and Path(stored["draft"]).exists():
            args.draft = stored["draft"]
    template = args.template or _stored_template(stored, cid)
    root = stored.get("root")
    workspace = workspace_from_args(args, stored_root=root if root and Path(root).is_dir() else None)
    with engine_from_args(args, progress=stderr_progress()) as engine, unwinding():
        name = Path(engine.describe().target.path).name
        give_up = threading.Event()  # set by Ctrl+C at a terminal: stop waiting for another edgespec's reply
        session = ChatSession(engine, store=store, conversation_id=cid, system_prompt=args.system,
                              params=params, template=template, model_name=name, workspace=workspace, stop=give_up,
                              on_wait=lambda: note("another edgespec is replying in this conversation; waiting for "
                                                   "its reply to finish (Ctrl+C gives up)"))
        if args.private:
            session.keep_private(True)
        attach = list(args.file)
        sent = False
        at_terminal = args.once is None and sys.stdin.isatty()
        for text in [args.once] if args.once is not None else _stdin_lines():
            sent, last = True, None
            for notice in not_sent_again(workspace, session.messages):
                note(notice)
            try:
                with _ctrl_c_stops_the_reply(engine, give_up, at_terminal):
                    for last in session.send(text, attach):
                        sys.stdout.write(last.text)
                        sys.stdout.flush()
            except (ContextFullError, ReplyWaitStopped) as e:  # nothing was sent: at a terminal, the chat goes on
                if not at_terminal:
                    raise
                error(str(e))
                continue
            print()
            if last is not None and last.stats.stop_reason == "cancelled":
                print(f"[stopped] {stderr_stats(last.stats)}", file=sys.stderr)
            elif last is not None and (args.stats or last.stats.dropped_messages):
                dropped = last.stats.dropped_messages
                left_out = f" (the {dropped} oldest messages were left out to fit the context)" if dropped else ""
                print(stderr_stats(last.stats) + left_out, file=sys.stderr)
            attach = []  # the files go with the first message
            try:
                edits = session.pending_edits()
            except EdgespecError as e:  # the reply's changes do not apply; the reply itself is kept
                note(f"the reply's changes cannot be applied: {e}")
                edits = []
            if edits:
                note(f"the reply changes {', '.join(e.path for e in edits)}: `edgespec apply` shows the diff and "
                     "writes it")
                note_versions(edits)
    if not sent:
        raise EdgespecError("stdin held no message, so nothing was sent: type messages one per line, or pass one "
                            "with --once")
    if session.conversation_id is not None:
        print(f"[conversation {session.conversation_id}]", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _ctrl_c_stops_the_reply(engine, give_up: threading.Event, at_terminal: bool):
    """In a chat typed at a terminal, Ctrl+C during a turn stops that reply as the app's Esc
    does (engine.interrupt(): the reply is kept, as stopped), or gives up waiting for
    another edgespec's reply in the conversation (`give_up`), and the chat goes on at its
    prompt, as in llama-cli and ollama run; a second Ctrl+C in the same turn, or one at
    the prompt, ends the chat."""
    give_up.clear()
    if not at_terminal or threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[bool] = []

    def stop(_signum, _frame) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        give_up.set()
        # On a thread of its own: this handler runs on the main thread, which may hold
        # the engine's lock that interrupt() takes.
        threading.Thread(target=engine.interrupt, daemon=True).start()

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stored_template(stored: dict, cid: int | None) -> str | None:
    """The built-in chat format conversation `cid` was held with, to use again; None for
    the model's own ("gguf") and, with a note saying where it came from, for a name this
    edgespec cannot use again ("custom": a Jinja source given with --template, which is
    not stored; an unknown name imported by an older edgespec)."""
    from edgespec.chat import BUILTIN_FORMATS

    name = stored.get("template")
    if name in BUILTIN_FORMATS or name in (None, "gguf"):
        return name if name in BUILTIN_FORMATS else None
    why = " (a template given as Jinja source is not stored)" if name == "custom" else ""
    note(f"conversation {cid}'s settings name chat format {name!r}, which cannot be used again{why}; answering "
         f"with the model's own (--template to choose one of {', '.join(BUILTIN_FORMATS)})")
    return None


def _stdin_lines():
    """stdin's lines that are not blank, as UTF-8 (bytes that are not become U+FFFD, with a note)."""
    stdin = sys.stdin
    for n in itertools.count(1):
        if stdin.isatty():
            print("> ", end="", file=sys.stderr, flush=True)
        raw = (stdin.buffer.readline() if hasattr(stdin, "buffer")
               else stdin.readline().encode("utf-8", "surrogateescape"))
        if not raw:
            return
        line = decoded(raw, f"stdin line {n}")
        if line.strip():
            yield line.rstrip("\n")


def _cmd_chats(args: argparse.Namespace) -> int:
    from edgespec.chat.store import clean_title

    rows = [[str(c.id), f"{c.updated:%Y-%m-%d %H:%M}", str(c.n_messages), clean_title(c.title)]
            for c in open_store().list(search=args.search)]
    if rows:
        print_table(["id", "updated", "messages", "title"], rows)
    else:
        print("no conversations" + (f" matching {args.search!r}" if args.search else ""), file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec.chat.export import export_json, export_markdown

    store = open_store()
    if args.format == "json":
        text = json.dumps(export_json(store, args.id), ensure_ascii=False, indent=2) + "\n"
    else:
        text = export_markdown(store, args.id)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise EdgespecError(f"cannot write {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec.chat import StoreError
    from edgespec.chat.export import import_json, invalid_text

    name = "stdin" if args.file == "-" else args.file
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise StoreError(f"cannot read {name}: {e.strerror or e}") from None
    except ValueError as e:
        raise StoreError(f"cannot read {name}: {e}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise StoreError(f"cannot read {name}: its JSON is nested too deeply to be an edgespec export") from None
    where = invalid_text(data)
    if where is not None:
        raise StoreError(f"cannot import {name}: its {where} holds text that is not valid Unicode (a lone "
                         "surrogate, such as \\ud800); nothing was imported. Correct that text, or export it again.")
    print(f"imported as conversation {import_json(open_store(), data)}")
    return 0

