"""Files in a conversation: attached, shown to the model once, kept in the store and
exports, and a reply's edits applied from the command line (fake engine)."""

import json

import pytest
from tests.fakes import FakeEngine

from edgespec import cli
from edgespec.chat import ChatSession, ConversationStore
from edgespec.chat.attachments import FilesDoNotFitError, TooManyFilesError, model_messages
from edgespec.chat.export import export_json, export_markdown, import_json
from edgespec.cli import chats, generate
from edgespec.engine.events import GenerationParams
from edgespec.errors import FileAccessError, OutsideRootError
from edgespec.workspace.root import Workspace

APP = "def greet(name):\n    print('hi', name)\n"
RENAMED = "def greet(person):\n    print('hi', person)\n"


def _whole(path: str, text: str) -> str:
    return f"Here it is.\n\n{path}\n```python\n{text}```\n"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text(APP)
    return root


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


def _session(engine, store, project, **kw):
    return ChatSession(engine, store=store, template="chatml", workspace=Workspace(project), **kw)


def _prompt(engine) -> str:
    return engine.detokenize(engine.prompts[-1])


def test_an_attached_file_is_shown_once_with_its_path_and_language_then_only_named(store, project):
    engine = FakeEngine(reply=lambda p: "ok")
    chat = _session(engine, store, project)
    list(chat.send("Rename name to person", ["src/app.py"]))
    first = _prompt(engine)
    assert f"src/app.py\n```python\n{APP}```" in first
    assert first.index("src/app.py") < first.index("Rename name to person")  # the file first, then the question
    list(chat.send("And again", ["src/app.py"]))
    second = _prompt(engine)
    assert second.count(APP) == 1 and second.startswith(first)  # the cache keeps its prefix


def test_a_file_changed_on_disk_is_sent_again_on_the_next_turn_and_says_so(store, project):
    engine = FakeEngine(reply=lambda p: "ok")
    chat = _session(engine, store, project)
    list(chat.send("Look", ["src/app.py"]))
    (project / "src" / "app.py").write_text(RENAMED)
    list(chat.send("Now?"))
    prompt = _prompt(engine)
    assert APP in prompt and RENAMED in prompt
    assert [a.origin for a in chat.messages[-2].attachments] == ["changed"]


def test_an_applied_edit_is_not_sent_again(store, project):
    engine = FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED))
    chat = _session(engine, store, project)
    list(chat.send("Rename", ["src/app.py"]))
    [edit] = chat.pending_edits()
    assert edit.path == "src/app.py" and edit.edit.new_text == RENAMED and "+def greet(person):" in edit.diff
    from edgespec.cli.files import apply_edits

    written = apply_edits([edit], chat.workspace, yes=True)
    chat.record_applied(written)
    assert (project / "src" / "app.py").read_text() == RENAMED
    list(chat.send("Thanks"))
    assert chat.messages[-2].attachments == []  # nothing changed behind the conversation's back
    assert _prompt(engine).count(RENAMED) == 1  # in the reply only


def test_attachments_are_kept_in_the_store_and_shown_again_after_a_restart(tmp_path, project):
    with ConversationStore(tmp_path / "c.db") as store:
        chat = _session(FakeEngine(reply=lambda p: "ok"), store, project)
        list(chat.send("Look", ["src/app.py"]))
        cid = chat.conversation_id
    with ConversationStore(tmp_path / "c.db") as store:
        messages = store.messages(cid)
        assert store.settings(cid)["root"] == str(project.resolve())
    [attached] = messages[0].attachments
    assert (attached.path, attached.content, attached.origin) == ("src/app.py", APP, "attached")
    assert len(attached.sha256) == 64


def test_export_and_import_keep_attachments(store, project):
    chat = _session(FakeEngine(reply=lambda p: "ok"), store, project)
    list(chat.send("Look", ["src/app.py"]))
    data = export_json(store, chat.conversation_id)
    assert data["version"] == 2
    copy = import_json(store, json.loads(json.dumps(data)))
    assert store.messages(copy)[0].attachments == store.messages(chat.conversation_id)[0].attachments
    assert f"```python\n{APP.rstrip()}\n```" in export_markdown(store, copy)


