"""The chat app on a fake engine: streaming, stopping, conversations, settings,
downloads, failures (Textual Pilot), plus the app's pure helpers."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

import pytest
import yaml

from edgespec.chat.store import ConversationStore, Message, StoreError
from edgespec.engine.events import Stats
from edgespec.engine.info import LayerRun
from edgespec.errors import ENDING_SIGNALS, ModelFileError, Terminated
from edgespec.models.progress import Progress
from edgespec.tui import origin
from edgespec.tui.library import ModelChoice, PullProgress
from edgespec.tui.screens.model_library import ModelsScreen, describe_progress
from edgespec.tui.screens.dialogs import TextPromptScreen
from edgespec.tui.screens.settings import SettingsScreen
from edgespec.tui.chat_settings import ChatSettings, load_defaults, save_defaults
from edgespec.tui.stream import RENDER_HZ, RENDER_SHARE, RENDER_WAIT_MAX, redraw_share, redraw_wait
from edgespec.tui.widgets.messages import MessageBox, code_blocks, reply_stats
from edgespec.tui.widgets.sidebar import ConversationList
from edgespec.tui.widgets.status import StatusLine, format_live, hardware_label
from edgespec.tui.widgets.prompt_input import PromptInput
from tests.app_helpers import REPLY, boxes, make_app, send, wait_for
from tests.fakes import FakeEngine, FakeLibrary, SlowReader, SpecFakeEngine, engine_info, model_info

pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s





# -- chat ------------------------------------------------------------------------------

async def test_send_streams_the_reply_and_stores_it(store):
    hold = threading.Event()  # the reply pauses half way until released: seen mid-stream on any machine
    app = make_app(store, hold=hold, hold_after=len(REPLY) // 2)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Write add()", key=False)
        await wait_for(pilot, lambda: len(boxes(app)) == 2 and boxes(app)[1].content)
        reply = boxes(app)[1]
        assert app.chat.generating and reply.streaming, (reply.status, reply.content)
        assert 0 < len(reply.content) < len(REPLY)
        await wait_for(pilot, lambda: "tok/pass" in app.query_one(StatusLine).detail, timeout=5)
        hold.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        assert reply.content == REPLY and reply.status == "done"
        assert "accepted" in reply_stats(reply.stats)
        [info] = store.list()
        assert info.title == "Write add()"
        assert [(m.role, m.status) for m in store.messages(info.id)][-2:] == [("user", "done"), ("assistant", "done")]
        assert app.chat.conversation_id == info.id
        assert app.query_one("#prompt").text == ""


async def test_the_screen_draws_a_fast_stream_in_batches_without_holding_up_decoding(store, monkeypatch):
    """Rendering Markdown takes time; the decode thread hands chunks over and goes
    on, and the screen draws what has arrived at most RENDER_HZ times a second."""
    writes = []
    original = MessageBox.write

    async def slow_write(self, text, runs):
        writes.append(text)
        await asyncio.sleep(0.02)  # a costly render
        await original(self, text, runs)

    monkeypatch.setattr(MessageBox, "write", slow_write)
    reply = "token " * 80  # 480 one-character chunks
    app = make_app(store, reply=reply, delay_s=0.001, engine_cls=FakeEngine)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Talk", key=False)
        await wait_for(pilot, lambda: len(boxes(app)) == 2 and boxes(app)[1].content == reply
                       and not app.chat.generating)
        assert "".join(writes) == reply
        assert len(writes) < len(reply) / 10  # one chunk per character arrived


async def test_a_damaged_conversation_store_is_moved_aside_and_said_so(home):
    path = home / "data" / "conversations.db"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not SQLite" * 300)
    app = make_app(None)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert any("damaged" in n and ".damaged-" in n for n in app.notes)
        await send(pilot, "Hi")
        assert len(app.store.list()) == 1
    assert len(list(path.parent.glob("conversations.db.damaged-*"))) == 1


async def test_a_store_that_cannot_be_opened_leaves_the_app_chatting_in_memory(home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "data").write_text("a file where the data folder should be")
    app = make_app(None)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert any("not saved" in n and "data" in n for n in app.notes)
        await send(pilot, "Hi")
        await wait_for(pilot, lambda: not app.chat.generating)
        assert len(boxes(app)) == 2 and boxes(app)[1].status == "done"


async def test_an_engine_that_cannot_say_where_it_runs_still_chats_and_says_so(store):
    class NoDescribe(SpecFakeEngine):
        def describe(self):
            raise RuntimeError("no backend info")

    app = make_app(store, engine_cls=NoDescribe)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert any("no backend info" in n for n in app.notes)
        await send(pilot, "Hi")
        await wait_for(pilot, lambda: not app.chat.generating)
        assert boxes(app)[1].content == REPLY


class FailingStore(ConversationStore):
    """A store whose writes fail once `read_only` is set, as a file that became read-only,
    and whose reads of the list and of titles fail once `broken` is set (a disk I/O
    error, a database locked for too long)."""

    read_only = False
    broken = False

    def list(self, *args, **kwargs):
        if self.broken:
            raise StoreError(f"cannot read {self.path}: disk I/O error")
        return super().list(*args, **kwargs)

    def title(self, conversation_id):
        if self.broken:
            raise StoreError(f"cannot read {self.path}: disk I/O error")
        return super().title(conversation_id)

    def create(self, **kwargs):
        self._check()
        return super().create(**kwargs)

    def append(self, conversation_id, message):
        self._check()
        return super().append(conversation_id, message)

    def update(self, message):
        self._check()
        super().update(message)

    def _check(self):
        if self.read_only:
            raise StoreError(f"{self.path} is read-only or cannot be written. Make it and its folder writable.")


@pytest.mark.parametrize("failure, said", [("read_only", "read-only"), ("broken", "disk I/O error")])
async def test_a_store_failing_mid_chat_is_shown_not_a_crash(tmp_path, failure, said):
    """Writes that fail, and reads that fail (the list at a reply's end and at each search
    keystroke, the title for renaming and for the settings: they ended the app), are said."""
    store = FailingStore(tmp_path / "chats.db")
    app = make_app(store)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Hi")
        await wait_for(pilot, lambda: not app.chat.generating)
        setattr(store, failure, True)
        await send(pilot, "Again")
        await wait_for(pilot, lambda: not app.chat.generating)
        for key in ("f2", "ctrl+s"):  # rename and settings read the title
            await pilot.press(key)
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
        assert any(said in n for n in app.notes)
        assert app.is_running


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])  # ctrl+c as in llama-cli and Ollama
async def test_escape_stops_the_reply_and_keeps_it(store, key):
    app = make_app(store, reply="word " * 400, delay_s=0.02)  # long enough to be stopped whatever the redraw rate
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Talk", key=False)
        await wait_for(pilot, lambda: len(boxes(app)) == 2 and len(boxes(app)[1].content) > 20)
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.chat.generating)
        assert app.engines[0].interrupts >= 1  # the engine is told at once: a long prompt's read stops mid-batch
        reply = boxes(app)[1]
        assert reply.status == "stopped" and "stopped" in str(reply.query_one(".header").render())
        stored = store.messages(app.chat.conversation_id)[-1]
        assert stored.status == "stopped"
        assert stored.content == reply.content and 0 < len(stored.content) < 2000
        assert app.is_running
        # the app is usable afterwards
        await send(pilot, "Again", key=False)
        await wait_for(pilot, lambda: len(boxes(app)) == 4)
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.chat.generating)
        if key == "ctrl+c":  # with no reply under way it keeps Textual's meaning: it says how to quit
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert any("to quit" in n for n in app.notes)
            assert app.is_running


async def talk_until_streaming(pilot, app):
    """Send a message once the models are ready, and wait until its reply (a fake's, held
    after 40 characters: make_app's `hold_after`) is streaming."""
    await wait_for(pilot, lambda: app.model_state == "ready")
    await send(pilot, "Talk", key=False)
    await wait_for(pilot, lambda: len(boxes(app)) == 2 and len(boxes(app)[1].content) >= 40)


async def test_quitting_mid_reply_keeps_the_reply_and_frees_the_models_after_the_decode(store):
    hold = threading.Event()
    app = make_app(store, reply="word " * 200, hold=hold, hold_after=40)
    async with app.run_test() as pilot:
        await talk_until_streaming(pilot, app)
        threading.Timer(0.3, hold.set).start()  # the decode step in flight ends a moment after the quit
        await pilot.press("ctrl+q")
    [engine] = app.engines
    assert engine.closed and not engine.closed_while_generating
    [info] = store.list()
    stored = store.messages(info.id)[-1]
    assert stored.role == "assistant" and stored.status == "stopped" and stored.content.startswith("word word")


def _last_stored(path):
    """The last message of the only conversation in the store at `path`, read by a connection of its own."""
    with ConversationStore(path) as reader:
        [info] = reader.list()
        return reader.messages(info.id)[-1]


async def test_quitting_mid_reply_closes_the_store_the_app_opened_after_storing_the_reply(home):
    """The store the app opened is closed as it ends, after the stopped reply is stored in it:
    SQLite folds its write-ahead log into the database and removes it. (A store given to the
    app is the giver's to close: the tests above read theirs after the app.)"""
    hold = threading.Event()
    app = make_app(None, reply="word " * 200, hold=hold, hold_after=40)
    async with app.run_test() as pilot:
        await talk_until_streaming(pilot, app)
        threading.Timer(0.3, hold.set).start()  # the decode step in flight ends a moment after the quit
        await pilot.press("ctrl+q")
    path = home / "data" / "conversations.db"
    assert not path.with_name(path.name + "-wal").exists()
    with pytest.raises(StoreError):
        app.store.list()
    stored = _last_stored(path)
    assert stored.role == "assistant" and stored.status == "stopped" and stored.content.startswith("word word")


async def test_a_decode_step_outlasting_the_quit_still_stores_its_reply(home, monkeypatch):
    """Quitting gives up waiting for the decode step after QUIT_WAIT_S and leaves the models to the
    process's exit; the store stays open too, so the reply that step then stops is stored."""
    import edgespec.tui.app as app_module

    monkeypatch.setattr(app_module, "QUIT_WAIT_S", 0.05)
    hold = threading.Event()
    app = make_app(None, reply="word " * 200, hold=hold, hold_after=40)
    async with app.run_test() as pilot:
        await talk_until_streaming(pilot, app)
        await pilot.press("ctrl+q")
    [engine] = app.engines
    assert not engine.closed  # the decode step is still under way
    hold.set()
    path = home / "data" / "conversations.db"
    await wait_for(None, lambda: _last_stored(path).status != "interrupted", timeout=5)
    stored = _last_stored(path)
    assert stored.role == "assistant" and stored.status == "stopped" and stored.content.startswith("word word")


@pytest.mark.parametrize("signum", ENDING_SIGNALS)
async def test_kill_or_a_closed_terminal_mid_reply_quits_as_the_quit_key_does(store, signum):
    """SIGTERM (`kill`) or SIGHUP (the terminal closed) mid-reply ended the process at once: the
    terminal left in the app's screen, the reply lost. The app quits as on its quit key (the reply
    stopped and stored as far as it went, the models freed after the decode step), says which
    signal ended it (the launcher ends by it), and gives the signal back to the handler before it."""
    came = []
    before = signal.signal(signum, lambda sig, _frame: came.append(sig))  # the app's gone: seen here, not pytest ended
    try:
        hold = threading.Event()
        app = make_app(store, reply="word " * 200, hold=hold, hold_after=40)
        async with app.run_test() as pilot:
            await talk_until_streaming(pilot, app)
            threading.Timer(0.3, hold.set).start()  # the decode step in flight ends a moment after the signal
            os.kill(os.getpid(), signum)
            await wait_for(pilot, lambda: not app.is_running, timeout=5)
        assert app.ended_by == signum and not came
        [engine] = app.engines
        assert engine.closed and not engine.closed_while_generating
        [info] = store.list()
        stored = store.messages(info.id)[-1]
        assert stored.role == "assistant" and stored.status == "stopped" and stored.content.startswith("word word")
        os.kill(os.getpid(), signum)  # after the app: the handler before it has the signal again
        await wait_for(pilot, lambda: came == [signum], timeout=5)
    finally:
        signal.signal(signum, before)


def test_the_app_ended_by_a_signal_ends_the_command_by_it(monkeypatch):
    """The launcher ends the process by the signal that ended the app (143, 129), as after a CLI command."""
    import io

    import edgespec.tui.app as app_module
    from edgespec import tui

    class Ended:
        ended_by = signal.SIGTERM

        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            pass

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(app_module, "EdgespecApp", Ended)
    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr(sys, "stderr", Tty())
    with pytest.raises(Terminated) as raised:
        tui.run_app(target="t.gguf")
    assert raised.value.args == (signal.SIGTERM,)


async def test_quitting_while_the_words_are_read_ahead_stops_the_reading_and_frees_the_models(store):
    """A long message pasted, its reading ahead under way (10 s), and the app quit: the
    reading stops at its next batch and the models are freed, at once."""
    engine = SlowReader(batches=200, reply=lambda prompt: "never asked")
    app = make_app(store, load=lambda choice, settings, progress: engine)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        app.query_one(PromptInput).load_text("Summarise this long text: " + "words " * 500)
        await wait_for(pilot, lambda: engine.reading.is_set(), timeout=3)
        start = time.monotonic()
        await pilot.press("ctrl+q")
    assert time.monotonic() - start < 3 and engine.batches_read[0] < 100
    assert engine.closed and not engine.closed_while_generating


async def test_words_taken_back_stop_their_reading_ahead_and_more_words_do_not(store):
    """A long paste being read ahead (10 s), then replaced by another message: its reading
    stops, and the message sent next does not wait for it. Words added to it do not stop it."""
    engine = SlowReader(batches=200, later=1, reply=lambda prompt: "ok")
    app = make_app(store, load=lambda choice, settings, progress: engine)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        prompt = app.query_one(PromptInput)
        pasted = "Summarise this long text: " + "words " * 500
        prompt.load_text(pasted)
        await wait_for(pilot, lambda: engine.reading.is_set(), timeout=3)
        prompt.load_text(pasted + "and more")
        await pilot.pause(0.3)
        assert not engine.batches_read  # still reading
        prompt.load_text("Hello")
        await wait_for(pilot, lambda: engine.batches_read, timeout=2)
        assert engine.batches_read[0] < 100
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2, timeout=3)
        assert "words" not in engine.detokenize(engine.prompts[-1])


