"""The chat screen is given one ChatContext and reads nothing else of its app:
its source reads of `self.app` only what Textual's App has, and it chats on a
plain Textual App that gives it a context, the models' signals driving it."""

import ast
import threading
from pathlib import Path

import pytest
from textual.app import App

import edgespec.tui
from edgespec.chat import ConversationStore
from edgespec.chat.session import ChatSession
from edgespec.limits import LIMITS
from edgespec.modes import DEFAULT_MODE
from edgespec.tui.app import EdgespecApp
from edgespec.tui.chat_settings import ChatSettings
from edgespec.tui.chat_context import ChatContext, Models
from edgespec.tui.screens.chat import ChatScreen
from edgespec.tui.widgets.status import StatusLine
from edgespec.workspace.root import Workspace
from tests.app_helpers import REPLY, boxes, send, wait_for
from tests.fakes import SpecFakeEngine

TUI = Path(edgespec.tui.__file__).parent
SCREENS_AND_WIDGETS = sorted([*(TUI / "screens").glob("*.py"), *(TUI / "widgets").glob("*.py")])


def app_reads(source: str) -> list[str]:
    """What `source` does with `self.app`: the attribute read, or `(self.app used bare)`
    where it is kept, passed or looked into otherwise (an alias would hide what is read)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    reads = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "app" and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            parent = parents[node]
            reads.append(parent.attr if isinstance(parent, ast.Attribute) else "(self.app used bare)")
    return reads


def not_textuals(reads: list[str]) -> list[str]:
    """The reads that are not Textual's App API (or that EdgespecApp defines or overrides)."""
    return sorted({name for name in reads if not hasattr(App, name) or name in vars(EdgespecApp)})


def test_the_checker_sees_an_app_member_read_or_the_app_kept():
    source = ("class S:\n    def f(self):\n        self.app.push_screen(1)\n        x = self.app.store\n"
              "        app = self.app\n        return self.app.screen is self, getattr(self.app, 'engine')\n")
    assert sorted(app_reads(source)) == ["(self.app used bare)", "(self.app used bare)", "push_screen", "screen",
                                         "store"]
    assert not_textuals(app_reads(source)) == ["(self.app used bare)", "store"]
    assert not_textuals(["check_action", "model_state", "push_screen"]) == ["check_action", "model_state"]


@pytest.mark.parametrize("path", SCREENS_AND_WIDGETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_screens_and_widgets_read_only_textuals_app_api_of_the_app(path):
    """The chat screen (and every other screen and widget) reads what it needs of the app
    from what it is given (ChatContext), never the app's own members: of `self.app` only
    Textual's App API (push_screen, screen, run_worker, copy_to_clipboard...)."""
    wrong = not_textuals(app_reads(path.read_text()))
    assert not wrong, f"{path.name} reads of the app what it should be given: {wrong}"


def test_the_chat_screen_reads_the_app_only_through_textuals_api_and_does_reach_it():
    reads = set(app_reads((TUI / "screens" / "chat.py").read_text()))
    assert {"push_screen", "screen"} <= reads and not not_textuals(sorted(reads))


class Host(App):
    """A plain Textual App that gives the chat screen a context and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.chat: ChatScreen | None = None

    def get_default_screen(self) -> ChatScreen:
        return self.chat


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


async def test_the_chat_screen_chats_on_any_app_that_gives_it_a_context(store, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    host = Host()
    models = Models(host, "tiny-target")
    reloads = []
    context = ChatContext(store=store, workspace=Workspace(tmp_path), export_dir=tmp_path, models=models,
                          decoding=threading.Lock(), session_factory=ChatSession, template="chatml",
                          pair_decoding=lambda: (DEFAULT_MODE, LIMITS["k"].default), reload_for=reloads.append,
                          defaults=ChatSettings(system_prompt="Be brief."))
    host.chat = screen = ChatScreen(context)
    async with host.run_test(size=(110, 36)) as pilot:
        status = host.query_one(StatusLine)
        assert status.model_state == "loading" and screen.session is None
        models.loading("tiny-target")
        models.ready(SpecFakeEngine(reply=lambda prompt: REPLY, has_draft=True), label="tiny-target (CPU)",
                     render_share=None)
        await wait_for(pilot, lambda: screen.session is not None)
        assert status.model_state == "ready" and status.model_label == "tiny-target (CPU)"
        await screen.open_conversation(None)  # a new chat: the context's defaults, and the app asked to reload
        assert screen.settings.system_prompt == "Be brief." and reloads == [screen.settings]
        await send(pilot, "Hi")
        await wait_for(pilot, lambda: not screen.generating)
        assert [b.content for b in boxes(host)] == ["Hi", REPLY]
        [chat] = store.list()
        assert [m.content for m in store.messages(chat.id)] == ["Be brief.", "Hi", REPLY]

        models.fail("the GPU went away")
        await pilot.pause()
        assert status.model_state == "failed" and status.detail == "the GPU went away"
        assert "the GPU went away" in str(host.query_one("#banner").render())