@pytest.mark.parametrize("attachment", [
    "src/app.py", {"path": 1, "content": "", "sha256": ""}, {"path": "a", "content": "", "sha256": "", "origin": "x"},
    {"path": "a", "content": "", "sha256": "", "added": "yesterday"},
])
def test_an_import_with_a_malformed_attachment_is_refused_whole(store, attachment):
    from edgespec.chat import StoreError

    data = {"format": "edgespec.conversation", "version": 2,
            "messages": [{"role": "user", "content": "hi", "attachments": [attachment]}]}
    with pytest.raises(StoreError):
        import_json(store, data)
    assert store.list() == []


def test_a_conversation_without_files_exports_as_version_1(store):
    chat = ChatSession(FakeEngine(), store=store, template="chatml")
    list(chat.send("hi"))
    assert export_json(store, chat.conversation_id)["version"] == 1


def test_files_that_do_not_fit_are_refused_before_anything_is_stored(store, project):
    (project / "big.py").write_text("x = 1\n" * 400)
    chat = _session(FakeEngine(n_ctx=512), store, project)
    with pytest.raises(FilesDoNotFitError):
        list(chat.send("Look", ["big.py"]))
    assert store.list() == [] and chat.messages == []


def test_too_many_files_are_refused(store, project):
    for i in range(40):
        (project / f"f{i}.txt").write_text(str(i))
    chat = _session(FakeEngine(), store, project)
    with pytest.raises(TooManyFilesError):
        list(chat.send("Look", [f"f{i}.txt" for i in range(40)]))


def test_a_path_outside_the_project_is_refused(store, project, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    chat = _session(FakeEngine(), store, project)
    with pytest.raises(OutsideRootError):
        list(chat.send("Look", ["../secret.txt"]))


def test_reading_ahead_reads_the_files_before_the_words_and_sending_reads_only_the_rest(store, project, tmp_path):
    engine = FakeEngine(reply=lambda p: "ok")
    chat = _session(engine, store, project)
    n = chat.read_ahead(["src/app.py"])
    ahead, _ = engine.reads[-1]
    assert len(ahead) == n and APP in engine.detokenize(ahead)
    assert chat.messages == [] and store.list() == []  # nothing stored, nothing sent
    *_, last = chat.send("Rename name to person", ["src/app.py"])
    sent = engine.prompts[-1]
    assert sent[:n] == ahead and "Rename name to person" not in engine.detokenize(ahead)
    assert last.stats.prompt_evaluated == len(sent) - n  # the words and the template's tail only
    # the next turn: what is read ahead is the conversation so far, the reply included
    n2 = chat.read_ahead()
    assert engine.reads[-1][0][:len(sent)] == sent and n2 > len(sent)
    (tmp_path / "secret.txt").write_text("secret")
    with pytest.raises(OutsideRootError):  # refused as send() refuses it
        chat.read_ahead(["../secret.txt"])


def test_reading_ahead_reads_the_words_written_but_the_last_and_in_the_replys_mode(store, project):
    """The words are read as they are written, but the last (it may still grow, and
    its tokens with it): sending then reads that word and the template's tail. The
    engine is told the reply's params, whose mode says whether a draft model reads."""
    engine = FakeEngine(reply=lambda p: "ok")
    chat = _session(engine, store, project, params=GenerationParams(mode="draft", k=3))
    n = chat.read_ahead(["src/app.py"], words="Rename name to per")
    ahead = engine.detokenize(engine.reads[-1][0])
    assert len(engine.reads[-1][0]) == n and ahead.rstrip().endswith("Rename name to") and APP in ahead
    assert [params.mode for _, params in engine.reads] == ["draft"]
    assert chat.read_ahead(words="Hello") == chat.read_ahead() < n  # a first word only: the words not yet
    *_, last = chat.send("Rename name to person", ["src/app.py"])
    sent = engine.prompts[-1]
    assert engine.detokenize(sent).startswith(ahead)
    chat2 = _session(engine := FakeEngine(reply=lambda p: "ok"), store, project)
    chat2.read_ahead(["src/app.py"], words="Rename name to per")
    *_, last = chat2.send("Rename name to person", ["src/app.py"])
    assert engine.detokenize(engine.prompts[-1][-last.stats.prompt_evaluated:]).lstrip().startswith("person")


def test_a_session_without_a_project_folder_cannot_attach(store):
    with pytest.raises(FileAccessError):
        list(ChatSession(FakeEngine(), store=store, template="chatml").send("Look", ["x.py"]))


def test_the_edit_instructions_come_once_per_window():
    from edgespec.chat.attachments import Attachment
    from edgespec.chat.store import Message
    from edgespec.workspace.edits import EDIT_INSTRUCTIONS

    a, b = Attachment("a.py", "a = 1\n", "1" * 64), Attachment("b.py", "b = 1\n", "2" * 64)
    rendered = model_messages([Message("user", "one", attachments=[a]), Message("assistant", "ok"),
                               Message("user", "two", attachments=[b])])
    assert EDIT_INSTRUCTIONS.strip() in rendered[0]["content"]
    assert EDIT_INSTRUCTIONS.strip() not in rendered[2]["content"] and "b = 1" in rendered[2]["content"]


@pytest.mark.parametrize("text", ["Summarise this", "What did we decide about the release?",
                                  "explain how parse works", "Is there a bug in a.py?"])
def test_a_question_about_the_files_gets_no_edit_instructions(text):
    """With the rules for changed files before it, a small model answers "Summarise this" by
    writing the file out again (the bundled 1.5B did, in every place the rules were tried):
    a message that only asks is sent without them."""
    from edgespec.chat.attachments import Attachment
    from edgespec.chat.store import Message
    from edgespec.workspace.edits import EDIT_INSTRUCTIONS

    a = Attachment("a.py", "a = 1\n", "1" * 64)
    rendered = model_messages([Message("user", text, attachments=[a])])
    assert EDIT_INSTRUCTIONS.strip() not in rendered[0]["content"]
    assert "a = 1" in rendered[0]["content"] and rendered[0]["content"].endswith(text)


@pytest.mark.parametrize("text", ["Can you fix the bug?", "Rename name to person", "what if you added a test",
                                  "Résume ce fichier en trois lignes"])  # another language: the rules, as before
def test_a_message_that_may_ask_for_a_change_gets_the_edit_instructions(text):
    from edgespec.chat.attachments import Attachment
    from edgespec.chat.store import Message
    from edgespec.workspace.edits import EDIT_INSTRUCTIONS

    a = Attachment("a.py", "a = 1\n", "1" * 64)
    assert EDIT_INSTRUCTIONS.strip() in model_messages([Message("user", text, attachments=[a])])[0]["content"]


def test_the_edit_instructions_come_with_the_first_change_asked_for_after_a_question():
    from edgespec.chat.attachments import Attachment
    from edgespec.chat.store import Message
    from edgespec.workspace.edits import EDIT_INSTRUCTIONS

    a = Attachment("a.py", "a = 1\n", "1" * 64)
    messages = [Message("user", "What does a.py do?", attachments=[a]), Message("assistant", "It sets a."),
                Message("user", "Change a to 2"), Message("assistant", "a.py ..."), Message("user", "And b?")]
    rendered = model_messages(messages)
    assert [EDIT_INSTRUCTIONS.strip() in m["content"] for m in rendered] == [False, False, True, False, False]
    assert rendered[2]["content"].endswith("Change a to 2")
    assert model_messages(messages[:3]) == rendered[:3]  # each turn renders the earlier ones the same: the cache holds


# -- the command line ---------------------------------------------------------------------

@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))