async def test_escape_stops_the_reading_of_a_long_prompt(store):
    engine = SlowReader(batches=100, reply=lambda prompt: "never shown")  # 5 s of reading
    app = make_app(store, load=lambda choice, settings, progress: engine)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Summarise this long file", key=False)
        await wait_for(pilot, lambda: "reading the prompt" in app.query_one(StatusLine).detail)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=2)
        assert engine.batches_read[0] < 50
        assert boxes(app)[1].status == "stopped"


async def test_switching_conversations(store):
    first = store.create(title="First")
    store.append(first, Message("user", "one"))
    store.append(first, Message("assistant", "uno"))
    second = store.create(title="Second")
    store.append(second, Message("user", "two"))
    store.append(second, Message("assistant", "dos", status="stopped"))
    app = make_app(store, reply="tres")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        sidebar = app.query_one(ConversationList)
        sidebar.post_message(ConversationList.Selected(first))
        await wait_for(pilot, lambda: [b.content for b in boxes(app)] == ["one", "uno"])
        sidebar.post_message(ConversationList.Selected(second))
        await wait_for(pilot, lambda: [b.content for b in boxes(app)] == ["two", "dos"])
        assert boxes(app)[1].status == "stopped"
        await send(pilot, "three")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 4)
        assert [m.content for m in store.messages(second)][-2:] == ["three", "tres"]
        assert len(store.messages(first)) == 2
        prompt = app.engines[0].detokenize(app.engines[0].prompts[-1])
        assert "two" in prompt and "dos" in prompt and "one" not in prompt
        # search filters the list; ctrl+n starts a new chat
        await pilot.press("ctrl+f")
        await pilot.press(*"Fir")
        await wait_for(pilot, lambda: app.query_one("#conversations").option_count == 1)
        await pilot.press("ctrl+n")
        assert boxes(app) == [] and app.chat.conversation_id is None


def two_turn_app(store, *later: str):
    """An app whose model answers "first answer", then "second answer", then `later`."""
    replies = iter(["first answer", "second answer", *later])
    return make_app(store, load=lambda choice, settings, progress: SpecFakeEngine(reply=lambda p: next(replies)))


async def two_turns(pilot, app) -> None:
    """Once the models are ready, "one" and "two" sent and answered: four boxes."""
    await wait_for(pilot, lambda: app.model_state == "ready")
    await send(pilot, "one")
    await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
    await send(pilot, "two")
    await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 4)


async def test_regenerate_and_edit(store):
    app = two_turn_app(store, "edited answer")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "question")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "second answer")
        assert len(boxes(app)) == 2
        await pilot.press("ctrl+g")
        editor = app.screen.query_one("#value")
        editor.load_text("better question")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "edited answer")
        assert [b.content for b in boxes(app)] == ["better question", "edited answer"]
        assert [m.content for m in store.messages(app.chat.conversation_id) if m.role != "system"] == \
            ["better question", "edited answer"]


def _turn_added_elsewhere(store, app) -> None:
    """Another edgespec adds a turn to the chat the app shows."""
    store.append(app.chat.conversation_id, Message("user", "asked elsewhere"))
    store.append(app.chat.conversation_id, Message("assistant", "answered elsewhere"))


def _stored(store, app) -> list[str]:
    return [m.content for m in store.messages(app.chat.conversation_id) if m.role != "system"]


async def test_regenerate_after_another_edgespec_added_a_turn_is_refused_and_shows_it(store):
    """Ctrl+R regenerates the reply the user sees, never one stored since by another edgespec."""
    app = two_turn_app(store, "third answer")
    async with app.run_test() as pilot:
        await two_turns(pilot, app)
        _turn_added_elsewhere(store, app)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 6)
        assert any("changed by another edgespec" in note for note in app.notes)
        assert [b.content for b in boxes(app)] == _stored(store, app) == \
            ["one", "first answer", "two", "second answer", "asked elsewhere", "answered elsewhere"]
        await pilot.press("ctrl+r")  # now on the reply shown last
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "third answer")
        assert _stored(store, app)[-2:] == ["asked elsewhere", "third answer"]


async def test_edit_after_another_edgespec_added_a_turn_is_refused_and_reopened_on_the_same_message(store):
    app = two_turn_app(store, "third answer")
    async with app.run_test() as pilot:
        await two_turns(pilot, app)
        _turn_added_elsewhere(store, app)
        await pilot.press("ctrl+g")  # the last message shown: "two"
        app.screen.query_one("#value").load_text("TWO")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen) and len(boxes(app)) == 6)
        assert _stored(store, app)[2:] == ["two", "second answer", "asked elsewhere", "answered elsewhere"]
        await pilot.press("ctrl+s")  # resent, seeing what the edit drops
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "third answer")
        assert [b.content for b in boxes(app)] == _stored(store, app) == ["one", "first answer", "TWO", "third answer"]


async def test_a_message_sent_after_another_edgespec_added_a_turn_shows_that_turn(store):
    app = two_turn_app(store, "third answer")
    async with app.run_test() as pilot:
        await two_turns(pilot, app)
        _turn_added_elsewhere(store, app)
        await send(pilot, "three")
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[-1].content == "third answer")
        assert [b.content for b in boxes(app)] == _stored(store, app)
        assert len(boxes(app)) == 8


