"""The app on the user's files (Pilot, fake engine): attach by `@` with completion,
by the picker and by pasting a path; remove a chip; the reply's diff; apply and
undo byte for byte; a file changed on disk is refused; reopening shows them."""

import asyncio
import threading

import pytest
from textual.widgets import OptionList

from edgespec.chat import ConversationStore
from edgespec.tui.screens.diff import DiffScreen
from edgespec.tui.screens.picker import FilePickerScreen, ProjectTree
from edgespec.tui.widgets.chips import AttachmentBar, ChipView
from edgespec.tui.widgets.prompt_input import PromptInput
from edgespec.tui.widgets.conversation import Conversation
from tests.app_helpers import boxes, make_app, send, wait_for
from tests.fakes import SlowDraftReader, SlowReader, SpecFakeEngine

APP = "def greet(name):\n    print('hi', name)\n"
RENAMED = "def greet(person):\n    print('hi', person)\n"
REPLY = f"Renamed.\n\nsrc/app.py\n```python\n{RENAMED}```\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_bytes(APP.encode())
    (root / "notes.txt").write_text("notes\n")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return root


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


async def _ready(pilot):
    await wait_for(pilot, lambda: pilot.app.model_state == "ready")


async def _renamed_then_changed_on_disk(pilot, project) -> None:
    """A reply renaming in src/app.py, its diff closed unapplied, and the file then changed by the user."""
    await _ready(pilot)
    await send(pilot, "Rename name @src/app.py")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, DiffScreen))
    await pilot.press("escape")
    (project / "src" / "app.py").write_text(APP + "# mine\n")


def _chips(app) -> list[str]:
    return app.query_one(AttachmentBar).paths


async def _focused_prompt(pilot) -> PromptInput:
    """The prompt, focused, once the models are ready."""
    await _ready(pilot)
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    return prompt


async def test_at_completion_attaches_a_file_as_a_chip_and_sends_it(store, project):
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        await pilot.press("@", "s")
        await wait_for(pilot, lambda: prompt.completing)
        assert [str(o.prompt) for o in app.query_one("#completions", OptionList).options] == ["src/"]
        await pilot.press("tab")  # a folder completes the path
        await wait_for(pilot, lambda: prompt.text == "@src/")
        await pilot.press("tab")  # its one file becomes a chip and leaves the text
        await wait_for(pilot, lambda: _chips(app) == ["src/app.py"])
        assert prompt.text == ""
        await send(pilot, "Rename name")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert _chips(app) == [] and boxes(app)[0].attachments == ["src/app.py"]
        assert APP in app.engines[0].detokenize(app.engines[0].prompts[-1])


async def test_escape_closes_the_path_completions_and_typing_opens_them_again(store, project):
    """Esc hides the `@path` completions, keeping the text, and Tab then leaves the prompt
    as it does elsewhere; they stayed up, and Tab still took one, until the word was erased."""
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        options = app.query_one("#completions", OptionList)
        await pilot.press("@", "s")
        await wait_for(pilot, lambda: prompt.completing)
        await pilot.press("escape")
        assert not prompt.completing and not options.display and prompt.text == "@s"
        await pilot.press("r")
        await wait_for(pilot, lambda: prompt.completing and options.display)


async def test_an_attached_file_is_read_ahead_while_the_message_is_written(store, project):
    """Attaching reads the file into the KV cache at once (ChatSession.read_ahead):
    the message, sent later, is read on top of it."""
    from textual import events

    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        engine = app.engines[0]
        app.post_message(events.Paste("src/app.py"))
        await wait_for(pilot, lambda: engine.reads and APP in engine.detokenize(engine.reads[-1][0]))
        ahead, _ = engine.reads[-1]
        assert store.list() == []  # read, not sent
        await send(pilot, "Rename name")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        sent = engine.prompts[-1]
        assert sent[:len(ahead)] == ahead and "Rename name" in engine.detokenize(sent[len(ahead):])


async def test_the_words_are_read_ahead_when_the_typing_pauses_and_the_reply_after_it(store, project):
    """A pause in the typing reads the words so far but the last into the models
    (ChatSession.read_ahead, in the reply's mode): the message sent is read on top
    of them. Once a reply has ended, the conversation with it is read ahead too
    (a draft model that sat the reply out catches up while the next is written)."""
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        engine = app.engines[0]
        await pilot.press(*"Say hello to the wor")
        await wait_for(pilot, lambda: engine.reads and "the" in engine.detokenize(engine.reads[-1][0]))
        ahead, params = engine.reads[-1]
        assert engine.detokenize(ahead).rstrip().endswith("Say hello to the") and params.mode == "auto"
        assert engine.prompts == [] and store.list() == []  # read, not sent
        await pilot.press(*"ld", "enter")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        sent = engine.prompts[-1]
        assert sent[:len(ahead)] == ahead and prompt.text == ""
        await wait_for(pilot, lambda: len(engine.reads[-1][0]) > len(sent))
        assert engine.reads[-1][0][:len(sent)] == sent and "ok" in engine.detokenize(engine.reads[-1][0][len(sent):])


