"""The command line at its edges: text that meets a terminal, readers that go away,
bytes that are not UTF-8, and options that contradict each other. Fake engines only;
the commands that need no model run in a subprocess as a user runs them."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import unicodedata

import pytest
from tests.fakes import FakeEngine

from edgespec import cli
from edgespec.cli import chats, generate, options


def load_with(monkeypatch, load):
    """Have `generate` and `chat` load their models with `load`."""
    for command in (generate, chats):
        monkeypatch.setattr(command, "engine_from_args", load)


@pytest.fixture
def engine(monkeypatch, home):
    """The engine every command gets; it replies with the prompt it was given, and keeps the options."""
    fake = FakeEngine(reply=lambda prompt: "[" + prompt + "]")
    fake.args = None

    def load(args, progress=None):
        fake.args = args
        return fake

    load_with(monkeypatch, load)
    return fake


@pytest.fixture
def no_load(monkeypatch, home):
    def load(args, progress=None):
        raise AssertionError("the models were loaded before the options were checked")
    load_with(monkeypatch, load)


def store_with(titles: list[str]):
    from edgespec.chat import ConversationStore
    from edgespec.chat.store import Message

    with ConversationStore() as store:
        for title in titles:
            store.create(title=title, messages=[Message("user", "hi")])
        return store.path


# -- 9: terminal escapes in titles -------------------------------------------------------

HOSTILE = "\x1b[2J\x1b[31mred\x00\x07 title\r\n\u202eevil\x9b" + "x" * 100_000


def shown(text: str) -> bool:
    """Nothing in `text` that a terminal acts on instead of showing (besides line ends)."""
    return not any(unicodedata.category(ch) == "Cc" and ch != "\n" for ch in text) and "\u202e" not in text


def test_an_imported_title_is_stored_as_one_short_line_without_control_characters(home, tmp_path, capsys):
    from edgespec.chat import ConversationStore
    from edgespec.chat.export import EXPORT_FORMAT
    from edgespec.chat.store import TITLE_MAX

    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"format": EXPORT_FORMAT, "version": 1, "title": HOSTILE,
                                "messages": [{"role": "user", "content": "hi"}]}))
    assert cli.main(["import", str(path)]) == 0
    with ConversationStore() as store:
        title = store.title(1)
        store.rename(1, "again\x1b]0;pwned\x07" + "y" * 5000)
        renamed = store.title(1)
    assert title.startswith("[2J[31mred title evil") and len(title) == TITLE_MAX and shown(title)
    assert renamed.startswith("again]0;pwnedy") and len(renamed) == TITLE_MAX and shown(renamed)


def test_chats_shows_a_title_stored_raw_by_an_older_edgespec_without_its_escapes(home, capsys):
    import sqlite3

    from edgespec.chat.store import TITLE_MAX

    path = store_with(["plain"])
    with sqlite3.connect(path) as db:  # as an edgespec that did not clean titles left it
        db.execute("UPDATE conversations SET title = ?", (HOSTILE,))
    assert cli.main(["chats"]) == 0
    out = capsys.readouterr().out
    assert shown(out) and "red title" in out
    assert max(len(line) for line in out.splitlines()) < TITLE_MAX + 40


@pytest.mark.parametrize("name", ["gone\nx.py", "gone\x1b]0;title\x07.py"])
def test_an_error_naming_a_file_is_one_line_with_its_control_characters_escaped(no_load, tmp_path, capsys, name):
    """A file's name may hold a newline or a terminal escape: said as it is, the message was
    two lines, or acted on by the terminal."""
    argv = ["generate", "--template", "chatml", "--root", str(tmp_path), "--file", name, "hello"]
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and shown(err), err
    assert repr(name)[1:-1] in err


# -- 10: readers that go away, bytes that are not UTF-8 ----------------------------------

def into_closed_pipe(*argv: str, home) -> subprocess.CompletedProcess:
    """`python -m edgespec ARGV | reader` where the reader has gone before anything was written."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "edgespec", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "EDGESPEC_HOME": str(home)})
    finally:
        os.close(write)