async def test_regenerate_on_an_earlier_reply_says_so_and_keeps_the_last(store):
    """Ctrl+R with an earlier reply focused regenerates nothing and says how to redo from
    there: it regenerated the last reply, throwing away one the user had not pointed at."""
    app = two_turn_app(store, "never")
    async with app.run_test() as pilot:
        await two_turns(pilot, app)
        boxes(app)[1].focus()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not app.chat.generating and any("ctrl+g" in n for n in app.notes)
        assert [b.content for b in boxes(app)] == ["one", "first answer", "two", "second answer"]
        assert [m.content for m in store.messages(app.chat.conversation_id) if m.role != "system"] == \
            ["one", "first answer", "two", "second answer"]


async def test_edit_with_a_reply_focused_edits_the_message_it_answers(store):
    """Ctrl+G with an earlier reply focused opens the message that reply answers: it
    opened the last message, and resending it replaced the wrong turn."""
    app = two_turn_app(store)
    async with app.run_test() as pilot:
        await two_turns(pilot, app)
        boxes(app)[1].focus()
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        assert app.screen.query_one("#value").text == "one"


async def test_origin_view_colours_draft_tokens(store):
    app = make_app(store, reply="abcdefgh")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "x")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.press("ctrl+t")
        reply = boxes(app)[1]
        assert reply.query_one(".origin").display and not reply.query_one(".body").display
        assert reply.runs == [("abc", True), ("d", False), ("efg", True), ("h", False)]
        assert app.query_one(StatusLine).origin_view
        await pilot.press("ctrl+t")
        assert reply.query_one(".body").display


async def test_copy_reply_and_code_block_and_export(store, tmp_path):
    app = make_app(store, export_dir=tmp_path)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "code please")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.press("f6")
        assert app.clipboard == "def add(a, b):\n    return a + b"
        await pilot.press("f5")
        assert app.clipboard == REPLY
        await pilot.press("f3")
        [exported] = tmp_path.glob("edgespec-*.md")
        assert "code please" in exported.read_text()


async def test_rename_and_delete_with_confirm(store):
    cid = store.create(title="Old name")
    store.append(cid, Message("user", "hello"))
    app = make_app(store)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await app.chat.open_conversation(cid)
        await pilot.press("f2")
        app.screen.query_one("#value").value = "New name"
        await pilot.press("enter")
        assert store.list()[0].title == "New name"
        await pilot.press("f8")
        await pilot.click("#no")
        assert len(store.list()) == 1
        await pilot.press("f8")
        await pilot.click("#yes")
        await wait_for(pilot, lambda: not store.list())
        assert app.chat.conversation_id is None


# -- settings --------------------------------------------------------------------------

async def test_settings_round_trip(store, home):
    cid = store.create(title="Tuned")
    store.append(cid, Message("system", "You are a helpful assistant."))
    store.append(cid, Message("user", "hi"))
    other = store.create(title="Other")
    app = make_app(store)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await app.chat.open_conversation(cid)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)
        app.screen.query_one("#temperature").value = "0.7"
        app.screen.query_one("#k").value = "6"
        app.screen.query_one("#system_prompt").load_text("Answer in French.")
        app.screen.query_one("#mode").value = "lookup"
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = store.settings(cid)
        assert (saved["temperature"], saved["k"], saved["mode"]) == (0.7, 6, "lookup")
        assert app.chat.session.params.temperature == 0.7 and app.chat.session.params.k == 6
        assert store.messages(cid)[0].content == "Answer in French."
        await app.chat.open_conversation(other)
        assert app.chat.settings == ChatSettings()
        await app.chat.open_conversation(cid)
        assert app.chat.settings.temperature == 0.7 and app.chat.session.params.mode == "lookup"
        # a bad value is refused with a reason, the screen stays
        await pilot.press("ctrl+s")
        app.screen.query_one("#k").value = "many"
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)
        assert "whole number" in str(app.screen.query_one("#error").render())
        app.screen.query_one("#k").value = "5"
        await pilot.click("#default")
        await pilot.pause()
        assert load_defaults().k == 5
        assert yaml.safe_load((home / "config" / "settings.yaml").read_text())["k"] == 5


async def test_the_context_size_is_a_setting_kept_per_conversation_and_as_default(store, home):
    """The app's settings hold the context size and flash attention (LoadSettings): set in
    the settings screen, the models reload with them, the status line says the size, and
    the conversation (and, saved as default, settings.yaml) keeps them."""
    from tests.fakes import SpecFakeEngine

    loads = []

    def load(choice, settings, progress):
        loads.append(settings.load)
        return SpecFakeEngine(reply=lambda prompt: "ok", has_draft=True, n_ctx=settings.load.n_ctx or 8192)

    cid = store.create(title="Long files")
    other = store.create(title="Other")
    app = make_app(store, load=load)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert loads[-1].n_ctx is None  # chosen at load: fit to the models and the memory
        await app.chat.open_conversation(cid)
        await pilot.press("ctrl+s")
        assert app.screen.query_one("#n_ctx").value == "auto"
        app.screen.query_one("#n_ctx").value = "16384"
        app.screen.query_one("#flash_attn").value = "on"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(loads) == 2 and app.model_state == "ready")
        assert (loads[-1].n_ctx, loads[-1].flash_attn) == (16384, True)
        assert "16,384" in app.model_label
        assert (store.settings(cid)["n_ctx"], store.settings(cid)["flash_attn"]) == (16384, "on")
        await app.chat.open_conversation(other)
        assert app.chat.settings.load.n_ctx is None
        await app.chat.open_conversation(cid)
        assert app.chat.settings.load.n_ctx == 16384
        await pilot.press("ctrl+s")
        assert app.screen.query_one("#n_ctx").value == "16384"  # reopened: kept
        app.screen.query_one("#n_ctx").value = "8"  # below what a verify pass needs
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen) and "context size" in str(app.screen.query_one("#error").render())
        app.screen.query_one("#n_ctx").value = "12288"
        await pilot.click("#default")
        await pilot.pause()
        assert load_defaults().load.n_ctx == 12288
        assert yaml.safe_load((home / "config" / "settings.yaml").read_text())["n_ctx"] == 12288


async def test_a_pairs_mode_and_k_apply_unless_the_settings_name_them(store):
    """The app on a pair decodes in the mode and k models.yaml gives it (Library.decoding;
    the fake pair's: draft, k 3) while the settings leave them empty; a mode set wins,
    with its own k (the pair's k goes with the pair's mode)."""
    from dataclasses import replace

    from edgespec.modes import MODE_K
    from edgespec.tui.library import ModelChoice

    app = make_app(store)
    app.choice = ModelChoice(pair="tiny-pair")
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready" and app.chat.session is not None)
        assert (app.chat.settings.mode, app.chat.settings.k) == (None, None)
        assert (app.chat.session.params.mode, app.chat.session.params.k) == ("draft", 3)
        app.chat.use_settings(replace(app.chat.settings, mode="lookup"))
        assert (app.chat.session.params.mode, app.chat.session.params.k) == ("lookup", MODE_K["lookup"])
        await pilot.press("ctrl+s")
        assert app.screen.query_one("#k").value == ""  # the pair's
        app.screen.query_one("#k").value = "5"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert (app.chat.session.params.mode, app.chat.session.params.k) == ("lookup", 5)


NOT_DIGITS_0_9 = [("max_tokens", "\uff11\uff12\uff18"), ("top_k", "\u0661\u0662"), ("temperature", "\uff10.5"),
                  ("n_ctx", "\u0664\u0660\u0669\u0666"), ("k", "\u0968")]
"""A setting written in digits other than 0-9 (fullwidth, Arabic-Indic, Devanagari), which int() and float() read."""


@pytest.mark.parametrize("field, text", NOT_DIGITS_0_9)
async def test_a_setting_written_in_digits_other_than_0_to_9_is_refused_saying_so(store, field, text):
    """int() reads '\uff11\uff12\uff18' as 128: the settings screen refuses it as the CLI does,
    naming the digits, and keeps the settings as they were."""
    app = make_app(store)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        before = app.chat.settings
        await pilot.press("ctrl+s")
        app.screen.query_one(f"#{field}").value = text
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)
        assert "digits 0-9" in str(app.screen.query_one("#error").render())
        await pilot.press("escape")
        assert app.chat.settings == before


@pytest.mark.parametrize("field, text", NOT_DIGITS_0_9)
def test_a_stored_setting_written_in_digits_other_than_0_to_9_is_refused(field, text):
    """settings.yaml and a stored chat's settings are read as the screen's fields are."""
    with pytest.raises(ValueError, match="digits 0-9"):
        ChatSettings.from_dict({field: text})