async def test_a_message_sent_while_the_draft_model_reads_the_last_reply_does_not_wait_for_it(store, project):
    """Once a reply ends, a draft model that sat it out reads it while the next message
    is written (seconds at a long context on a CPU); a message sent meanwhile stops that
    reading (the reply's own warming decides whether to read on) and is read at once."""
    engine = SlowDraftReader(reply=lambda prompt: "ok")
    app = make_app(store, load=lambda choice, settings, progress: engine, root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await wait_for(pilot, engine.drafting_read.is_set)  # the reply read ahead, into the draft model
        await send(pilot, "And again")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 4)
        assert engine.draft_batches_read and engine.draft_batches_read[0] < 200, engine.draft_batches_read
        assert "And again" in engine.detokenize(engine.prompts[-1])


async def test_a_message_sent_while_its_file_is_read_waits_for_the_target_not_the_draft_model(store, project):
    """Sent while the attached file is read into the target (what the message needs: a
    batch stopped mid-way would be read again), the message waits for that reading, and
    the draft model's reading of the file, which would come next, does not begin."""
    from textual import events

    engine = SlowDraftReader(target_batches=20, reply=lambda prompt: "ok")
    app = make_app(store, load=lambda choice, settings, progress: engine, root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        app.post_message(events.Paste("src/app.py"))
        await wait_for(pilot, lambda: _chips(app) == ["src/app.py"] and engine.target_reading.is_set())
        await send(pilot, "Rename name")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert engine.target_batches_read[0] == 20 and engine.draft_batches_read[0] == 0
        assert APP in engine.detokenize(engine.prompts[-1])


async def test_a_reading_ahead_that_fails_leaves_the_app_running_and_sending_works(store, project, monkeypatch):
    """Reading ahead is work the user did not ask for: whatever it raises, the app
    goes on, and the message is sent (and read) in full."""
    from textual import events

    from edgespec.chat.session import ChatSession

    def broken(self, files=(), words=""):
        raise RuntimeError("llama_decode failed")

    monkeypatch.setattr(ChatSession, "read_ahead", broken)
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        app.post_message(events.Paste("src/app.py"))
        await wait_for(pilot, lambda: _chips(app) == ["src/app.py"])
        await pilot.pause(0.2)
        assert app.is_running
        await send(pilot, "Rename name")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert APP in app.engines[0].detokenize(app.engines[0].prompts[-1])


def _slow_reader_app(store, project):
    """The app on an engine that reads the first prompt for 10 s, later ones at once."""
    engine = SlowReader(batches=200, later=1, reply=lambda prompt: "ok")
    return make_app(store, load=lambda choice, settings, progress: engine, root=project), engine


async def _reading_ahead(pilot, engine) -> None:
    """A file attached by pasting its path, its reading ahead under way (10 s if left alone)."""
    from textual import events

    await _focused_prompt(pilot)
    pilot.app.post_message(events.Paste("src/app.py"))
    await wait_for(pilot, lambda: _chips(pilot.app) == ["src/app.py"] and engine.reading.is_set())


async def test_removing_the_file_stops_its_reading_ahead_and_sending_does_not_wait_for_it(store, project):
    """A file attached by mistake and removed at once: its reading (a minute for a
    large file on a CPU) is stopped, and the message sent next is read at once."""
    app, engine = _slow_reader_app(store, project)
    async with app.run_test() as pilot:
        await _reading_ahead(pilot, engine)
        app.query_one(ChipView).focus()
        await pilot.press("delete")
        await wait_for(pilot, lambda: _chips(app) == [] and engine.batches_read, timeout=2)
        assert engine.batches_read[0] < 100
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2, timeout=3)
        assert APP not in engine.detokenize(engine.prompts[-1])


@pytest.mark.parametrize("key, chips", [("escape", ["src/app.py"]), ("ctrl+n", None)],
                         ids=["escape", "another conversation"])
async def test_escape_or_another_conversation_stops_a_reading_ahead(store, project, key, chips):
    app, engine = _slow_reader_app(store, project)
    async with app.run_test() as pilot:
        await _reading_ahead(pilot, engine)
        await pilot.press(key)
        await wait_for(pilot, lambda: engine.batches_read, timeout=2)
        assert engine.batches_read[0] < 100
        if chips is not None:  # Esc stops the reading, not the message: its file stays
            assert _chips(app) == chips