@pytest.mark.parametrize("argv", [["paths"], ["chats"], ["--version"], ["--help"], ["generate", "--help"],
                                  ["models", "--help"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(home, argv):
    from edgespec.errors import EXIT_BROKEN_PIPE

    store_with([f"chat {i}" for i in range(5)])
    done = into_closed_pipe(*argv, home=home)
    assert done.returncode == EXIT_BROKEN_PIPE
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr and "Error" not in done.stderr


class ClosedPipe(io.StringIO):
    """A stdout whose reader went away after `allowed` characters."""

    def __init__(self, allowed: int = 0):
        super().__init__()
        self.allowed = allowed

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.allowed:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


@pytest.mark.parametrize("command", [["generate", "hello"], ["chat", "--new", "--once", "hello"]])
def test_a_reply_into_a_closed_pipe_ends_quietly_with_the_decode_closed_first(engine, monkeypatch, capsys, command):
    from edgespec.errors import EXIT_BROKEN_PIPE

    monkeypatch.setattr(sys, "stdout", ClosedPipe(allowed=3))
    assert cli.main([*command, "--template", "chatml"]) == EXIT_BROKEN_PIPE
    assert engine.closed and not engine.closed_while_generating
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, where", [
    (["generate", "h\udcffi"], "prompt"),
    (["generate", "hi", "--system", "s\udcfe"], "--system"),
    (["generate", "hi", "--stop", "\udcff"], "--stop"),
    (["chat", "--new", "--once", "h\udcffi"], "--once"),
])
def test_an_argument_that_is_not_utf8_is_replaced_and_named(engine, capsys, argv, where):
    assert cli.main([*argv, "--template", "chatml"]) == 0
    out, err = capsys.readouterr()
    assert where in err and "codec" not in err
    assert "\ufffd" in "".join(engine.prompts and engine.detokenize(engine.prompts[-1])) or "\ufffd" in str(
        engine.args.stop)


def test_chat_lines_on_stdin_that_are_not_utf8_are_replaced_and_named(engine, monkeypatch, capsys):
    raw = io.BytesIO(b"first\nsec\xffond\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape"))
    assert cli.main(["chat", "--new", "--template", "chatml"]) == 0
    out, err = capsys.readouterr()
    assert "sec\ufffdond" in out and "codec" not in err
    assert "stdin" in err and "line 2" in err