def test_chat_settings_validate_and_fill_from_defaults(tmp_path):
    with pytest.raises(ValueError, match="top-p"):
        ChatSettings(top_p=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        ChatSettings.from_dict({"mode": "turbo"})
    defaults = ChatSettings(k=7)
    merged = ChatSettings.from_dict({"temperature": "0.5", "target": "x.gguf"}, defaults=defaults)
    assert (merged.temperature, merged.k) == (0.5, 7)
    assert merged.params().temperature == 0.5
    path = save_defaults(merged, tmp_path / "s.yaml")
    assert load_defaults(path) == merged
    path.write_text("k: [1]\n")
    with pytest.raises(ValueError, match="s.yaml"):
        load_defaults(path)


@pytest.mark.parametrize("text", [
    "flash_attn: [1, 2]\n",
    "flash_attn: {a: 1}\n",
    "system_prompt: " + "[" * 5000 + "]" * 5000 + "\n",
    "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                                                   for p, c in zip("abcdefgh", "bcdefghi")) + "system_prompt: *i\n",
    "k: true\n",
])
def test_a_settings_file_of_the_wrong_shape_is_refused_at_once_naming_it(tmp_path, text):
    """The app ignores a bad settings.yaml with a warning (a ValueError naming it); these
    raised TypeError or RecursionError and ended the app, hung on aliases nesting a
    billion items, or read `k: true` as k 1."""
    import time

    path = tmp_path / "settings.yaml"
    path.write_text(text)
    start = time.monotonic()
    with pytest.raises(ValueError, match="settings.yaml") as refused:
        load_defaults(path)
    assert time.monotonic() - start < 5 and len(str(refused.value)) < 500


def test_exact_kernels_are_a_setting_that_reloads_the_models():
    assert ChatSettings().load.exact is False  # speed first: llama.cpp's own kernels
    exact = ChatSettings.from_dict({"exact": True})
    assert exact.load.exact is True and exact.hardware() != ChatSettings().hardware()
    with pytest.raises(ValueError, match="exact"):
        ChatSettings.from_dict({"exact": "no"})  # bool("no") would be True


@pytest.mark.parametrize("text", ["max_tokens: .inf\n", "k: -.inf\n", "temperature: .nan\n", "threads: 1e400\n"])
def test_a_settings_value_that_does_not_convert_is_reported_naming_the_file(tmp_path, text):
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="settings.yaml.*fix or delete"):
        load_defaults(path)
    with pytest.raises(ValueError):
        ChatSettings.from_dict(yaml.safe_load(text))


def test_saving_the_defaults_on_a_full_disk_keeps_those_saved_before(tmp_path, monkeypatch):
    """A write that fails midway (a full disk; a kill) leaves settings.yaml as it was, and
    nothing beside it: the new file is renamed over it only once it is whole."""
    import errno
    import io

    path = save_defaults(ChatSettings(temperature=0.7), tmp_path / "settings.yaml")
    before = path.read_bytes()

    class FullDisk:
        """A file opened for writing on a disk with no room left: opened, never written."""

        def __init__(self, handle):
            self._handle = handle

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._handle.close()

    real_open = io.open
    monkeypatch.setattr(io, "open", lambda file, mode="r", *a, **k: (
        FullDisk(real_open(file, mode, *a, **k)) if "w" in mode else real_open(file, mode, *a, **k)))
    with pytest.raises(ValueError, match="settings.yaml") as refused:
        save_defaults(ChatSettings(temperature=0.2), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and load_defaults(path).temperature == 0.7
    assert [p.name for p in tmp_path.iterdir()] == ["settings.yaml"]
    assert "disk is full" in str(refused.value)


def test_a_linked_settings_file_stays_a_link_and_its_target_is_saved(tmp_path):
    """A settings.yaml linked to a dotfiles folder is written where it points, not replaced by a file."""
    kept = tmp_path / "dotfiles" / "edgespec.yaml"
    kept.parent.mkdir()
    kept.write_text("temperature: 0.7\n")
    link = tmp_path / "settings.yaml"
    link.symlink_to(kept)
    save_defaults(ChatSettings(temperature=0.2), link)
    assert link.is_symlink() and load_defaults(kept).temperature == 0.2


def test_a_read_only_settings_file_is_not_replaced(tmp_path):
    path = save_defaults(ChatSettings(temperature=0.7), tmp_path / "settings.yaml")
    path.chmod(0o444)
    with pytest.raises(ValueError, match="settings.yaml is read-only"):
        save_defaults(ChatSettings(temperature=0.2), path)
    assert load_defaults(path).temperature == 0.7


@pytest.mark.parametrize("text", ["temperature: 'unclosed\n", "\x00", "a: b\n c: d\n"])
def test_a_settings_file_that_is_not_yaml_is_reported_in_one_line_with_its_line(tmp_path, text):
    """YAML's own message runs over several lines, with a caret under the text; a file cut
    short (a kill while an older edgespec wrote it) gave a notification of six lines."""
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"settings.yaml: .*(line|position) \d") as refused:
        load_defaults(path)
    assert "\n" not in str(refused.value)


def test_a_settings_file_that_is_a_directory_is_reported_naming_it(tmp_path):
    (tmp_path / "settings.yaml").mkdir()
    with pytest.raises(ValueError, match="settings.yaml.*(directory|not a file)"):
        load_defaults(tmp_path / "settings.yaml")


# -- models ----------------------------------------------------------------------------

async def test_download_progress_cancel_and_finish(store):
    library = FakeLibrary(step_s=0.05)
    app = make_app(store, library=library)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        await pilot.press("down", "down")  # tiny-draft, not installed
        await pilot.press("u")
        assert isinstance(app.screen, ModelsScreen)  # refused: not installed
        await pilot.press("p")
        bar = screen.query_one("#download-progress")
        await wait_for(pilot, lambda: (bar.progress or 0) >= 200_000_000)
        assert bar.total == 1_000_000_000
        assert "MB/s" in str(screen.query_one("#download-status").render())
        await pilot.press("c")
        await wait_for(pilot, lambda: screen.pulling is None)
        assert "cancelled" in str(screen.query_one("#download-status").render())
        assert not library.installed["tiny-draft"]
        await pilot.press("p")
        await wait_for(pilot, lambda: screen.pulling is None, timeout=5)
        assert library.installed["tiny-draft"]
        assert "installed" in str(screen.query_one("#download-status").render())
        assert screen.selected().name == "tiny-draft"  # the row pulled stays chosen ("u" used row 0's)
        await pilot.press("up", "up", "u")  # the pair, now installed: switch to it
        await wait_for(pilot, lambda: app.choice.pair == "tiny-pair" and app.model_state == "ready")


async def test_use_while_a_download_runs_keeps_the_download_and_says_so(store):
    """`u` on an installed model while another is pulled says to cancel the download first,
    as Esc does: it closed the library, which cancelled the download without a word."""
    library = FakeLibrary(step_s=0.2)
    app = make_app(store, library=library)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        await pilot.press("down", "down", "p")  # tiny-draft
        await pilot.press("up", "u")  # tiny-target, installed
        assert app.screen is screen and screen.pulling == "tiny-draft"
        assert any("cancel it first" in n for n in app.notes)
        await wait_for(pilot, lambda: screen.pulling is None, timeout=5)
        assert library.installed["tiny-draft"]


async def test_using_the_models_loaded_already_keeps_them(store):
    """Use on the pair that is loaded says so and keeps it (its cache, its conversation
    read): it unloaded and loaded the same models again, a minute on a CPU."""
    library = FakeLibrary()
    library.installed["tiny-draft"] = True
    app = make_app(store, library=library)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o", "u")  # tiny-pair
        await wait_for(pilot, lambda: app.choice.pair == "tiny-pair" and app.model_state == "ready")
        assert len(app.engines) == 2
        await pilot.press("ctrl+o", "u")
        await pilot.pause()
        assert len(app.engines) == 2 and not app.engines[1].closed and app.model_state == "ready"
        assert any("loaded already" in n for n in app.notes)


async def test_quitting_mid_download_cancels_it(store):
    library = FakeLibrary(step_s=0.2)
    app = make_app(store, library=library)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        await pilot.press("down", "down", "p")
        await wait_for(pilot, lambda: (screen.query_one("#download-progress").progress or 0) >= 100_000_000)
        await pilot.press("ctrl+q")
    assert library.pull_ended.wait(timeout=1.0)  # not left running to the end of a 2 s download
    assert not library.installed["tiny-draft"]


async def test_failed_download_says_why(store):
    app = make_app(store, library=FakeLibrary(fail="checksum mismatch for tiny-draft.gguf", step_s=0.01))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        await pilot.press("down", "down", "p")
        await wait_for(pilot, lambda: screen.pulling is None)
        assert "checksum mismatch" in str(screen.query_one("#download-status").render())


async def test_the_library_shows_names_and_descriptions_as_written_not_read_as_markup(store):
    """A model of the user's models.yaml described as `beta [/]` ended the app as the
    library was drawn (Rich's MarkupError in a table cell), and `[Q4]` or `[bold]` went
    missing from a title or a source; the pull's status line read the name as markup too."""
    from textual.widgets import DataTable

    from edgespec.tui.library import LibraryRow

    row = ["my[/]model", "Qwen [Q4]", "model", "[bold]local", "beta [/] [experimental]"]

    class Library(FakeLibrary):
        def rows(self):
            name, title, kind, source, description = row
            return [LibraryRow(name, kind, False, 10, source, description, title=title)]

    library = Library(step_s=0.2)
    app = make_app(store, library=library)
    async with app.run_test(size=(160, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+o")
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        await pilot.pause()
        assert [str(cell) for cell in screen.query_one(DataTable).get_row_at(0)[1:]] == [*row[:2], row[2],
                                                                                          "10 B", *row[3:]]
        await pilot.press("p")
        status = screen.query_one("#download-status")
        await wait_for(pilot, lambda: "Pulling my[/]model" in str(status.render()))
        await wait_for(pilot, lambda: "MB/s" in str(status.render()))
        assert str(status.render()).startswith("my[/]model · ")
        await pilot.press("c")
        await wait_for(pilot, lambda: screen.pulling is None)


async def test_the_status_line_shows_the_files_assembled_and_verified_while_the_models_load(store):
    checked = threading.Event()  # the load waits half way until the test has looked

    def load(choice, settings, progress):
        total = 1_100_000_000
        progress(Progress("tiny-target.gguf", 412_000_000, total, 23.5e6, 29.6, stage="assemble"))
        checked.wait(timeout=5)
        progress(Progress("tiny-target.gguf", total, total, 23.5e6, 0.0, stage="verify"))
        return SpecFakeEngine(reply=lambda prompt: REPLY)

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        status = app.query_one(StatusLine)
        await wait_for(pilot, lambda: "assemble" in status.detail)
        assert status.model_state == "loading"
        assert status.detail == "assemble tiny-target.gguf · 412.0 MB / 1.1 GB · 23.5 MB/s · 30 s left"
        checked.set()
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert status.detail == ""


async def test_model_that_fails_to_load_is_shown_not_raised(store):
    def load(choice, settings, progress):
        raise ModelFileError("Model tiny-target is not installed: run `edgespec pull tiny-target`")

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "failed")
        status = app.query_one(StatusLine)
        assert status.model_state == "failed" and "edgespec pull tiny-target" in status.detail
        banner = app.query_one("#banner")
        assert banner.display and "ctrl+o" in str(banner.render())
        await send(pilot, "hello?")
        await pilot.pause()
        assert boxes(app) == [] and not app.chat.generating


async def test_settings_put_back_after_a_load_they_failed_load_the_models_again(store):
    """A context size the models fail to load with, then the size put back in the settings:
    the models load again with it. They stayed failed, the settings matching the last
    load that had worked."""
    def load(choice, settings, progress):
        if settings.load.n_ctx == 65536:
            raise ModelFileError("not enough memory for a context of 65,536 tokens")
        return SpecFakeEngine(reply=lambda prompt: "ok")

    app = make_app(store, load=load)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        for size, state in (("65536", "failed"), ("auto", "ready")):
            await pilot.press("ctrl+s")
            app.screen.query_one("#n_ctx").value = size
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.model_state == state)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert boxes(app)[1].content == "ok"