async def test_the_picker_attaches_and_a_chip_can_be_removed_before_sending(store, project):
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FilePickerScreen))
        tree = app.screen.query_one(ProjectTree)
        await wait_for(pilot, lambda: tree.root.children)
        notes = next(n for n in tree.root.children if n.data.path.name == "notes.txt")
        tree.select_node(notes)
        await wait_for(pilot, lambda: _chips(app) == ["notes.txt"])
        app.query_one(ChipView).focus()
        await pilot.press("delete")
        await wait_for(pilot, lambda: _chips(app) == [])


@pytest.mark.parametrize("name", ["outside.txt", "loop.txt"])
async def test_a_link_out_of_the_project_chosen_in_the_picker_is_refused_not_a_crash(store, project, tmp_path, name):
    """The picker lists symlinks; Enter on one leading outside the project (or on a loop)
    raised out of the picker and ended the app, losing the message being written."""
    import os

    (tmp_path / "secret.txt").write_text("secret\n")
    os.symlink(tmp_path / "secret.txt", project / "outside.txt")
    os.symlink(project / "loop.txt", project / "loop.txt")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        prompt.insert("my message")
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FilePickerScreen))
        tree = app.screen.query_one(ProjectTree)
        await wait_for(pilot, lambda: tree.root.children)
        tree.select_node(next(n for n in tree.root.children if n.data.path.name == name))
        await wait_for(pilot, lambda: app.notes)
        assert "outside the project" in app.notes[-1] or "cannot be resolved" in app.notes[-1], app.notes
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, FilePickerScreen))
        assert prompt.text == "my message" and _chips(app) == []


async def test_pasting_a_path_attaches_the_file_and_other_text_is_pasted(store, project):
    from textual import events

    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        app.post_message(events.Paste("src/app.py"))
        await wait_for(pilot, lambda: _chips(app) == ["src/app.py"])
        app.post_message(events.Paste("src/none.py"))
        await pilot.pause()
        assert prompt.text == "src/none.py"


async def test_a_pasted_path_to_a_link_out_of_the_project_says_why_it_is_not_attached(store, project, tmp_path):
    """It was pasted as text, silently: the user believed the file attached."""
    import os

    from textual import events

    (tmp_path / "secret.txt").write_text("secret\n")
    os.symlink(tmp_path / "secret.txt", project / "outside.txt")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        app.post_message(events.Paste("outside.txt"))
        await wait_for(pilot, lambda: app.notes)
        assert "outside the project" in app.notes[-1] and _chips(app) == []
        assert prompt.text == "outside.txt"
        app.post_message(events.Paste("no such file.txt"))  # a path to nothing is only text
        await pilot.pause()
        assert len(app.notes) == 1


async def test_a_message_whose_at_path_leads_out_of_the_project_is_not_sent(store, project, tmp_path):
    """`@link` to a file outside the project was sent without the file, silently: the
    model answered about a file it never saw."""
    import os

    (tmp_path / "secret.txt").write_text("secret\n")
    os.symlink(tmp_path / "secret.txt", project / "outside.txt")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        prompt.insert("what is in @outside.txt")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.notes)
        assert "outside the project" in app.notes[-1] and boxes(app) == []
        assert prompt.text == "what is in @outside.txt"
        prompt.clear()
        await send(pilot, "mail me @ noon, or @someone")  # an @ that names nothing is only text
        await wait_for(pilot, lambda: len(boxes(app)) == 2 and not app.chat.generating)


async def test_the_diff_appears_after_a_reply_and_apply_then_undo_restore_the_bytes(store, project):
    app = make_app(store, reply=REPLY, root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Rename name @src/app.py")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        assert "+def greet(person):" in str(app.screen.query(".diff-body").first().render())
        await pilot.press("a")
        await wait_for(pilot, lambda: (project / "src" / "app.py").read_bytes() == RENAMED.encode())
        await pilot.press("f9")
        await wait_for(pilot, lambda: (project / "src" / "app.py").read_bytes() == APP.encode())



async def test_the_diff_of_a_file_the_reply_writes_twice_says_the_last_version_is_applied(store, project):
    first = "def greet(name):\n    print('hello', name)\n"
    reply = f"src/app.py\n```python\n{first}```\nBetter:\n{REPLY}"
    app = make_app(store, reply=reply, root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Rename name @src/app.py")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        said = [str(label.render()) for label in app.screen.query(".versions")]
        assert said == ["The reply writes src/app.py whole 2 times: the last version is the one shown and applied."]

async def test_a_message_being_written_when_the_reply_ends_keeps_its_keys_from_the_diff(store, project):
    """The diff opened by itself when a reply ended and took the keys: the next message's
    "a" applied the edits unreviewed (and was missing from the message). While a message
    is being written the reply's edits are announced instead, for F7."""
    import threading

    hold = threading.Event()
    app = make_app(store, reply=REPLY, root=project, hold=hold, hold_after=len(REPLY) - 3)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Rename name @src/app.py", key=False)
        await wait_for(pilot, lambda: app.chat.generating and app.engines[0].generating)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"Now c")
        hold.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        await pilot.press(*"an you add a docstring")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, DiffScreen) and prompt.text == "Now can you add a docstring"
        assert (project / "src" / "app.py").read_bytes() == APP.encode()
        assert any("F7" in note for note in app.notes), app.notes
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen))