def _load(monkeypatch, engine):
    for command in (generate, chats):
        monkeypatch.setattr(command, "engine_from_args", lambda args, progress=None: engine)


def test_generate_file_apply_yes_writes_the_edit_and_prints_the_diff(home, project, monkeypatch, capsys):
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file", "src/app.py", "--apply", "--yes", "Rename name"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "-def greet(name):" in out and "+def greet(person):" in out
    assert (project / "src" / "app.py").read_text() == RENAMED



def test_a_reply_writing_a_file_twice_says_the_last_version_is_applied(home, project, monkeypatch, capsys):
    """generate --apply and chat each print one line naming the file written twice: the
    diff shows only the last version, and nothing else tells the user there was another."""
    reply = _whole("src/app.py", APP.replace("hi", "hello")) + _whole("src/app.py", RENAMED)
    _load(monkeypatch, FakeEngine(reply=lambda p: reply))
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file", "src/app.py", "--apply", "--yes", "Rename name"]
    assert cli.main(argv) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "whole 2 times" in line]
    assert said == ["edgespec: note: the reply writes src/app.py whole 2 times: the last version is the one shown and applied"]
    assert (project / "src" / "app.py").read_text() == RENAMED
    (project / "src" / "app.py").write_text(APP)
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Rename name"]) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if "whole 2 times" in line] == said

def test_generate_refuses_files_that_do_not_fit_naming_each_with_its_tokens(home, project, monkeypatch, capsys):
    (project / "big.py").write_text("x = 1\n" * 400)
    engine = FakeEngine(n_ctx=512)
    _load(monkeypatch, engine)
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file", "big.py", "Look"]
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "big.py" in err and "context holds 512" in err and engine.prompts == []