async def test_a_chat_opened_while_the_models_first_load_gets_them_loaded_for_its_settings(store):
    """A chat whose settings want another context size, opened while the models first
    load: they load again for it. They stayed loaded with the defaults."""
    other = store.create(title="Long files")
    store.save_settings(other, {"n_ctx": 16384})
    first = threading.Event()
    loads = []

    def load(choice, settings, progress):
        loads.append(settings.load.n_ctx)
        if len(loads) == 1:
            first.wait(10)
        return SpecFakeEngine(reply=lambda prompt: "ok", n_ctx=settings.load.n_ctx or 8192)

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: loads == [None])
        await app.chat.open_conversation(other)
        first.set()
        await wait_for(pilot, lambda: app.model_state == "ready" and loads[-1] == 16384)
        assert app.chat.session.engine.n_ctx == 16384


async def test_a_load_overtaken_by_another_frees_its_models_and_leaves_the_newer_ones(store):
    """A load asked for while another runs (a chat opened with other settings): the older
    load, ending after the newer one, frees its models. They replaced the newer ones and
    stayed loaded beside them, twice the memory, never freed."""
    other = store.create(title="Long files")
    store.save_settings(other, {"n_ctx": 16384})
    first = threading.Event()
    engines = []

    def load(choice, settings, progress):
        if not engines:
            engines.append(None)
            first.wait(10)
            engines[0] = SpecFakeEngine(reply=lambda prompt: "old", n_ctx=8192)
            return engines[0]
        engines.append(SpecFakeEngine(reply=lambda prompt: "ok", n_ctx=settings.load.n_ctx))
        return engines[-1]

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: engines == [None])
        await app.chat.open_conversation(other)
        await wait_for(pilot, lambda: app.model_state == "ready")
        first.set()
        await wait_for(pilot, lambda: engines[0] is not None and engines[0].closed)
        await pilot.pause()
        assert app.models.engine is engines[1] and app.chat.session.engine is engines[1]
        assert app.model_state == "ready" and not engines[1].closed


async def test_a_load_overtaken_by_another_that_fails_leaves_the_newer_models_ready(store):
    """The older load failing after the newer one loaded says nothing: the models the
    chat uses are ready."""
    other = store.create(title="Long files")
    store.save_settings(other, {"n_ctx": 16384})
    first, failed = threading.Event(), threading.Event()

    def load(choice, settings, progress):
        if not settings.load.n_ctx:
            first.wait(10)
            failed.set()
            raise ModelFileError("out of memory")
        return SpecFakeEngine(reply=lambda prompt: "ok", n_ctx=settings.load.n_ctx)

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await app.chat.open_conversation(other)
        await wait_for(pilot, lambda: app.model_state == "ready")
        first.set()
        await wait_for(pilot, failed.is_set)
        await pilot.pause(0.2)
        assert app.model_state == "ready" and not any("out of memory" in n for n in app.notes)


async def test_other_models_start_without_the_plain_speed_of_the_last(store):
    """The speedup on the status line is over a plain reply of the models loaded: models
    loaded again (others, or on other hardware) start without one. It stayed the speed of
    the models before, a speedup between two models."""
    app = make_app(store, reply="plain words here", delay_s=0.002, defaults=ChatSettings(mode="plain"))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert app.chat.plain_tps
        app.load_models(ModelChoice(target="tiny-target"))
        await wait_for(pilot, lambda: app.model_state == "ready" and len(app.engines) == 2)
        assert app.chat.plain_tps is None


async def test_a_load_overtaken_by_another_does_not_report_its_files_on_the_status_line(store):
    """While the newer load runs, the status line follows its files only: the older one's
    (another model, other settings) were shown as the newer one's progress."""
    other = store.create(title="Long files")
    store.save_settings(other, {"n_ctx": 16384})
    older, newer, reported = threading.Event(), threading.Event(), threading.Event()

    def load(choice, settings, progress):
        if not settings.load.n_ctx:
            older.wait(10)
            progress(Progress("older.gguf", 1, 10, None, None, stage="verify"))
            reported.set()
        else:
            newer.wait(10)
        return SpecFakeEngine(reply=lambda prompt: "ok", n_ctx=settings.load.n_ctx or 8192)

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await app.chat.open_conversation(other)
        older.set()
        await wait_for(pilot, reported.is_set)
        await pilot.pause(0.2)
        assert app.model_state == "loading" and "older.gguf" not in app.query_one(StatusLine).detail
        newer.set()
        await wait_for(pilot, lambda: app.model_state == "ready")


async def test_generation_error_is_reported(store):
    class Broken(SpecFakeEngine):
        def generate(self, prompt_tokens, params, *, regions=()):
            yield from []
            raise RuntimeError("llama_decode returned -1")

    app = make_app(store, engine_cls=Broken)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        assert boxes(app)[1].status in ("interrupted", "error")


async def test_a_message_too_long_for_the_context_comes_back_to_the_prompt(store):
    """A message that does not fit is refused before anything is stored: a notice, the
    conversation as it was (no box of it, no copy of the last reply), and the text back."""
    app = make_app(store, reply="short reply")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        long = "x " * 5000
        await send(pilot, long)
        await wait_for(pilot, lambda: not app.chat.generating and any("does not fit" in n for n in app.notes))
        await pilot.pause()
        assert [(b.role, b.content) for b in boxes(app)] == [("user", "Hello"), ("assistant", "short reply")]
        assert app.query_one(PromptInput).text.strip() == long.strip()
        stored = store.messages(app.chat.conversation_id)
        assert [m.content for m in stored if m.role != "system"] == ["Hello", "short reply"]


async def test_an_edit_too_long_for_the_context_comes_back_to_its_editor(store):
    """An edit refused before anything is stored opens again in the editor, as written,
    to shorten and resend: it was said and thrown away."""
    app = make_app(store, reply="short reply")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.press("ctrl+g")
        long = "x " * 5000
        app.screen.query_one("#value").load_text(long)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.chat.generating and any("does not fit" in n for n in app.notes))
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        assert app.screen.query_one("#value").text == long.strip()
        app.screen.query_one("#value").load_text("Hi")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.chat.generating and boxes(app)[0].content == "Hi")
        assert [(b.role, b.content) for b in boxes(app)] == [("user", "Hi"), ("assistant", "short reply")]
        stored = store.messages(app.chat.conversation_id)
        assert [m.content for m in stored if m.role != "system"] == ["Hi", "short reply"]


async def test_help_and_command_palette_list_the_actions(store):
    app = make_app(store)
    async with app.run_test(size=(110, 40)) as pilot:
        await pilot.press("f1")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for name in ("Regenerate", "Settings", "Models", "Token colours", "Copy code block", "Export Markdown"):
            assert any(t.startswith(name) for t in titles), name


# -- pure helpers ----------------------------------------------------------------------

def test_origin_spans_and_helpers():
    assert origin.spans(["a", "b", "c", "d"], [True, True, False, True]) == [("ab", True), ("c", False), ("d", True)]
    engine = FakeEngine()
    assert origin.chunk_spans(engine, "hey", [104, 101, 121], [True, True, False]) == [("he", True), ("y", False)]
    assert origin.chunk_spans(engine, "é", [1, 2], [True, False]) == [("é", False)]
    assert origin.stored_spans(engine, "ab", [True, False]) == [("a", True), ("b", False)]
    assert origin.stored_spans(engine, "ab", [True]) == [("ab", False)]
    assert code_blocks("x\n```py\na = 1\n```\ntext\n~~~\nb\n~~~") == ["a = 1", "b"]
    stats = Stats(mode="draft", k=4, generated_tokens=11, drafted=8, accepted=6, target_passes=4, decode_s=1.1,
                  drafter="draft", reason="high acceptance")
    line = format_live(stats, plain_tps=5.0)
    assert "10.0 tok/s" in line and "×2.00" in line and "accept 75%" in line and "2.75 tok/pass" in line
    assert "high acceptance" in line
    reading = Stats(mode="auto", prompt_tokens=5000, prompt_cached=1000, prompt_evaluated=1024)
    assert format_live(reading) == "mode auto │ reading the prompt: 1,024 of 4,000 tokens (26%)"
    assert describe_progress(PullProgress(412_000_000, 1_100_000_000, 23.5e6, 29.6, "m")) == \
        "m · 412.0 MB / 1.1 GB · 23.5 MB/s · 30 s left"