async def test_a_file_changed_on_disk_before_apply_is_refused(store, project):
    app = make_app(store, reply=REPLY, root=project)
    async with app.run_test() as pilot:
        await _renamed_then_changed_on_disk(pilot, project)
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        assert app.screen.problems
        await pilot.press("a")
        await pilot.pause()
        assert (project / "src" / "app.py").read_text() == APP + "# mine\n"


async def test_a_reopened_conversation_shows_its_attachments(store, project):
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Look @notes.txt")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
    again = make_app(store, reply="ok", root=project)
    async with again.run_test() as pilot:
        await _ready(pilot)
        await again.chat.open_conversation(store.latest())
        await wait_for(pilot, lambda: len(boxes(again)) == 2)
        assert boxes(again)[0].attachments == ["notes.txt"]


async def test_a_reply_whose_diff_does_not_apply_is_said_and_the_file_kept(store, project):
    reply = "```diff\n--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n-def nothing_like_it():\n+def x():\n```\n"
    app = make_app(store, reply=reply, root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Change it @src/app.py")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await wait_for(pilot, lambda: app.notes)  # said, not raised: the app goes on
        assert not isinstance(app.screen, DiffScreen) and app.is_running
        assert (project / "src" / "app.py").read_bytes() == APP.encode()


async def test_a_message_whose_file_is_gone_comes_back_to_the_prompt_and_the_replies_stay(store, project):
    """A send refused before anything is stored (a chip's file deleted meanwhile) is a
    notice; the view shows what is stored, no box of the refused message and no copy
    of the last reply; the text and the chips are back to fix and send again; and
    Ctrl+R regenerates the reply on screen."""
    from textual import events

    from tests.fakes import FakeEngine

    app = make_app(store, root=project, load=lambda choice, settings, progress: FakeEngine())
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        app.post_message(events.Paste("notes.txt"))
        await wait_for(pilot, lambda: _chips(app) == ["notes.txt"])
        (project / "notes.txt").unlink()
        await send(pilot, "Summarise it")
        await wait_for(pilot, lambda: not app.chat.generating and any("notes.txt" in n for n in app.notes))
        await pilot.pause()
        assert [(b.role, b.content) for b in boxes(app)] == [("user", "Hello"), ("assistant", "reply 1")]
        assert app.query_one(PromptInput).text == "Summarise it" and _chips(app) == ["notes.txt"]
        cid = app.chat.conversation_id
        assert [m.content for m in store.messages(cid) if m.role != "system"] == ["Hello", "reply 1"]
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "reply 2")
        assert [m.content for m in store.messages(cid) if m.role != "system"] == ["Hello", "reply 2"]


async def test_edit_and_resend_sends_a_file_changed_on_disk_and_shows_the_files(store, project):
    from textual.widgets import TextArea

    from edgespec.tui.screens.dialogs import TextPromptScreen

    app = make_app(store, reply=REPLY, root=project)
    async with app.run_test() as pilot:
        await _renamed_then_changed_on_disk(pilot, project)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        app.screen.query_one(TextArea).load_text("Rename name, please")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        assert not app.screen.problems  # the reply saw the file as it is: it applies
        assert APP + "# mine\n" in app.engines[0].detokenize(app.engines[0].prompts[-1])
        assert [(b.content, b.attachments) for b in boxes(app) if b.role == "user"] == [
            ("Rename name, please", ["src/app.py"])]


