"""Driving the chat app under Textual's Pilot on fake engines and a fake model
library: shared by the app's tests and its snapshot tests."""

from __future__ import annotations

import asyncio
import time

from edgespec.tui.app import EdgespecApp
from edgespec.tui.library import ModelChoice
from edgespec.tui.chat_settings import ChatSettings
from edgespec.tui.widgets.messages import MessageBox
from edgespec.tui.widgets.prompt_input import PromptInput
from tests.fakes import FakeLibrary, SpecFakeEngine

REPLY = "Here is one:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nIt **adds** two numbers."


def make_app(store, *, reply=REPLY, delay_s=0.0, engine_cls=SpecFakeEngine, load=None, library=None,
             hold=None, hold_after=0, **kwargs):
    engines = []

    def default_load(choice, settings, progress):
        engine = engine_cls(reply=lambda prompt: reply, delay_s=delay_s, has_draft=True, hold=hold,
                            hold_after=hold_after)
        engines.append(engine)
        return engine

    app = EdgespecApp(ModelChoice(target="tiny-target", draft="tiny-draft"), store=store, load=load or default_load,
                      library=library or FakeLibrary(), template="chatml", defaults=kwargs.pop("defaults", ChatSettings()),
                      **kwargs)
    app.engines = engines
    app.notes = []
    """Every notification's message, in order (the app notifies through App.notify)."""
    notify = app.notify

    def recording_notify(message, *args, **kw):
        app.notes.append(str(message))
        return notify(message, *args, **kw)

    app.notify = recording_notify
    return app


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await asyncio.sleep(0.02)


async def read_ahead_done(pilot, timeout: float = 10.0) -> None:
    """Wait until the chat reads nothing ahead (ChatSession.read_ahead, after a reply or
    a pause in the typing): past the pause begun by the last keystroke, no reading runs."""
    from textual.worker import WorkerState

    from edgespec.tui.screens.chat import READ_AHEAD_PAUSE_S

    await pilot.pause(READ_AHEAD_PAUSE_S + 0.1)
    await wait_for(pilot, lambda: not any(w.group == "read-ahead" and w.state in (WorkerState.PENDING,
                                                                                   WorkerState.RUNNING)
                                          for w in pilot.app.workers), timeout)


async def send(pilot, text: str, *, key: bool = True) -> None:
    """Type `text` and press Enter (which returns when the app is idle again, i.e. after
    the reply); key=False posts the submission and returns at once, mid-stream."""
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    if key:
        await pilot.press("enter")
    else:
        prompt.post_message(PromptInput.Submitted(text))
        await pilot.pause()  # the screen has taken it


def boxes(app) -> list[MessageBox]:
    return list(app.query(MessageBox))