def test_a_code_block_is_copied_as_markdown_reads_it_in_lists_and_around_fences():
    """A block in a list item is copied without the item's indentation (Python pasted with
    it does not run), and a longer fence holds shorter ones: a reply that shows Markdown
    with code in it (CommonMark's fenced code blocks)."""
    listed = "1. Save it:\n\n   ```python\n   def f():\n       return 1\n   ```\n"
    assert code_blocks(listed) == ["def f():\n    return 1"]
    nested = "````markdown\n# Use\n```sh\nmake\n```\n````\nafter"
    assert code_blocks(nested) == ["# Use\n```sh\nmake\n```"]
    assert code_blocks("~~~~\n~~~\nx\n~~~~~") == ["~~~\nx"]
    assert code_blocks("```\na\n``` not a fence\n```") == ["a\n``` not a fence"]


def test_the_screen_spares_the_cpu_only_where_the_target_decodes_on_it():
    """On a CPU llama.cpp decodes on every core, so the screen keeps to its share
    of one; with every layer of the target on a local GPU it redraws at RENDER_HZ."""
    def info(gpu_offload, target_layers, rpc=False):
        layers = (LayerRun("RPC0", "127.0.0.1:50052", 29),) if rpc else ()
        target = model_info(n_layer=28, n_gpu_layers=target_layers, layers=layers)
        return engine_info({"target": target}, backend="cuda", gpu_offload=gpu_offload)

    assert redraw_share(None) == RENDER_SHARE
    assert redraw_share(engine_info({"target": model_info()})) == RENDER_SHARE
    assert redraw_share(info(False, 0)) == RENDER_SHARE
    assert redraw_share(info(True, 10)) == RENDER_SHARE  # the rest of the target decodes on the CPU
    assert redraw_share(info(False, 29)) == RENDER_SHARE  # GPU layers asked for, none there
    assert redraw_share(info(True, 29, rpc=True)) == RENDER_SHARE  # workers may share this machine
    assert redraw_share(info(True, 29)) is None
    assert redraw_wait(0.001, RENDER_SHARE) == 1 / RENDER_HZ
    assert redraw_wait(0.010, 0.02) == 0.5
    assert redraw_wait(10.0, 0.02) == RENDER_WAIT_MAX
    assert redraw_wait(10.0, None) == 1 / RENDER_HZ


def test_status_line_says_where_each_model_runs():
    def info(gpu_offload, target_layers, draft_layers):
        return engine_info({"target": model_info(n_layer=28, n_gpu_layers=target_layers),
                            "draft": model_info(n_layer=24, n_gpu_layers=draft_layers)},
                           backend="cuda" if gpu_offload else "cpu", gpu_offload=gpu_offload)

    assert hardware_label(info(False, 0, 0)) == "cpu"
    assert hardware_label(info(True, 29, 25)) == "cuda · target 29/29, draft 25/25 layers on GPU"
    assert hardware_label(info(True, 29, 0)) == "cuda · target 29/29 layers on GPU"  # the draft left on the CPU shows
    assert "no GPU backend" in hardware_label(info(False, 29, 0))
    assert hardware_label(engine_info({"target": model_info()})) == "fake"
    assert hardware_label(None) == ""


async def test_a_message_sent_while_a_conversation_opens_lands_in_the_opened_one(store):
    """A conversation being opened (its view cleared and filled again) and a message
    sent meanwhile: the message and its reply are shown once the view is filled,
    never mounted into the view being cleared (and removed with it)."""
    first = store.create(title="First")
    store.append(first, Message("user", "one"))
    store.append(first, Message("assistant", "uno"))
    app = make_app(store, reply="dos")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        for i in range(3):
            opening = asyncio.ensure_future(app.chat.open_conversation(first))
            await asyncio.sleep(0)
            app.chat.post_message(PromptInput.Submitted("two"))
            await opening
            expected = ["one", "uno"] + ["two", "dos"] * (i + 1)  # the stored turns and the new one
            await wait_for(pilot, lambda: not app.chat.generating and [b.content for b in boxes(app)] == expected)
            assert all(b.is_mounted for b in boxes(app))


async def test_up_in_a_wrapped_message_moves_the_cursor_and_recalls_only_from_its_top_row(store):
    """Up and Down walk the messages sent before only from the top and bottom rows as
    shown: in a paragraph that wraps, Up moved the cursor up a row nowhere, replacing the
    message being written with the last one sent."""
    app = make_app(store, reply="ok")
    async with app.run_test(size=(60, 30)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "first")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        prompt = app.query_one(PromptInput)
        paragraph = "a long paragraph that wraps " * 8
        prompt.load_text(paragraph)
        prompt.move_cursor(prompt.document.end)
        await pilot.press("up")
        assert prompt.text == paragraph and prompt.cursor_location[1] < len(paragraph)
        prompt.move_cursor((0, 0))
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("down")
        assert prompt.text == paragraph


async def test_a_users_message_keeps_its_line_breaks(store):
    """Code pasted without a fence (the usual paste) is shown as it was typed, not
    as one run-on Markdown paragraph; the reply is still Markdown."""
    from textual.widgets import Markdown, Static

    code = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total"
    app = make_app(store, reply="**done**")
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, code)
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        user, reply = boxes(app)
        body = user.query_one(".body")
        assert isinstance(body, Static) and not isinstance(body, Markdown)
        assert str(body.render()) == code
        assert isinstance(reply.query_one(".body"), Markdown)


CODE_LINE = "    total = total + values[index] * weight  # a line of pasted code\n"


@pytest.mark.parametrize("paste, wraps", [
    ("x" * 50_000, False),  # one enormous line
    ("word " * 10_000, False),  # one enormous line with spaces to wrap at
    (CODE_LINE * 700, True),  # a file of code (47,000 characters): wrapped as before
    (CODE_LINE * 2_000, False),  # 134,000 characters
], ids=["one-line", "one-line-of-words", "code-file", "big-code-file"])
async def test_a_huge_paste_leaves_the_prompt_usable_through_resizes(store, paste, wraps):
    """Textual's text area redraws a wrapped line whole for each row it shows: a
    50,000-character line at a narrow width took seconds a redraw, resizes and
    keys (quitting too) queued behind. Such text scrolls sideways instead."""
    from textual import events

    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        prompt = app.query_one(PromptInput)
        prompt.focus()
        app.post_message(events.Paste(paste))  # as the terminal sends it
        await pilot.pause()
        assert len(prompt.text) == len(paste) and prompt.text == paste and prompt.soft_wrap is wraps
        await pilot.resize_terminal(20, 10)
        await pilot.pause()
        assert not app.query_one("#sidebar").display  # too narrow for both: the chat keeps the width
        assert prompt.content_size.width >= 10
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert app.query_one("#sidebar").display
        prompt.select_all()
        await pilot.press("backspace")  # and once it is gone, short text wraps again
        await pilot.press("h", "i")
        assert prompt.text == "hi" and prompt.soft_wrap
        await pilot.press("ctrl+q")
    assert not app.is_running


async def test_a_paste_typed_as_keys_costs_no_whole_text_work_per_key(store, monkeypatch):
    """A paste that arrives as keystrokes (no bracketed paste: `tmux paste-buffer`
    without -p) into a prompt holding 30 KB: each key used to measure the whole
    text again and be its own edit (minutes for 30 KB, Ctrl+Q queued behind).
    A burst is inserted in few edits, measuring only the lines they touch, and
    the keys after it (Esc, Ctrl+Q) still act."""
    from textual import events

    from edgespec.tui.app import EdgespecApp
    from edgespec.tui.widgets import long_text

    edits, measured = [], []  # the edits made, and the lines read to measure the text
    edit, measure, should_wrap = long_text.LongTextArea.edit, getattr(long_text, "measure", None), long_text.should_wrap

    def counting_edit(self, change):
        edits.append(change)
        return edit(self, change)

    def counting(function):
        def counted(lines):
            measured.append(len(lines))
            return function(lines)
        return counted

    searches = []  # Textual's searches of every binding for one that has the key
    check_bindings = EdgespecApp._check_bindings

    async def counting_check(self, key, priority=False):
        searches.append(key)
        return await check_bindings(self, key, priority)

    monkeypatch.setattr(EdgespecApp, "_check_bindings", counting_check)
    monkeypatch.setattr(long_text.LongTextArea, "edit", counting_edit)
    monkeypatch.setattr(long_text, "measure", counting(measure), raising=False)
    monkeypatch.setattr(long_text, "should_wrap", counting(should_wrap))
    app = make_app(store, reply="word " * 2000, delay_s=0.02)  # streams till Esc
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "Talk", key=False)  # a reply streams meanwhile
        await wait_for(pilot, lambda: len(boxes(app)) == 2 and boxes(app)[1].content)
        prompt = app.query_one(PromptInput)
        before = CODE_LINE * 450  # 30 KB
        prompt.load_text(before)
        prompt.move_cursor(prompt.document.end)
        await pilot.pause()
        edits.clear()
        measured.clear()
        searches.clear()
        typed = ("paste me " * 5 + "\n") * 44  # 2,024 keys
        for ch in typed:
            app.post_message(events.Key({" ": "space", "\n": "ctrl+j"}.get(ch, ch), ch))
        app.post_message(events.Key("escape", None))
        await wait_for(pilot, lambda: not app.chat.generating)
        assert boxes(app)[1].status == "stopped"  # Esc, after the burst, stopped the reply
        assert prompt.text == before + typed and prompt.soft_wrap
        assert len(edits) <= len(typed) // 20
        assert sum(measured) <= typed.count("\n") + 2 * len(edits)  # the lines edits touched, not the 450 before
        assert len(searches) <= 2 * (typed.count("\n") + 1)  # for Ctrl+J and Esc, not for the characters
        await pilot.press("x")  # a key on its own shows at once
        assert prompt.text == before + typed + "x"
        app.post_message(events.Key("ctrl+q", None))
        await wait_for(pilot, lambda: not app.is_running)