async def test_after_an_apply_the_reply_has_nothing_left_to_apply_until_it_is_undone(store, project):
    app = make_app(store, reply=REPLY, root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Rename name @src/app.py")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        await pilot.press("a")
        await wait_for(pilot, lambda: (project / "src" / "app.py").read_bytes() == RENAMED.encode())
        await pilot.press("f7")
        await wait_for(pilot, lambda: app.notes)
        assert not isinstance(app.screen, DiffScreen)  # not the user's own edit called a change on disk
        assert "applied" in app.notes[-1] and "F9" in app.notes[-1], app.notes
        await pilot.press("f9")
        await wait_for(pilot, lambda: (project / "src" / "app.py").read_bytes() == APP.encode())
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        assert not app.screen.problems


async def test_a_failed_apply_that_leaves_a_file_changed_says_partly_applied(store, project, monkeypatch):
    """A reply changing two files whose second write fails, and the first then cannot be put
    back: the notification's title names the file left changed, not "Not applied"."""
    import errno
    import os

    reply = f"src/app.py\n```python\n{RENAMED}```\n\nnotes.txt\n```\nnew notes\n```\n"
    app = make_app(store, reply=reply, root=project)
    titles = []
    notify = app.notify

    def recording(message, *args, **kw):
        titles.append(kw.get("title"))
        return notify(message, *args, **kw)

    app.notify = recording
    real = os.replace
    app_writes = []

    def replace(source, target):
        if ".notes.txt." in str(source):
            raise OSError(errno.ENOSPC, "No space left on device")
        if ".app.py." in str(source):
            app_writes.append(target)
            if len(app_writes) > 1:  # the write goes through, putting it back does not
                raise OSError(errno.EACCES, "Permission denied")
        return real(source, target)

    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Rename name @src/app.py @notes.txt")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        monkeypatch.setattr(os, "replace", replace)
        await pilot.press("a")
        await wait_for(pilot, lambda: any("could not be put back" in n for n in app.notes))
        monkeypatch.undo()
    assert "Partly applied: src/app.py left changed" in titles and "Not applied" not in titles
    assert (project / "src" / "app.py").read_bytes() == RENAMED.encode()
    assert (project / "notes.txt").read_text() == "notes\n"


def test_the_diff_of_a_file_deleted_since_the_reply_is_against_what_it_saw_and_says_deleted(project):
    """Not every line shown as added to an empty file, under "changed on disk"."""
    import hashlib

    from edgespec.chat.attachments import PendingEdit
    from edgespec.tui.screens.diff import review
    from edgespec.workspace import FileEdit, Workspace

    pending = PendingEdit(FileEdit("src/app.py", RENAMED, "whole"), hashlib.sha256(APP.encode()).hexdigest(), APP)
    (project / "src" / "app.py").unlink()
    diff, problem = review(Workspace(project), pending)
    assert diff == pending.diff
    assert problem is not None and "deleted" in problem


async def test_a_file_whose_name_reads_as_markup_is_named_as_written_in_the_notice(store, project):
    """A notice names the user's file (not attached: binary); its path was read as
    markup: `[bold]x.bin` was shown as `x.bin`, and `[/]x.bin` (a folder `[` with a file
    `]x.bin`) raised MarkupError as the notice was drawn, ending the app."""
    from textual import events
    from textual.widgets._toast import Toast

    (project / "[").mkdir()
    for name in ("[/]x.bin", "[bold]y.bin"):
        (project / name).write_bytes(b"\x00\x01" * 8)
    app = make_app(store, reply="ok", root=project)
    async with app.run_test(notifications=True) as pilot:
        await _focused_prompt(pilot)
        for name in ("[/]x.bin", "[bold]y.bin"):
            app.post_message(events.Paste(name))
            await wait_for(pilot, lambda n=name: any(n in str(t.render()) for t in app.screen.query(Toast)))
        assert app.is_running


async def test_the_picker_names_a_project_folder_whose_name_reads_as_markup_as_written(store, tmp_path):
    """The picker's title read the project folder as markup: `[WIP] app` was shown as ` app`."""
    from textual.widgets import Label

    root = tmp_path / "[WIP] app"
    root.mkdir()
    (root / "notes.txt").write_text("notes\n")
    app = make_app(store, reply="ok", root=root)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FilePickerScreen))
        assert f"from {root.resolve()} " in str(app.screen.query_one(Label).render())


async def test_a_replys_statistics_name_an_attached_file_as_written(store, project):
    """The line under a reply names the files its accepted tokens were looked up in;
    it was read as markup: a file at `[/]x.py` (a folder `[`) raised MarkupError as the
    reply ended, ending the app, and `[bold]y.py` was named `y.py`."""
    from tests.fakes import SpecFakeEngine

    class Sourced(SpecFakeEngine):
        sources = True

    (project / "[").mkdir()
    for name in ("[/]x.py", "[bold]y.py"):
        (project / name).write_text("x = 1\n")
    app = make_app(store, reply="word " * 12, root=project, engine_cls=Sourced)
    async with app.run_test() as pilot:
        await _ready(pilot)
        for n, name in enumerate(("[/]x.py", "[bold]y.py"), start=1):
            await send(pilot, f"About @{name}")
            await wait_for(pilot, lambda n=n: not app.chat.generating and len(boxes(app)) == 2 * n)
            await pilot.pause()
            assert f"lookup in file {name}" in str(boxes(app)[-1].query_one(".stats").render())


