"""SVG snapshots of the app's main screens, on a fake engine with deterministic
statistics (update with `pytest tests/test_tui_snapshots.py --snapshot-update`)."""

from __future__ import annotations

import pytest

from edgespec.chat.store import ConversationStore, Message
from edgespec.errors import ModelFileError
from edgespec.tui.chat_settings import ChatSettings
from edgespec.tui.widgets.prompt_input import PromptInput
from tests.app_helpers import boxes, make_app, send, wait_for
from tests.fakes import FakeLibrary

SIZE = (110, 34)

pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        older = s.create(title="Explain KV caches")
        s.append(older, Message("user", "What is a KV cache?"))
        s.append(older, Message("assistant", "It keeps keys and values of past tokens."))
        yield s


def steady_cursor(pilot) -> None:
    """Stop the prompt's cursor blinking, so that it shows however long the test took
    (it blinks every 0.5 s; on a loaded machine the picture caught it hidden)."""
    pilot.app.query_one(PromptInput).cursor_blink = False


async def replied(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.model_state == "ready")
    await send(pilot, "Write add() in Python")
    await wait_for(pilot, lambda: not app.chat.generating and len(boxes(app)) == 2)
    steady_cursor(pilot)
    await pilot.pause()


def test_chat_after_a_reply(snap_compare, store):
    assert snap_compare(make_app(store), terminal_size=SIZE, run_before=replied)


def test_token_origin_view(snap_compare, store):
    async def run_before(pilot):
        await replied(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()

    assert snap_compare(make_app(store), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare, store):
    async def run_before(pilot):
        await wait_for(pilot, lambda: pilot.app.model_state == "ready")
        await pilot.press("ctrl+s")
        await pilot.pause()

    app = make_app(store, defaults=ChatSettings(temperature=0.7, k=6, mode="draft"))
    assert snap_compare(app, terminal_size=(110, 44), run_before=run_before)


def test_models_screen(snap_compare, store):
    async def run_before(pilot):
        await wait_for(pilot, lambda: pilot.app.model_state == "ready")
        await pilot.press("ctrl+o")
        await pilot.pause()

    assert snap_compare(make_app(store, library=FakeLibrary()), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare, store):
    async def run_before(pilot):
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(store), terminal_size=(110, 44), run_before=run_before)


def test_model_failed_to_load(snap_compare, store):
    def load(choice, settings, progress):
        raise ModelFileError("tiny-target is not downloaded yet. Get it with `edgespec pull tiny-target` (1.0 GB).")

    async def run_before(pilot):
        await wait_for(pilot, lambda: pilot.app.model_state == "failed")
        steady_cursor(pilot)
        await pilot.pause()

    assert snap_compare(make_app(store, load=load), terminal_size=SIZE, run_before=run_before)