def test_generate_apply_refuses_without_a_terminal_and_writes_nothing(home, project, monkeypatch, capsys):
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file", "src/app.py", "--apply", "Rename name"]
    assert cli.main(argv) != 0
    assert (project / "src" / "app.py").read_text() == APP


def test_chat_file_then_apply_writes_the_reply_and_refuses_a_stale_file(home, project, monkeypatch, capsys):
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Rename name"]) == 0
    assert "src/app.py" in capsys.readouterr().err  # it says the reply changes a file
    (project / "src" / "app.py").write_text(APP + "# mine\n")
    assert cli.main(["apply", "--yes"]) != 0  # changed on disk since the reply saw it
    assert (project / "src" / "app.py").read_text() == APP + "# mine\n"
    (project / "src" / "app.py").write_text(APP)
    monkeypatch.chdir("/")
    assert cli.main(["apply", "--yes"]) == 0, capsys.readouterr().err  # the conversation's own folder
    assert (project / "src" / "app.py").read_text() == RENAMED
    with ConversationStore() as store:
        assert [a.origin for a in store.messages(1)[-1].attachments] == ["applied"]
    capsys.readouterr()
    assert cli.main(["apply", "--yes"]) == 1  # again: applied already, not "changed on disk"
    assert "applied already" in capsys.readouterr().err
    assert (project / "src" / "app.py").read_text() == RENAMED


def test_applying_two_files_where_the_second_is_read_only_writes_neither(project, tmp_path):
    """Applying a reply is all or nothing: the first file is not written when the second cannot be."""
    from edgespec.chat.attachments import PendingEdit, apply_edits
    from edgespec.errors import WriteError
    from edgespec.workspace.edits import FileEdit
    from edgespec.workspace.root import sha256_hex

    (project / "lib").mkdir()
    (project / "lib" / "b.py").write_text("b = 1\n")
    (project / "lib" / "b.py").chmod(0o444)
    edits = [PendingEdit(FileEdit(path, new, "whole"), sha256_hex((project / path).read_bytes()), old)
             for path, old, new in (("src/app.py", APP, RENAMED), ("lib/b.py", "b = 1\n", "b = 2\n"))]
    with pytest.raises(WriteError, match="lib/b.py is read-only"):
        apply_edits(Workspace(project), edits, allow_new=False, backups=tmp_path / "undo")
    assert (project / "src" / "app.py").read_text() == APP
    assert (project / "lib" / "b.py").read_text() == "b = 1\n"


def test_apply_without_edits_is_a_clear_error(home, project, monkeypatch):
    _load(monkeypatch, FakeEngine(reply=lambda p: "No change needed."))
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Anything?"]) == 0
    assert cli.main(["apply", "--yes"]) == 1


def test_an_imported_conversation_applies_in_the_current_folder_not_one_the_file_names(
        home, project, tmp_path, monkeypatch, capsys):
    victim = tmp_path / "victim"
    (victim / "src").mkdir(parents=True)
    (victim / "src" / "app.py").write_text(APP)
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Rename name"]) == 0
    with ConversationStore() as store:
        data = export_json(store, 1)
    data["settings"]["root"] = str(victim)  # a hostile file: "write into the victim's folder"
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert cli.main(["import", str(tmp_path / "t.json")]) == 0
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "--conversation", "2"]) == 0
    assert (victim / "src" / "app.py").read_text() == APP
    assert (project / "src" / "app.py").read_text() == RENAMED
    assert f"into {project}" in capsys.readouterr().err  # --yes says where it writes


class Terminal:
    """A stdin that is a terminal, answering `answer` to the one question asked."""

    def __init__(self, answer: str):
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


def test_apply_asks_naming_the_folder_it_writes_into(home, project, monkeypatch, capsys):
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    assert cli.main(["chat", "--new", "--template", "chatml", "--root", str(project), "--file", "src/app.py",
                     "--once", "Rename name"]) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    assert cli.main(["apply"]) == 0
    err = capsys.readouterr().err
    assert f"into {project}?" in err and "nothing applied" in err
    assert (project / "src" / "app.py").read_text() == APP


# -- one real round trip: the bundled coder renames in an attached file --------------------

SMALL = '''def total(prices):
    """The sum of the prices."""
    return sum(prices)


def receipt(prices):
    return f"{len(prices)} items, {total(prices):.2f}"
'''