async def test_a_replys_statistics_name_a_file_holding_a_terminal_escape_without_it(store, project):
    """The status line and the line under a reply name the files tokens were looked up
    in: a name holding a terminal escape was written to the terminal as it was."""
    from textual import events

    from tests.fakes import SpecFakeEngine

    class Sourced(SpecFakeEngine):
        sources = True

    (project / f"{ESCAPE}.py").write_text("x = 1\n")
    app = make_app(store, reply="word " * 12, root=project, engine_cls=Sourced)
    async with app.run_test(size=(200, 40)) as pilot:
        await _focused_prompt(pilot)
        app.post_message(events.Paste(f"{ESCAPE}.py"))
        await wait_for(pilot, lambda: _chips(app) == [f"{ESCAPE}.py"])
        await send(pilot, "About it")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.pause()
        assert "PWNED" in str(boxes(app)[-1].query_one(".stats").render()) and _shown_not_acted_on(app)


async def test_enter_with_files_and_no_words_says_what_is_missing(store, project):
    """Enter with a file attached and nothing written did nothing, silently: the user
    waited for a reply about the file."""
    from textual import events

    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        await pilot.press("enter")  # nothing written, nothing attached: nothing to say
        app.post_message(events.Paste("notes.txt"))
        await wait_for(pilot, lambda: _chips(app) == ["notes.txt"])
        await pilot.press("space", "enter")
        await wait_for(pilot, lambda: app.notes)
        assert app.notes == ["Write what to ask about notes.txt, then Enter sends it."]
        assert _chips(app) == ["notes.txt"] and boxes(app) == []


async def test_at_completion_offers_paths_that_read_as_markup_as_written(store, project):
    """`@` completion read the paths it offers as markup: `[bold]y.txt` was offered as
    `y.txt`, and in a folder `[` the file `]z.txt` (offered as `[/]z.txt`) raised
    MarkupError as the list was drawn, ending the app."""
    (project / "[bold]y.txt").write_text("y\n")
    (project / "[").mkdir()
    (project / "[" / "]z.txt").write_text("z\n")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        options = app.query_one("#completions", OptionList)
        for keys, offered in ((["@", "[", "b"], "[bold]y.txt"), (["backspace", "/"], "[/]z.txt")):
            await pilot.press(*keys)
            await wait_for(pilot, lambda o=offered: [str(x.prompt) for x in options.options] == [o])
            await pilot.pause()
            assert offered in str(options.render_line(0).text)
        await pilot.press("tab")
        await wait_for(pilot, lambda: _chips(app) == ["[/]z.txt"])
        assert prompt.text == ""


@pytest.mark.parametrize("pasted", ["'{root}/my notes.txt' ", '"my notes.txt"', "{root}/my\\ notes.txt",
                                    "file://{root}/my%20notes.txt"],
                         ids=["quoted", "double-quoted", "escaped", "uri"])
async def test_a_dragged_file_pasted_quoted_escaped_or_as_a_uri_attaches(store, project, pasted):
    """A file dragged into the terminal is pasted as the shell would take it, quoted or
    with its spaces escaped, or as a file:// URI: such a path was pasted as text, and the
    user believed the file attached. Quoted words that name no file stay text."""
    from textual import events

    (project / "my notes.txt").write_text("notes\n")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        app.post_message(events.Paste(pasted.format(root=project.resolve())))
        await wait_for(pilot, lambda: _chips(app) == ["my notes.txt"])
        assert prompt.text == ""
        app.post_message(events.Paste("'hello world'"))
        await wait_for(pilot, lambda: prompt.text == "'hello world'")
        assert _chips(app) == ["my notes.txt"] and app.notes == []


ESCAPE = "\x1b]0;PWNED\x1b\\"
"""A terminal's command (set the window title), as a log file or a model may hold one."""


def _shown_not_acted_on(app) -> bool:
    """Whether what the app writes to the terminal for its whole screen now shows the
    text around ESCAPE, and holds no escape but Textual's own (CSI: ESC then `[`)."""
    import re

    written = app.screen._compositor.render_update(full=True).render_segments(app.console)
    return "PWNED" in written and re.search("\x1b(?!\\[)", written) is None