@pytest.mark.parametrize("argv", [["generate"], ["generate", "--raw"], ["generate", "short", "--system"]])
def test_a_prompt_far_past_the_context_is_refused_without_tokenizing_all_of_it(engine, monkeypatch, capsys, argv):
    """`cat big.log | edgespec generate`: all of a 64 MB prompt was tokenized (26 s, 2.9 GB,
    Ctrl+C waiting on llama.cpp's tokenizer) to say it did not fit."""
    from edgespec.chat.session import TOKEN_CHARS_MAX

    engine.n_ctx = 256
    huge = "word " * (engine.n_ctx * TOKEN_CHARS_MAX // 4)
    longest = []
    tokenize = engine.tokenize
    monkeypatch.setattr(engine, "tokenize", lambda text, **kw: longest.append(len(text)) or tokenize(text, **kw))
    if argv[-1] == "--system":
        argv = [*argv, huge]
    else:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(huge.encode())))
    assert cli.main([*argv, "--template", "chatml"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"the context holds {engine.n_ctx}" in err and "Traceback" not in err
    assert max(longest, default=0) < len(huge) // 10 and not engine.prompts


def test_a_relative_edgespec_home_is_taken_from_the_folder_the_command_started_in(tmp_path, monkeypatch, capsys):
    """EDGESPEC_HOME=rel: `paths` and `path` printed rel/..., and a conversation stored its model as
    rel/models/x.gguf, a file that is 'gone' for a chat continued from another folder."""
    from edgespec.config import dirs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGESPEC_HOME", "rel")
    assert dirs().data == tmp_path / "rel" / "data"
    assert cli.main(["paths"]) == 0
    assert f"{tmp_path / 'rel' / 'models'}\n" in capsys.readouterr().out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_generate_reading_its_prompt_from_a_terminal_says_how_to_end_it(engine, monkeypatch, capsys):
    """`edgespec generate` typed with no prompt waited on the terminal without a word, as if hung."""
    monkeypatch.setattr(sys, "stdin", Terminal("hello\n"))
    assert cli.main(["generate", "--template", "chatml"]) == 0
    out, err = capsys.readouterr()
    assert "Ctrl+D" in err and "hello" in out


def test_generate_reading_its_prompt_from_a_pipe_says_nothing_of_it(engine, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert cli.main(["generate", "--template", "chatml"]) == 0
    assert "Ctrl+D" not in capsys.readouterr().err


class Stoppable(FakeEngine):
    """Ends the reply being generated when interrupt() is called (from any thread), as the engine does."""

    def _generate(self, prompt_tokens, params):
        before = self.interrupts
        for chunk in super()._generate(prompt_tokens, params):
            if self.interrupts > before:
                chunk.stats.stop_reason = "cancelled"
                return
            yield chunk


@pytest.mark.parametrize("argv", [["generate", "hi"], ["chat", "--once", "hi"], ["serve", "--port", "0"]],
                         ids=["generate", "chat", "serve"])
def test_ctrl_c_while_the_models_load_ends_with_one_line_and_130(home, monkeypatch, capsys, argv):
    """Ctrl+C while a model is assembled, downloaded or read by llama.cpp reaches the command
    as KeyboardInterrupt out of load_engine (serve loads on its engine thread and raises it
    from there): the interrupted status and one line, never a traceback."""
    import edgespec.load
    from edgespec.errors import EXIT_INTERRUPTED

    def load_engine(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(edgespec.load, "load_engine", load_engine)
    handlers = list(logging.getLogger("edgespec.server").handlers)
    assert cli.main(argv) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err.endswith("\nedgespec: interrupted\n") and "Traceback" not in err, err
    # serve's log handler goes with it: left, it would write to this test's closed stream
    assert logging.getLogger("edgespec.server").handlers == handlers


class CtrlCAfter(io.StringIO):
    """A terminal where Ctrl+C is pressed once, after `n` characters of output."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def write(self, text: str) -> int:
        if self.n is not None and self.tell() + len(text) > self.n:
            self.n = None
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(text)


def test_ctrl_c_in_a_terminal_chat_stops_the_reply_and_the_chat_goes_on(monkeypatch, home, capsys):
    """As in llama-cli and ollama run: Ctrl+C mid-reply ended `edgespec chat` altogether."""
    from edgespec.chat import ConversationStore

    fake = Stoppable(reply=lambda prompt: "0123456789" * 30, delay_s=0.002)
    load_with(monkeypatch, lambda args, progress=None: fake)
    monkeypatch.setattr(sys, "stdin", Terminal("first\nsecond\n"))
    monkeypatch.setattr(sys, "stdout", CtrlCAfter(20))
    assert cli.main(["chat", "--new", "--template", "chatml"]) == 0
    out, err = sys.stdout.getvalue(), capsys.readouterr().err
    assert len(fake.prompts) == 2 and fake.interrupts == 1 and "stopped" in err
    assert out.count("0123456789" * 30) == 1  # the second reply, whole
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with ConversationStore() as store:
        assert [m.status for m in store.messages(1) if m.role == "assistant"] == ["stopped", "done"]


def test_ctrl_c_in_a_terminal_chat_waiting_for_another_reply_gives_up_the_wait_at_once(engine, monkeypatch, capsys):
    """The note says 'Ctrl+C gives up': it must, at the first press, with the chat going on."""
    import threading

    from edgespec.chat import ConversationStore
    from edgespec.chat.reply_lock import reply_lock

    assert cli.main(["chat", "--new", "--template", "chatml", "--once", "first"]) == 0
    with ConversationStore() as store:
        path = store.path
    holding, done = threading.Event(), threading.Event()

    def hold():
        with reply_lock(path, 1):
            holding.set()
            done.wait(30)

    def note(text):
        if "waiting" in text:
            os.kill(os.getpid(), signal.SIGINT)  # pressed while it waits

    monkeypatch.setattr(chats, "note", note)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        monkeypatch.setattr(sys, "stdin", Terminal("second\n"))
        assert cli.main(["chat", "--conversation", "1", "--template", "chatml"]) == 0
    finally:
        done.set()
        holder.join(30)
    assert "Stopped waiting" in capsys.readouterr().err
    with ConversationStore() as store:
        assert [m.content for m in store.messages(1) if m.role == "user"] == ["first"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_during_a_chat_reply_ends_it_as_other_programs_end_saving_what_an_exit_saves(home, tmp_path, sig):
    """SIGTERM (and SIGHUP) unwind as Ctrl+C does: the engine closes, writing the lookup pool
    (the drafter's memory of earlier text) and storing the reply as far as it went, and the
    process then ends by the signal, as a shell reports other programs (143, 129)."""
    from tests.synthetic import write_model

    from edgespec.chat import ConversationStore

    model = write_model(tmp_path / "long.gguf", seed=1, n_ctx_train=4096)  # room for a reply of seconds
    argv = ["chat", "--new", "--target", str(model), "--no-draft", "--template", "chatml", "--ctx", "4096",
            "--max-tokens", "3500", "--temperature", "0", "--once", "hello"]  # greedy: 12 kB, no early end
    chat = subprocess.Popen([sys.executable, "-m", "edgespec", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "EDGESPEC_HOME": str(home)})
    try:
        assert chat.stdout.read(200)  # the reply has begun
        chat.send_signal(sig)
        _, err = chat.communicate(timeout=120)
    finally:
        chat.kill()
    assert chat.returncode == -sig and b"Traceback" not in err, err.decode()
    assert [p.stat().st_size > 0 for p in (home / "cache" / "pool").glob("*.pool")] == [True]
    with ConversationStore() as store:
        [reply] = [m for m in store.messages(1) if m.role == "assistant"]
    assert reply.status in ("stopped", "interrupted") and len(reply.content) >= 200  # where the signal came


def test_a_message_too_long_in_a_terminal_chat_is_said_and_the_chat_goes_on(engine, monkeypatch, capsys):
    """A paste too long for the context ended `edgespec chat` and unloaded the models."""
    engine.n_ctx = 256
    monkeypatch.setattr(sys, "stdin", Terminal("x" * 1000 + "\nsecond\n"))
    assert cli.main(["chat", "--new", "--template", "chatml"]) == 0
    out, err = capsys.readouterr()
    assert "does not fit" in err and "second" in out and len(engine.prompts) == 1


def test_a_message_too_long_on_piped_stdin_still_ends_the_chat_with_an_error(engine, monkeypatch, capsys):
    engine.n_ctx = 256
    monkeypatch.setattr(sys, "stdin", io.StringIO("x" * 1000 + "\nsecond\n"))
    assert cli.main(["chat", "--new", "--template", "chatml"]) == cli.EXIT_ERROR
    assert "does not fit" in capsys.readouterr().err and not engine.prompts


@pytest.mark.parametrize("stream", ["stdin", "stderr"])
def test_the_app_without_a_terminal_says_so_instead_of_drawing_into_a_pipe(home, monkeypatch, capsys, stream):
    """`edgespec < /dev/null > log` in a script drew the app's escapes to stderr and waited for keys forever."""
    import edgespec.tui.app as app

    monkeypatch.setattr(app, "EdgespecApp", None)  # drawn at all: a TypeError
    monkeypatch.setattr(sys, "stdin", Terminal("") if stream == "stderr" else io.StringIO(""))
    if stream == "stdin":
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert cli.main([]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{stream} is not a terminal" in err and "edgespec generate" in err


# -- should-fix: chat's options ----------------------------------------------------------

def test_chat_refuses_an_empty_message_before_the_models_load(no_load, capsys):
    for message in ("", "  \n"):
        assert cli.main(["chat", "--once", message]) == cli.EXIT_ERROR
    assert "Traceback" not in capsys.readouterr().err


def test_chat_refuses_new_with_a_conversation(no_load, capsys):
    assert cli.main(["chat", "--new", "--conversation", "1", "--once", "hi"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "--new" in err and "--conversation" in err


def test_chat_says_when_the_conversations_model_file_is_gone(engine, capsys, tmp_path):
    from edgespec.chat import ConversationStore

    gone = tmp_path / "gone.gguf"
    with ConversationStore() as store:
        cid = store.create(title="old", settings={"target": str(gone), "draft": str(gone)})
    assert cli.main(["chat", "--conversation", str(cid), "--once", "hi", "--template", "chatml"]) == 0
    assert engine.args.target is None and engine.args.draft is None  # the default pair
    assert str(gone) in capsys.readouterr().err


def test_chat_says_nothing_when_the_conversations_models_are_there(engine, capsys, tmp_path):
    from edgespec.chat import ConversationStore

    here = tmp_path / "here.gguf"
    here.write_bytes(b"")
    with ConversationStore() as store:
        cid = store.create(title="old", settings={"target": str(here)})
    assert cli.main(["chat", "--conversation", str(cid), "--once", "hi", "--template", "chatml"]) == 0
    assert engine.args.target == str(here) and str(here) not in capsys.readouterr().err


def test_chat_with_nothing_on_stdin_says_nothing_was_sent(engine, monkeypatch, capsys):
    from edgespec.chat import ConversationStore

    monkeypatch.setattr(sys, "stdin", io.StringIO("\n  \n"))
    assert cli.main(["chat", "--new", "--template", "chatml"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "nothing was sent" in err and "--once" in err and "None" not in err
    with ConversationStore() as store:
        assert store.list() == []


def test_chat_says_a_stored_template_it_does_not_know_came_from_the_conversation(engine, capsys):
    from edgespec.chat import ConversationStore

    engine.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with ConversationStore() as store:  # "custom": a Jinja source given with --template, which is not stored
        cid = store.create(title="old", settings={"template": "custom"})
    assert cli.main(["chat", "--conversation", str(cid), "--once", "hi"]) == 0
    err = capsys.readouterr().err
    assert f"conversation {cid}" in err and "'custom'" in err and "--template" in err


# -- conversation ids: one that is not there, however written -----------------------------

HUGE = "99999999999999999999999"


@pytest.mark.parametrize("argv", [["export", HUGE], ["apply", "--conversation", HUGE],
                                  ["chat", "--conversation", HUGE, "--once", "hi"],
                                  ["apply", "--conversation", "0"], ["chat", "--conversation", "0", "--once", "hi"]],
                         ids=["export-huge", "apply-huge", "chat-huge", "apply-0", "chat-0"])
def test_a_conversation_id_that_is_not_there_is_named_not_the_latest_taken(no_load, capsys, argv):
    store_with(["the latest"])
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"There is no conversation {argv[-1] if argv[0] == 'export' else argv[2]}" in err
    assert "Traceback" not in err


# -- imports: a file from elsewhere is checked, and never locks the list -------------------

def export_file(tmp_path, text: str = "", **fields) -> str:
    """A conversation export at tmp_path/t.json: `fields` over an empty one, or `text` as it is."""
    from edgespec.chat.export import EXPORT_FORMAT

    path = tmp_path / "t.json"
    path.write_text(text or json.dumps({"format": EXPORT_FORMAT, "version": 1, "messages": [], **fields}))
    return str(path)


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_import_refuses_a_time_out_of_range_and_the_list_still_works(home, tmp_path, capsys, when):
    assert cli.main(["import", export_file(tmp_path, created=when)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "created" in err and when in err and "out of range" not in err
    assert cli.main(["chats"]) == 0


def test_chats_and_export_show_a_time_out_of_range_stored_before(home, capsys):
    import sqlite3

    path = store_with(["old"])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE conversations SET created = -62135647200.0, updated = 253402351199.0")
    db.close()
    assert cli.main(["chats"]) == 0
    assert "9999-12-" in capsys.readouterr().out  # the latest time a date holds, in any time zone
    assert cli.main(["export", "1"]) == 0
    assert "# old" in capsys.readouterr().out


def test_import_of_text_that_is_not_unicode_names_the_file(home, tmp_path, capsys):
    path = export_file(tmp_path, '{"format": "edgespec.conversation", "version": 1, "messages": [], '
                                 '"title": "\\ud800"}')
    assert cli.main(["import", path]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert path in err and "not valid Unicode" in err and "codec" not in err
    assert cli.main(["chats"]) == 0
    assert "no conversations" in capsys.readouterr().err


def test_import_reads_stdin_for_a_dash_as_export_writes_stdout(home, monkeypatch, capsys):
    """`edgespec export 1 | edgespec import -` said 'cannot read -: [Errno 2] No such file or directory: '-''."""
    store_with(["piped"])
    assert cli.main(["export", "1", "--format", "json"]) == 0
    exported = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(exported.encode())))
    assert cli.main(["import", "-"]) == 0
    assert "conversation 2" in capsys.readouterr().out
    assert cli.main(["chats"]) == 0
    assert capsys.readouterr().out.count("piped") == 2


def test_import_of_a_file_that_is_not_there_says_so_once(home, tmp_path, capsys):
    missing = str(tmp_path / "gone.json")
    assert cli.main(["import", missing]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count(missing) == 1 and "No such file" in err and "Errno" not in err


# -- should-fix: option ranges and words ---------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "0"])
def test_parallel_below_one_is_refused_naming_one(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["generate", "hi", "--parallel", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "at least 1" in err and "at least 0" not in err


@pytest.mark.parametrize("argv, named, not_named", [
    (["--n-gpu-layers-draft", "3"], "--n-gpu-layers-draft", "--n-gpu-layers "),
    (["--n-gpu-layers", "5"], "--n-gpu-layers ", "--n-gpu-layers-draft"),
])
def test_gpu_layers_on_a_cpu_build_name_the_option_given(capsys, monkeypatch, argv, named, not_named):
    import edgespec.llama

    monkeypatch.setattr(edgespec.llama, "system_info", lambda: {"backend": "cpu", "gpu_offload": False})
    options.load_settings_from_args(cli.build_parser().parse_args(["generate", "hi", *argv]))
    err = capsys.readouterr().err.replace("\n", " ")
    assert named in err and not_named not in err


def test_bench_counts_the_layers_a_gpu_holds_not_those_asked_for():
    from edgespec.engine.info import LayerRun
    from tests.fakes import engine_info, model_info

    cpu = model_info("t.gguf", n_layer=30, n_gpu_layers=31, layers=(LayerRun("CPU", None, 31),))
    gpu = model_info("d.gguf", n_layer=30, n_gpu_layers=31,
                     layers=(LayerRun("CPU", None, 1), LayerRun("CUDA0", None, 30)))
    line = generate.models_line(engine_info({"target": cpu, "draft": gpu}, backend="cpu"))
    assert "0/31 layers on GPU" in line and "30/31 layers on GPU" in line


def test_bench_says_how_much_of_a_models_memory_is_in_huge_pages():
    """Whether the system gave huge pages decides a CPU's decode speed by 10-15%: a
    benchmark's first line says, for each model that got any."""
    from dataclasses import replace

    from tests.fakes import engine_info, model_info

    target, draft = replace(model_info("t.gguf"), huge_pages_mib=644), model_info("d.gguf")
    line = generate.models_line(engine_info({"target": target, "draft": draft}))
    assert line.count("in huge pages") == 1 and "t.gguf (0/1 layers on GPU, flash attention off, 644 MiB in huge pages)" in line


def stats(**kw):
    from edgespec.engine.events import Stats

    return Stats(**kw)


def test_a_plain_reply_ending_on_eos_shows_one_token_per_pass():
    from edgespec.chat.words import stats_line

    plain = stats(generated_tokens=10, target_passes=11, stop_reason="eog", decode_s=1.0)
    assert "1.00 tok/pass" in stats_line(plain)
    cut = stats(generated_tokens=10, target_passes=10, stop_reason="max_tokens", decode_s=1.0)
    assert "1.00 tok/pass" in stats_line(cut)
    speculated = stats(generated_tokens=11, target_passes=4, stop_reason="eog", drafted=9, accepted=8, decode_s=1.0)
    assert "3.00 tok/pass" in stats_line(speculated)  # 11 tokens and the EOS in 4 passes


def test_a_speed_over_a_moment_is_not_shown():
    from edgespec.chat.words import stats_line

    assert "tok/s" not in stats_line(stats(generated_tokens=1, target_passes=2, stop_reason="eog", decode_s=0.00016))
    assert "tok/s" not in stats_line(stats(generated_tokens=3, target_passes=3, decode_s=0.001))
    assert "20.0 tok/s" in stats_line(stats(generated_tokens=20, target_passes=20, decode_s=1.0))


@pytest.mark.parametrize("command", ["chat", "chats", "export", "import", "generate", "paths"])
def test_every_command_and_each_of_its_arguments_is_described(command):
    import argparse

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    assert parser.description and next(c.help for c in sub._choices_actions if c.dest == command)
    assert [a.dest for a in parser._actions if not a.help] == []


@pytest.mark.parametrize("modes", [("plain",), ("plain", "draft", "lookup", "auto")])
def test_bench_chart_leaks_no_warning(tmp_path, recwarn, modes):
    """`bench --modes plain` has nothing to compare: its chart has no legend to warn about."""
    pytest.importorskip("matplotlib")
    from edgespec import bench

    results = [bench.Result(p.id, p.category, mode, tokens_per_s=[10.0], speedup=[] if mode == "plain" else [1.2])
               for p in bench.load_prompts() for mode in modes]
    bench.write_chart(results, tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").stat().st_size > 0
    assert [str(w.message) for w in recwarn] == []