@pytest.mark.slow
@pytest.mark.qwen
def test_the_bundled_coder_renames_in_an_attached_file_and_exact_equals_plain(qwen_pair, tmp_path):
    """A rename asked of an attached file comes back as an edit that applies; under
    --exact the file written with speculation is the one plain decoding writes."""
    from edgespec.chat.attachments import apply_edits
    from edgespec.engine.events import GenerationParams
    from edgespec.engine.runtime import Engine, ModelSettings

    _, target, draft = qwen_pair
    written = {}
    with Engine.load(ModelSettings(target, n_ctx=2048, exact=True), ModelSettings(draft, n_ctx=2048)) as engine:
        for mode in ("plain", "auto"):
            folder = tmp_path / mode
            folder.mkdir()
            (folder / "prices.py").write_text(SMALL)
            session = ChatSession(engine, workspace=Workspace(folder),
                                  params=GenerationParams(mode=mode, max_tokens=200))
            list(session.send("Rename the function `total` to `sum_prices` everywhere in prices.py.",
                              ["prices.py"]))
            edits = [e for e in session.pending_edits() if not e.edit.new]  # it may invent a file beside it
            assert [e.path for e in edits] == ["prices.py"], session.messages[-1].content
            apply_edits(Workspace(folder), edits, allow_new=False, backups=tmp_path / "undo")
            written[mode] = (folder / "prices.py").read_text()
    assert written["plain"] == SMALL.replace("total(", "sum_prices(")
    assert written["auto"] == written["plain"]


def test_each_file_shown_is_a_labelled_region_of_the_prompt(store, project):
    """What lookup drafts from a file can be credited to it: the prompt's region
    labelled with the file's path spells the file."""
    from edgespec.chat.prompt import PromptEncoder

    engine = FakeEngine(reply=lambda p: "ok")
    chat = _session(engine, store, project)
    list(chat.send("Rename name", ["src/app.py"]))
    prompt = PromptEncoder(engine, template="chatml").encode(model_messages(chat.messages[:-1]))
    [region] = [r for r in prompt.regions if r.label == "file:src/app.py"]
    assert engine.detokenize(prompt.tokens[region.start:region.end]) == APP
    assert prompt.tokens == engine.prompts[-1]


def test_chat_says_when_a_reply_s_diff_does_not_apply_and_keeps_the_reply(home, project, monkeypatch, capsys):
    reply = "```diff\n--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n-def nothing_like_it():\n+def x():\n```\n"
    _load(monkeypatch, FakeEngine(reply=lambda p: reply))
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Change it"]) == 0
    with ConversationStore() as store:
        assert store.messages(1)[-1].content == reply
    assert cli.main(["apply", "--yes"]) == 1  # EditError: a clear message, the file as it was
    assert (project / "src" / "app.py").read_text() == APP


def test_the_settled_words_are_those_before_the_word_being_written():
    from edgespec.chat.session import settled_words

    assert settled_words("Rename name to per") == "Rename name to"
    assert settled_words("Rename name to ") == "Rename name to"  # the last word is whole
    assert settled_words("line one\nline two x") == "line one\nline two"
    assert settled_words("Hello") == settled_words("") == settled_words("   ") == ""
    assert settled_words("See " + "x" * 100_000) == "See"  # a pasted blob: one long word


# -- names a line cannot hold ---------------------------------------------------------------

ODD = "odd\nname.py"
"""A file name with a newline: shown as it is, its path line would be two, the second naming name.py."""


def test_a_name_with_a_control_character_is_shown_to_the_model_quoted_on_one_line(store, project):
    (project / ODD).write_text(APP)
    engine = FakeEngine(reply=lambda p: "ok")
    list(_session(engine, store, project).send("Rename name to person", [ODD]))
    lines = _prompt(engine).splitlines()
    assert '"odd\\nname.py"' in lines and "name.py" not in lines
    assert lines[lines.index('"odd\\nname.py"') + 1] == "```python"


def test_a_reply_naming_the_quoted_name_edits_that_file_and_its_diff_headers_are_one_line_each(
        home, project, monkeypatch, capsys):
    (project / ODD).write_text(APP)
    (project / "name.py").write_text(APP)  # what the second half of the name would reach
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole('"odd\\nname.py"', RENAMED)))
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file", ODD, "--file", "name.py",
            "--apply", "--yes", "Rename name"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert '--- "a/odd\\nname.py"\n+++ "b/odd\\nname.py"\n' in out
    assert (project / ODD).read_text() == RENAMED and (project / "name.py").read_text() == APP