async def test_escape_sequences_in_messages_replies_and_diffs_are_not_written_to_the_terminal(store, project):
    """A pasted text, a reply or an attached file holding a terminal escape sequence
    (a log's colours, or a model repeating one) was written to the terminal as it was:
    the terminal acted on it (a title set, the clipboard written, the screen cleared)."""
    from textual import events

    (project / "src" / "app.py").write_bytes(f"# {ESCAPE}\n{APP}".encode())
    reply = f"Renamed {ESCAPE}.\n\nsrc/app.py\n```python\n# {ESCAPE} new\n{RENAMED}```\n"
    app = make_app(store, reply=reply, root=project)
    async with app.run_test(size=(120, 50)) as pilot:
        prompt = await _focused_prompt(pilot)
        app.post_message(events.Paste(f"Rename name {ESCAPE} in @src/app.py"))
        await wait_for(pilot, lambda: "PWNED" in prompt.text)
        assert _shown_not_acted_on(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen))
        await pilot.pause()
        assert _shown_not_acted_on(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DiffScreen))
        await pilot.pause()
        assert _shown_not_acted_on(app)
        await pilot.press("ctrl+t")  # the reply coloured by token origin
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_the_diff_names_a_file_holding_a_terminal_escape_without_it_acting(store, project):
    """The diff's heading names the file a reply changes: a name holding a terminal escape
    was written to the terminal as it was."""
    from textual import events

    name = f"{ESCAPE}.py"
    (project / name).write_text(APP)
    app = make_app(store, reply=f"Renamed.\n\n{name}\n```python\n{RENAMED}```\n", root=project)
    async with app.run_test(size=(200, 40)) as pilot:
        await _focused_prompt(pilot)
        app.post_message(events.Paste(name))
        await wait_for(pilot, lambda: _chips(app) == [name])
        await send(pilot, "Rename name")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.query(".diff-body"))
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_a_question_naming_a_file_holding_a_terminal_escape_is_asked_without_it_acting(store, project):
    """Asked before a reply creates files, the question names them as the reply wrote
    them: a name holding a terminal escape was written to the terminal as it was."""
    from edgespec.tui.screens.dialogs import ConfirmScreen

    app = make_app(store, reply="ok", root=project)
    async with app.run_test(size=(120, 40)) as pilot:
        await _ready(pilot)
        app.push_screen(ConfirmScreen(f"Create {ESCAPE}.py? The conversation never attached it.", yes="Create"))
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_the_picker_names_a_project_folder_holding_a_terminal_escape_without_it_acting(store, tmp_path):
    """The picker's title names the project folder: a name holding a terminal escape (a
    cloned repository's) was written to the terminal as it was."""
    root = tmp_path / f"{ESCAPE} app"
    root.mkdir()
    (root / "notes.txt").write_text("notes\n")
    app = make_app(store, reply="ok", root=root)
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FilePickerScreen))
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_a_model_that_fails_to_load_is_named_in_the_banner_without_its_escape_acting(store):
    """The banner says why the models failed to load, which names their files: a name
    holding a terminal escape was written to the terminal as it was."""
    from edgespec.errors import ModelFileError

    def load(choice, settings, progress):
        raise ModelFileError(f"/models/{ESCAPE}.gguf is not a GGUF file")

    app = make_app(store, load=load)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "failed")
        await pilot.pause()
        assert app.query_one("#banner").display and _shown_not_acted_on(app)


async def test_a_download_names_its_files_without_their_escapes_acting(store):
    """The model library shows the file being downloaded, as the hub names it: a name
    holding a terminal escape was written to the terminal as it was."""
    from edgespec.errors import DownloadError
    from edgespec.tui.library import PullProgress
    from edgespec.tui.screens.model_library import ModelsScreen
    from tests.fakes import FakeLibrary

    release = threading.Event()

    class Hub(FakeLibrary):
        def pull(self, name, *, progress):
            progress(PullProgress(done=1, total=10, what=f"downloading {ESCAPE}.gguf"))
            release.wait(10)
            raise DownloadError(f"{ESCAPE}.gguf: checksum mismatch")

    app = make_app(store, library=Hub())
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        await pilot.press("down", "down", "p")
        await wait_for(pilot, lambda: "PWNED" in str(screen.query_one("#download-status").render()))
        await pilot.pause()
        assert _shown_not_acted_on(app)
        release.set()
        await wait_for(pilot, lambda: screen.pulling is None)
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_a_file_name_holding_a_terminal_escape_is_listed_and_attached_without_it_acting(store, project):
    """A project (a cloned repository) may name a file with a terminal escape in it: `@`
    completion, the chip, the picker and a notice naming it wrote the name to the
    terminal as it was."""
    from textual import events

    name = f"{ESCAPE}.txt"
    (project / name).write_text("x\n")
    (project / f"{ESCAPE}.bin").write_bytes(b"\x00\x01")
    app = make_app(store, reply="ok", root=project)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        prompt = await _focused_prompt(pilot)
        app.post_message(events.Paste(f"{ESCAPE}.bin"))  # not attached: binary, and the notice names it
        await wait_for(pilot, lambda: app.notes)
        await pilot.pause()
        assert _shown_not_acted_on(app)
        app.clear_notifications()
        await pilot.press("@")
        await wait_for(pilot, lambda: prompt.completing)
        assert _shown_not_acted_on(app)
        options = app.query_one("#completions", OptionList)
        shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        options.highlighted = next(i for i, path in enumerate(shown) if "PWNED" in path and path.endswith(".txt"))
        await pilot.press("tab")
        await wait_for(pilot, lambda: _chips(app) == [name])
        await pilot.pause()
        assert _shown_not_acted_on(app)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FilePickerScreen))
        tree = app.screen.query_one(ProjectTree)
        await wait_for(pilot, lambda: tree.root.children)
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_attaching_a_file_attached_already_says_so(store, project):
    """Pasting (or choosing) a file attached already did nothing, silently."""
    from textual import events

    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _focused_prompt(pilot)
        for _ in range(2):
            app.post_message(events.Paste("notes.txt"))
        await wait_for(pilot, lambda: app.notes)
        assert app.notes == ["notes.txt is attached already."] and _chips(app) == ["notes.txt"]