@pytest.mark.parametrize("height", [5, 7])
async def test_in_a_terminal_a_few_rows_high_what_is_typed_is_seen(store, height):
    """Five rows high, the header, the status line and the footer left the prompt its
    top border: the status line and the footer covered the row being typed in."""
    app = make_app(store)
    async with app.run_test(size=(60, height)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("h", "i")
        row = prompt.content_region
        assert row.height >= 1 and app.screen.get_widget_at(row.x, row.y)[0] is prompt
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)


async def test_undoing_a_long_line_lets_the_prompt_wrap_again(store):
    app = make_app(store)
    async with app.run_test():
        prompt = app.query_one(PromptInput)
        prompt.insert("x" * 2_000)
        assert not prompt.soft_wrap
        prompt.undo()
        assert prompt.text == "" and prompt.soft_wrap
        prompt.redo()
        assert prompt.text == "x" * 2_000 and not prompt.soft_wrap


async def test_choosing_a_chat_hands_the_keys_to_the_prompt_and_enter_in_search_opens_the_first_match(store):
    first = store.create(title="First")
    store.append(first, Message("user", "one"))
    second = store.create(title="Second")
    store.append(second, Message("user", "two"))
    app = make_app(store)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        app.query_one("#conversations").focus()
        await pilot.press("down", "enter")  # the newest: Second
        await wait_for(pilot, lambda: app.chat.conversation_id == second)
        assert isinstance(app.focused, PromptInput)
        await pilot.press("h", "i")
        assert app.query_one(PromptInput).text == "hi"
        await pilot.press("ctrl+f", *"Fir", "enter")
        await wait_for(pilot, lambda: app.chat.conversation_id == first)
        assert isinstance(app.focused, PromptInput)
        app.query_one("#search").value = ""
        await pilot.press("ctrl+f", *"rst", "enter")  # the match is the chat already open
        assert app.chat.conversation_id == first and isinstance(app.focused, PromptInput)


class SearchRecordingStore(ConversationStore):
    """A store that records each search (its text, and whether it ran on the UI's thread),
    and holds the searches named in `hold` until that event is set."""

    def __init__(self, path):
        super().__init__(path)
        self.searches: list[tuple[str, bool]] = []
        self.hold: dict[str, threading.Event] = {}
        self.held = threading.Event()
        self.finished: list[str] = []

    def list(self, *, search=None):
        if search is not None:
            self.searches.append((search, threading.current_thread() is threading.main_thread()))
            if search in self.hold:
                self.held.set()
                self.hold[search].wait(10)
        try:
            return super().list(search=search)
        finally:
            self.finished.append(search)


def _listed(app) -> list[str]:
    options = app.query_one("#conversations")
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def test_search_waits_for_a_pause_in_the_typing_and_runs_off_the_ui_thread(tmp_path, monkeypatch):
    from edgespec.tui.widgets import sidebar

    monkeypatch.setattr(sidebar, "SEARCH_PAUSE_S", 1.0)  # longer than four key presses take on a busy machine
    store = SearchRecordingStore(tmp_path / "chats.db")
    store.create(title="Lanes", messages=[Message("user", "bike lanes")])
    store.create(title="Songs", messages=[Message("user", "bird song")])
    app = make_app(store)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+f", *"bike")
        await wait_for(pilot, lambda: _listed(app) == ["Lanes"])
        assert store.searches == [("bike", False)]


async def test_an_older_search_that_ends_late_does_not_replace_a_newer_ones_list(tmp_path, monkeypatch):
    from edgespec.tui.widgets import sidebar

    monkeypatch.setattr(sidebar, "SEARCH_PAUSE_S", 0.05)
    store = SearchRecordingStore(tmp_path / "chats.db")
    store.create(title="Lanes", messages=[Message("user", "bike lanes")])
    store.create(title="Songs", messages=[Message("user", "bird song")])
    store.hold["bi"] = threading.Event()
    app = make_app(store)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+f", "b", "i")
        await wait_for(pilot, lambda: store.held.is_set())
        await pilot.press("k", "e")
        await wait_for(pilot, lambda: _listed(app) == ["Lanes"])
        store.hold["bi"].set()
        await wait_for(pilot, lambda: "bi" in store.finished)
        await pilot.pause(0.2)  # for what it would post
        assert _listed(app) == ["Lanes"]
    store.close()


async def test_a_search_that_ends_after_the_quit_ends_quietly(tmp_path, monkeypatch):
    """A search still running as the user quits ends on a closed store (the app closes the one it
    opened) with the app gone. Its worker must end without an error: reaching for the app then
    raises (NoActiveAppError; RuntimeError from call_from_thread once App.run has returned, which
    blocks while the app winds down), a traceback or a hang at exit."""
    from edgespec.tui.widgets import sidebar

    monkeypatch.setattr(sidebar, "SEARCH_PAUSE_S", 0.05)
    failures = []
    run_worker = sidebar.ConversationList.run_worker

    def recording_run_worker(self, work, *args, **kwargs):
        def recorded():
            try:
                return work()
            except BaseException as e:
                failures.append(e)
                raise

        return run_worker(self, recorded, *args, **kwargs)

    monkeypatch.setattr(sidebar.ConversationList, "run_worker", recording_run_worker)
    chats = SearchRecordingStore(tmp_path / "chats.db")
    chats.create(title="Lanes", messages=[Message("user", "bike lanes")])
    chats.hold["bi"] = threading.Event()
    app = make_app(chats)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.press("ctrl+f", "b", "i")
        await wait_for(pilot, lambda: chats.held.is_set())
        await pilot.press("ctrl+q")
    chats.close()  # as the app closes the store it opened
    chats.hold["bi"].set()
    deadline = time.monotonic() + 10
    while "bi" not in chats.finished:
        assert time.monotonic() < deadline, "the search did not end"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # for what the worker does next
    assert failures == []


async def test_a_reply_that_waits_for_another_edgespec_in_the_same_chat_says_so(store):
    from edgespec.chat.reply_lock import reply_lock

    cid = store.create(title="Shared")
    store.append(cid, Message("user", "one"))
    store.append(cid, Message("assistant", "uno"))
    app = make_app(store, reply="dos")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await app.chat.open_conversation(cid)
        status = app.query_one(StatusLine)
        notes = len(app.notes)
        with reply_lock(store.path, cid):  # another process is replying in this conversation
            await send(pilot, "two", key=False)
            await wait_for(pilot, lambda: len(app.notes) == notes + 1)
            assert app.chat.generating and status.detail and boxes(app)[-1].content == ""
        await wait_for(pilot, lambda: not app.chat.generating)
        assert [m.content for m in store.messages(cid)] == ["one", "uno", "two", "dos"]
        assert "tok/pass" in status.detail  # the wait's words gave way to the reply's statistics


@pytest.mark.parametrize("key", ["escape", "ctrl+q"])
async def test_a_reply_waiting_for_another_edgespec_stops_on_escape_and_on_quitting(store, key):
    """Waiting for another edgespec's reply in the same chat (minutes, for a long one),
    Esc did nothing, and quitting waited QUIT_WAIT_S (30 s) for the models, then for
    that reply to end before the process could. Now the wait gives up: the message
    comes back to the prompt, stored nowhere."""
    from edgespec.chat.reply_lock import reply_lock

    cid = store.create(title="Shared")
    store.append(cid, Message("user", "one"))
    store.append(cid, Message("assistant", "uno"))
    app = make_app(store, reply="dos")
    with reply_lock(store.path, cid):  # another process is replying in this conversation
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.model_state == "ready")
            await app.chat.open_conversation(cid)
            await send(pilot, "two", key=False)
            await wait_for(pilot, lambda: any("Another edgespec" in n for n in app.notes))
            began = time.monotonic()
            await pilot.press(key)
            if key == "escape":
                await wait_for(pilot, lambda: not app.chat.generating)
                assert app.query_one(PromptInput).text == "two"
                assert [b.content for b in boxes(app)] == ["one", "uno"]
                assert "waiting" not in app.query_one(StatusLine).detail
        assert time.monotonic() - began < 5
        assert [m.content for m in store.messages(cid)] == ["one", "uno"]