@pytest.mark.parametrize("change", ["grown past the limit", "a folder now"])
def test_a_file_that_is_no_longer_a_text_file_within_the_limit_is_refused_as_changed_not_to_be_attached(
        project, tmp_path, change):
    """The refusal of an attach ("attach a smaller file", "attach the files inside it") is no
    advice for a file a reply changes: it changed on disk since, which sending a message shows."""
    from edgespec.chat.attachments import PendingEdit, apply_edits
    from edgespec.errors import StaleFileError
    from edgespec.workspace.edits import FileEdit
    from edgespec.workspace.root import MAX_FILE_BYTES, sha256_hex

    path = project / "src" / "app.py"
    edit = PendingEdit(FileEdit("src/app.py", RENAMED, "whole"), sha256_hex(path.read_bytes()), APP)
    if change == "grown past the limit":
        path.write_text("x = 1\n" * (MAX_FILE_BYTES // 6 + 1))
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(StaleFileError, match="src/app.py changed on disk") as refused:
        apply_edits(Workspace(project), [edit], allow_new=False, backups=tmp_path / "undo")
    assert "attach" not in str(refused.value)


def test_root_given_with_a_tilde_is_the_folder_in_the_home_folder(home, project, monkeypatch, capsys):
    """As a model's path and --out are: `--root=~/project` is not expanded by the shell."""
    monkeypatch.setenv("HOME", str(project.parent))
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    argv = ["generate", "--template", "chatml", "--root", "~/project", "--file", "src/app.py", "--apply", "--yes",
            "Rename name"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (project / "src" / "app.py").read_text() == RENAMED


def test_a_name_with_a_newline_is_one_line_in_the_markdown_export(store, project):
    (project / ODD).write_text(APP)
    chat = _session(FakeEngine(reply=lambda p: "ok"), store, project)
    list(chat.send("Look", [ODD]))
    assert '**"odd\\nname.py"**' in export_markdown(store, chat.conversation_id).splitlines()


def test_a_file_given_with_a_tilde_is_the_file_in_the_home_folder(home, project, monkeypatch, capsys):
    """As --root is: `--file=~/src/app.py` is not expanded by the shell."""
    monkeypatch.setenv("HOME", str(project))
    _load(monkeypatch, FakeEngine(reply=lambda p: _whole("src/app.py", RENAMED)))
    argv = ["generate", "--template", "chatml", "--root", str(project), "--file=~/src/app.py", "--apply", "--yes",
            "Rename name"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (project / "src" / "app.py").read_text() == RENAMED


def test_a_file_deleted_since_the_reply_is_refused_as_deleted_and_left_deleted(project, tmp_path):
    """Applying would create it again, which the user may not want: refused, naming the cause."""
    from edgespec.chat.attachments import PendingEdit, apply_edits
    from edgespec.errors import StaleFileError
    from edgespec.workspace.edits import FileEdit
    from edgespec.workspace.root import sha256_hex

    path = project / "src" / "app.py"
    edit = PendingEdit(FileEdit("src/app.py", RENAMED, "whole"), sha256_hex(path.read_bytes()), APP)
    path.unlink()
    with pytest.raises(StaleFileError, match="src/app.py was deleted") as refused:
        apply_edits(Workspace(project), [edit], allow_new=False, backups=tmp_path / "undo")
    assert "changed on disk" not in str(refused.value)
    assert not path.exists()


def test_a_file_that_is_no_longer_utf8_is_named_when_it_cannot_be_sent_again(home, project, monkeypatch, capsys):
    """A file changed on disk goes with the next message; one that can no longer be read as
    text cannot, and the chat says so rather than answer from the old copy unannounced."""
    engine = FakeEngine(reply=lambda p: "ok")
    _load(monkeypatch, engine)
    monkeypatch.chdir(project)
    assert cli.main(["chat", "--new", "--template", "chatml", "--file", "src/app.py", "--once", "Look"]) == 0
    capsys.readouterr()
    (project / "src" / "app.py").write_bytes(APP.encode() + b"caf\xe9\n")
    assert cli.main(["chat", "--template", "chatml", "--once", "Now?"]) == 0
    err = capsys.readouterr().err
    assert "src/app.py changed on disk" in err and "not UTF-8" in err, err
    assert "caf" not in _prompt(engine)