async def test_a_system_prompt_holding_a_terminal_escape_is_edited_without_it(store, project):
    """A system prompt may come from an imported chat; the settings screen wrote it to
    the terminal as it was."""
    from edgespec.tui.chat_settings import ChatSettings
    from edgespec.tui.screens.settings import SettingsScreen

    app = make_app(store, reply="ok", root=project, defaults=ChatSettings(system_prompt=f"Be {ESCAPE} brief."))
    async with app.run_test(size=(120, 50)) as pilot:
        await _ready(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.pause()
        assert _shown_not_acted_on(app)


async def test_a_message_sent_as_a_chat_opens_and_reloads_the_models_stays_in_the_prompt(store, project,
                                                                                           monkeypatch):
    """A chat whose settings want the models loaded again, opened while a message is
    sent: the message is not sent (the models load) and stays in the prompt, files and
    all, to send once they are ready. It was taken out of the prompt and dropped."""
    other = store.create(title="Long files")
    store.save_settings(other, {"n_ctx": 16384})
    loaded = threading.Event()

    def load(choice, settings, progress):
        if settings.load.n_ctx:
            loaded.wait(10)
        return SpecFakeEngine(reply=lambda prompt: "ok")

    show = Conversation.show

    async def slow_show(self, messages):  # a long chat: its view takes a while to fill
        await asyncio.sleep(0.3)
        await show(self, messages)

    monkeypatch.setattr(Conversation, "show", slow_show)
    app = make_app(store, load=load, root=project)
    async with app.run_test() as pilot:
        prompt = await _focused_prompt(pilot)
        app.chat._attach_file("notes.txt")
        await wait_for(pilot, lambda: _chips(app) == ["notes.txt"])
        prompt.load_text("Summarise the notes")
        opening = asyncio.ensure_future(app.chat.open_conversation(other))
        await asyncio.sleep(0)
        await pilot.press("enter")  # while the view is filled
        await opening
        await wait_for(pilot, lambda: any("still loading" in n for n in app.notes))
        await pilot.pause()
        assert not boxes(app)
        assert prompt.text == "Summarise the notes" and _chips(app) == ["notes.txt"]
        loaded.set()


@pytest.mark.parametrize("turn", ["send", "regenerate", "edit"])
async def test_a_file_that_can_no_longer_be_sent_again_is_named_before_the_turn(store, project, turn):
    """A file of the conversation changed on disk goes with the next turn; one that can no longer
    be read as text cannot, and the app says so, as the CLI does, rather than let the model answer
    from its old copy unannounced: before a message, a regeneration and an edit alike."""
    from textual.widgets import TextArea

    from edgespec.tui.screens.dialogs import TextPromptScreen

    app = make_app(store, reply="ok", root=project)
    async with app.run_test() as pilot:
        await _ready(pilot)
        await send(pilot, "Look @src/app.py")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        (project / "src" / "app.py").write_bytes(APP.encode() + b"caf\xe9\n")
        if turn == "send":
            await send(pilot, "Now?")
        elif turn == "regenerate":
            await pilot.press("ctrl+r")
        else:
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
            app.screen.query_one(TextArea).load_text("Look again")
            await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.chat.generating and len(app.engines[0].prompts) == 2)
        said = [n for n in app.notes if "src/app.py changed on disk" in n]
        assert len(said) == 1 and "not UTF-8" in said[0], app.notes
        assert "caf" not in app.engines[0].detokenize(app.engines[0].prompts[-1])