@pytest.mark.parametrize("width", [110, 120])
async def test_the_quit_key_is_shown_in_the_footer_and_the_help(store, width):
    from textual.widgets import Markdown
    from textual.widgets._footer import FooterKey

    app = make_app(store)
    async with app.run_test(size=(width, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await pilot.pause()
        keys = sorted(app.query(FooterKey), key=lambda k: k.region.x)
        assert [k for k in keys if k.key == "ctrl+q"]
        assert keys[-1].region.right <= width  # every key drawn whole: none covered by another or cut off
        assert all(a.region.right <= b.region.x for a, b in zip(keys, keys[1:]))
        await pilot.press("f1")
        assert "`ctrl+q`" in app.screen.query_one(Markdown).source
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert sum(t.startswith("Quit") for t in titles) == 1  # Textual's own, not a second one


async def test_export_names_its_full_path_and_never_overwrites_an_earlier_one(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(store, export_dir=".")  # the current folder, as the app's default
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "code please")
        await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
        await pilot.press("f3")
        [first] = tmp_path.glob("edgespec-*.md")
        assert str(first) in app.notes[-1]  # the full path, not a name relative to somewhere
        first.write_bytes(b"edited by hand")
        await pilot.press("f3")
        second = first.with_name(f"{first.stem}-2.md")
        assert set(tmp_path.glob("edgespec-*.md")) == {first, second}
        assert first.read_bytes() == b"edited by hand"
        assert "code please" in second.read_text() and str(second) in app.notes[-1]


async def test_a_new_or_another_chat_starts_without_the_last_replys_statistics(store):
    other = store.create(title="Other")
    store.append(other, Message("user", "x"))
    app = make_app(store)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        status = app.query_one(StatusLine)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.chat.generating and "tok/pass" in status.detail)
        await pilot.press("ctrl+n")
        assert status.detail == ""
        await send(pilot, "again")
        await wait_for(pilot, lambda: not app.chat.generating and "tok/pass" in status.detail)
        app.query_one(ConversationList).post_message(ConversationList.Selected(other))
        await wait_for(pilot, lambda: app.chat.conversation_id == other)
        assert status.detail == ""


@pytest.mark.parametrize("width", [120, 80, 40])
async def test_the_status_line_fits_its_width(store, width):
    """Long model names, where they run, the colour legend and every statistic: more
    than 120 columns. The label is shortened first, then the last statistics go."""
    app = make_app(store)
    async with app.run_test(size=(width, 30)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        status = app.query_one(StatusLine)
        stats = Stats(mode="auto", k=6, generated_tokens=412, drafted=520, accepted=390, target_passes=150,
                      decode_s=20.6, prompt_tokens=3_000, prompt_cached=2_800, drafter="draft",
                      reason="draft model: acceptance 75% over the last 64 tokens")
        status.model_label = ("qwen2.5-coder-7b-instruct-q4_k_m + qwen2.5-coder-0.5b-instruct-q8_0 "
                              "(cuda · target 29/29, draft 25/25 layers on GPU)")
        status.detail = format_live(stats, plain_tps=9.0)
        status.origin_view = True
        await pilot.pause()
        line = status.render()
        assert line.cell_len <= status.content_size.width == width - 2  # padding 0 1
        assert str(line).startswith("● ready qwen2.5")
        assert width < 80 or format_live(stats).split(" │ ")[0] in str(line)  # the mode stays while there is room


async def test_settings_saved_while_a_reply_streams_take_effect_when_it_ends(store):
    """Saved mid-reply, the settings were stored but the session kept its old ones (and
    the models their hardware) until another conversation was opened."""
    loads = []

    def load(choice, settings, progress):
        loads.append(settings.load)
        return FakeEngine(reply=lambda prompt: "word " * 20, hold=hold, hold_after=10)

    hold = threading.Event()
    app = make_app(store, load=load)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "hi", key=False)
        await wait_for(pilot, lambda: app.chat.generating)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)
        app.screen.query_one("#max_tokens").value = "3"
        app.screen.query_one("#n_ctx").value = "4096"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.chat.generating and len(loads) == 1  # the reply goes on as it began
        hold.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        await wait_for(pilot, lambda: len(loads) == 2 and app.model_state == "ready")
        assert app.chat.session.params.max_tokens == 3 and loads[-1].n_ctx == 4096


async def test_titles_and_paths_are_shown_as_written_not_read_as_markup(store):
    """A chat title holding square brackets (a question about `list[int]`, or `[/]`) was
    read as Textual markup: shown changed, or the sidebar raised MarkupError and the app
    ended, at every launch since the title was stored. A path from a reply (`[slug].tsx`)
    in a dialog's question, the same."""
    from textual.widgets import Label, OptionList

    from edgespec.tui.screens.dialogs import ConfirmScreen

    titles = ["what is list[int] vs List[int]?", "[/] and close[/red]", "[link=http://x]l[/link]"]
    for title in titles:
        store.create(title=title)
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        options = app.query_one("#conversations", OptionList)
        shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert sorted(shown) == sorted(titles)
        await app.chat.open_conversation(1)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert titles[0] in str(app.screen.query_one(".title", Label).render())
        await pilot.press("escape")
        app.push_screen(ConfirmScreen("Create src/[slug].tsx? [/]"))
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.query(Label))
        assert "src/[slug].tsx? [/]" in str(app.screen.query(Label).first().render())


async def test_a_title_stored_by_an_older_edgespec_is_shown_fit_for_a_terminal_in_every_dialog(store):
    """A title stored before titles were cleaned (an escape, a line break) is shown in
    the settings and in the rename dialog as the sidebar shows it: those two showed it
    as stored, the escape written to the terminal."""
    import sqlite3

    from textual.widgets import Input, Label

    cid = store.create(title="x")
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE conversations SET title = ? WHERE id = ?", ("Notes\x1b]0;owned\x07 on\nlogs", cid))
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await app.chat.open_conversation(cid)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert "“Notes]0;owned on logs”" in str(app.screen.query_one(".title", Label).render())
        await pilot.press("escape", "f2")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        assert app.screen.query_one("#value", Input).value == "Notes]0;owned on logs"


async def test_quitting_while_the_models_load_tells_the_load_to_stop(store):
    """The screen closed at once, but the process stayed until the load was done (seconds
    to minutes for large models): the load is now told to stop at its next report."""
    from edgespec.errors import ModelLoadError
    from edgespec.llama import backend

    began, stopped = threading.Event(), threading.Event()

    def load(choice, settings, progress):
        import edgespec.engine.runtime  # noqa: F401  (as a real load imports the engine)

        backend.load_began()
        began.set()
        for _ in range(400):  # reporting its progress as llama.cpp's loader does
            if not backend.loading_progress(0.5):
                stopped.set()
                raise ModelLoadError("loading was stopped")
            time.sleep(0.05)
        return FakeEngine()

    app = make_app(store, load=load)
    async with app.run_test() as pilot:
        await wait_for(pilot, began.is_set)
        await pilot.press("ctrl+q")
    assert stopped.wait(timeout=5)


async def test_a_chat_deleted_by_another_edgespec_is_left_for_a_new_one(tmp_path):
    """Deleted in another process while open here, a chat refused every later message
    with "There is no conversation 1; `edgespec chats` lists them", and rename and delete
    with it: the screen stayed on a chat that was gone. Now the next message says so and
    goes, with its text, to a new chat."""
    path = tmp_path / "chats.db"
    with ConversationStore(path) as store:
        cid = store.create(title="Shared")
        store.append(cid, Message("user", "one"))
        store.append(cid, Message("assistant", "uno"))
        app = make_app(store, reply="ok")
        async with app.run_test(size=(110, 36)) as pilot:
            await wait_for(pilot, lambda: app.model_state == "ready")
            await app.chat.open_conversation(cid)
            with ConversationStore(path) as other:
                other.delete(cid)
            await send(pilot, "two")
            await wait_for(pilot, lambda: any("deleted" in n for n in app.notes))
            assert app.chat.conversation_id is None and boxes(app) == []
            assert app.query_one(PromptInput).text == "two"
            await send(pilot, "two")
            await wait_for(pilot, lambda: len(boxes(app)) == 2 and not app.chat.generating)
            assert [m.content for m in store.messages(app.chat.conversation_id) if m.role != "system"] == ["two", "ok"]


async def test_a_chat_deleted_by_another_edgespec_while_it_replies_says_the_reply_is_not_stored(tmp_path):
    """Deleted in another process while a reply streamed here, the reply ended as done,
    stored nowhere, and the notice said "There is no conversation 1; `edgespec chats`
    lists them", a command line's words about a chat the user had not named."""
    path = tmp_path / "chats.db"
    with ConversationStore(path) as store:
        cid = store.create(title="Shared")
        store.append(cid, Message("user", "one"))
        store.append(cid, Message("assistant", "uno"))
        hold = threading.Event()
        app = make_app(store, reply="word " * 20, hold=hold, hold_after=3)
        async with app.run_test(size=(110, 36)) as pilot:
            await wait_for(pilot, lambda: app.model_state == "ready")
            await app.chat.open_conversation(cid)
            await send(pilot, "two", key=False)
            await wait_for(pilot, lambda: app.engines[0].prompts)
            with ConversationStore(path) as other:
                other.delete(cid)
            hold.set()
            await wait_for(pilot, lambda: not app.chat.generating)
            await pilot.pause()
            assert app.notes == ["This chat was deleted (by another edgespec, or on the command line) while it "
                                 "replied: the reply is shown here, not stored."]
            assert [b.content for b in boxes(app)][:3] == ["one", "uno", "two"]


async def test_a_new_chat_can_be_renamed_before_its_reply_and_delete_says_why_it_waits(store):
    """A new chat is stored with its first message, but rename said "Nothing to rename
    yet" until the reply's first token; and delete did nothing, silently, during a reply."""
    from edgespec.tui.screens.dialogs import TextPromptScreen

    hold = threading.Event()
    app = make_app(store, reply="word " * 20, hold=hold, hold_after=0)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "hello", key=False)
        await wait_for(pilot, lambda: app.chat.session.conversation_id is not None)
        await pilot.press("f8")
        await wait_for(pilot, lambda: app.notes)
        assert "Stop the reply" in app.notes[-1]
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        await pilot.press("escape")
        hold.set()
        await wait_for(pilot, lambda: not app.chat.generating)


async def test_a_new_chat_before_its_reply_exports_and_its_settings_name_it(store, tmp_path):
    """A new chat is stored with its first message: before the reply's first token, F3
    said "Nothing to export yet" and the settings were titled for new chats."""
    from textual.widgets import Label

    hold = threading.Event()
    app = make_app(store, reply="word " * 20, hold=hold, hold_after=0, export_dir=tmp_path)
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        await send(pilot, "hello there", key=False)
        await wait_for(pilot, lambda: app.chat.session.conversation_id is not None)
        await pilot.press("f3")
        await wait_for(pilot, lambda: app.notes)
        assert [p.name for p in tmp_path.glob("edgespec-*.md")] and "Exported" in app.notes[-1]
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert "“hello there”" in str(app.screen.query_one(".title", Label).render())
        await pilot.press("escape")
        hold.set()
        await wait_for(pilot, lambda: not app.chat.generating)


async def test_actions_on_an_empty_chat_say_why_they_do_nothing(store):
    """Edit & resend and Copy reply did nothing, silently, on an empty chat (from the
    command palette too), where the other actions say why."""
    app = make_app(store)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        app.chat.action_edit()
        app.chat.action_copy_reply()
        await pilot.pause()
        assert app.notes[-2:] == ["No message to edit yet.", "No reply to copy yet."]
