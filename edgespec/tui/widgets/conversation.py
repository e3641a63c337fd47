"""The message log of one conversation, and the reply being generated into it.

`Conversation` shows a conversation's messages, copies a reply or its code, and
streams a reply: a thread worker decodes through the chat session it is handed,
holding the `decoding` lock it was given while it uses the engine, and adds its
chunks to a `ReplyBuffer` that a `RedrawTimer` drains (edgespec/tui/stream.py).
The worker touches no widget; its end comes back as a message, and the widget
tells its screen how the reply went with `ReplyProgressed` and `ReplyEnded`.

A turn the session refuses before it begins (a file that cannot be attached, a
message that does not fit) stores nothing: the widget says why, shows what is
stored again (no box of the refused message, and what a regeneration or a resend
had taken off the screen), and hands a refused message back with `Refused`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from textual import on, work
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from edgespec.chat.attachments import not_sent_again
from edgespec.engine.events import Stats
from edgespec.errors import EdgespecError
from edgespec.tui.origin import chunk_spans, stored_spans
from edgespec.tui.stream import RENDER_SHARE, RedrawTimer, ReplyBuffer
from edgespec.tui.widgets.messages import MessageBox, code_blocks


class Conversation(VerticalScroll):
    """The messages of a conversation, and the reply being generated (one at a time)."""

    @dataclass
    class ReplyProgressed(Message):
        """The statistics of the reply so far (the live Stats)."""

        stats: Stats

    @dataclass
    class ReplyEnded(Message):
        """A reply is finished, stopped or failed, and shown as such."""

        status: str
        """The reply's ("done", "stopped", "interrupted", "error"), or "refused": the turn
        was refused before it began, nothing was stored, and the widget said why."""
        stats: Stats | None
        error: str | None
        """Why decoding failed (None: it did not, or never began)."""

    @dataclass
    class Refused(Message):
        """A message was refused before anything of it was stored: its text and files
        (paths), for the screen to give back to the user to fix and send again."""

        text: str
        files: list[str]
        edited: int | None = None
        """Where in the session the user message is that `text` was to replace (None: a new message)."""

    @dataclass
    class _NotSentAgain(Message, bubble=False):
        """Files of the conversation that changed on disk but that the turn cannot send
        again (attachments.not_sent_again): one notice each."""

        notices: list[str]

    @dataclass
    class _Decoded(Message, bubble=False):
        """The reply worker is done with the engine."""

        session: object
        box: MessageBox
        error: str | None
        pending: ReplyBuffer
        redraws: RedrawTimer
        refused: Callable[[str], None]
        """Says that the turn was refused before it began, and why."""

    show_origin: reactive[bool] = reactive(False)
    """Whether replies show their tokens coloured by origin (draft vs target)."""

    def __init__(self, decoding: threading.Lock, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.decoding = decoding
        """Held by the reply worker while it uses the engine."""
        self.engine = None
        """The loaded engine (None while there is none): how stored replies are split into tokens."""
        self.render_share: float | None = RENDER_SHARE
        """The screen's share of a CPU while a reply streams (tui/stream.py)."""
        self._stop = threading.Event()

    @property
    def stopping(self) -> threading.Event:
        """Set when the reply is asked to stop (Esc, quitting): a session given it also gives up
        waiting for another edgespec's reply (ChatSession's `stop`)."""
        return self._stop

    # -- the messages ---------------------------------------------------------------------
    async def show(self, messages: Iterable) -> None:
        """Show `messages` (stored ones, system prompt left out) instead of those shown."""
        await self.remove_children()
        await self.mount_all(self._boxes(messages))
        self.anchor()

    def _boxes(self, messages) -> Iterable[MessageBox]:
        for m in messages:
            if m.role == "system":
                continue
            runs = stored_spans(self.engine, m.content, m.from_draft) if m.role == "assistant" else None
            # a path once: an edited or regenerated message carries a file and its version changed since
            paths = dict.fromkeys(a.path for a in m.attachments if a.origin != "applied")
            yield MessageBox(m.role, m.content, status=m.status, stats=m.stats, runs=runs,
                             show_origin=self.show_origin, attachments=list(paths))

    @property
    def boxes(self) -> list[MessageBox]:
        return list(self.query(MessageBox))

    def target_box(self, role: str, focused: Widget | None) -> MessageBox | None:
        """`focused` if it is a message of `role`, else the last such message."""
        if isinstance(focused, MessageBox) and focused.role == role:
            return focused
        boxes = [b for b in self.boxes if b.role == role]
        return boxes[-1] if boxes else None

    def asked_box(self, focused: Widget | None) -> MessageBox | None:
        """The user's message `focused` is, or the one the reply `focused` answers; else the last one."""
        if isinstance(focused, MessageBox) and focused.role == "assistant":
            boxes = self.boxes
            asked = [b for b in boxes[:boxes.index(focused)] if b.role == "user"] if focused in boxes else []
            if asked:
                return asked[-1]
        return self.target_box("user", focused)

    def copy_reply(self, focused: Widget | None) -> None:
        """Copy the reply `focused` (else the last) to the clipboard."""
        box = self.target_box("assistant", focused)
        if box is None:
            self.notify("No reply to copy yet.")
            return
        self.app.copy_to_clipboard(box.content)
        self.notify("Reply copied.")

    def copy_code(self, focused: Widget | None) -> None:
        """Copy the last code block of the reply `focused` (else the last) to the clipboard."""
        box = self.target_box("assistant", focused)
        blocks = code_blocks(box.content) if box else []
        if not blocks:
            self.notify("No code block in that reply.")
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied.")

    def watch_show_origin(self, show: bool) -> None:
        for box in self.boxes:
            if show and not box.runs and box.role == "assistant" and box.content:
                box.runs = stored_spans(self.engine, box.content, None)
            box.set_show_origin(show)

    # -- replies --------------------------------------------------------------------------
    async def send(self, session, text: str, files: list[str] | None = None) -> None:
        """Show `text` as the user's, attaching `files` (paths in the session's project folder), and reply to it."""
        await self.mount(MessageBox("user", text, attachments=files))

        def refused(error: str) -> None:
            self.notify(error, title="Not sent", severity="error", timeout=10)
            self.post_message(self.Refused(text, list(files or ())))

        await self._reply(session, lambda: session.send(text, files or ()), refused, list(session.messages))

    async def regenerate(self, session) -> bool:
        """Generate the last reply again (False: the last message is not a reply)."""
        boxes = self.boxes
        if not boxes or boxes[-1].role != "assistant":
            return False
        await boxes[-1].remove()
        asked = list(session.messages)
        if asked and asked[-1].role == "assistant":  # the turn answers again what that reply answered
            asked.pop()
        await self._reply(session, lambda: session.regenerate(),
                          lambda error: self.notify(error, title="Not regenerated", severity="error", timeout=10),
                          asked)
        return True

    def session_index(self, session, box: MessageBox) -> int:
        """Where the user's message `box` is in `session.messages`."""
        ordinal = [b for b in self.boxes if b.role == "user"].index(box)
        return [i for i, m in enumerate(session.messages) if m.role == "user"][ordinal]

    def user_box(self, session, index: int) -> MessageBox:
        """The box of the user's message at `index` in `session.messages` (session_index's inverse)."""
        ordinal = sum(m.role == "user" for m in session.messages[:index])
        return [b for b in self.boxes if b.role == "user"][ordinal]

    async def resend(self, session, index: int, text: str) -> None:
        """Replace the user's message at `index` in the session, and all after it, by
        `text`, and reply; the message keeps its files."""
        box, boxes = self.user_box(session, index), self.boxes
        for later in boxes[boxes.index(box):]:
            await later.remove()
        await self.mount(MessageBox("user", text, attachments=box.attachments))
        edited = session.messages[index].id

        def refused(error: str) -> None:
            self.notify(error, title="Not resent", severity="error", timeout=10)
            # the same stored message, where the session (maybe read again) now has it; None: it is gone
            at = index if edited is None else next((i for i, m in enumerate(session.messages) if m.id == edited), None)
            self.post_message(self.Refused(text, [], edited=at))

        await self._reply(session, lambda: session.edit(index, text), refused, session.messages[:index + 1])

    def stop(self) -> None:
        """Stop the reply now, also mid-batch of a long prompt (Engine.interrupt); the reply is kept."""
        self._stop.set()
        if self.engine is not None:
            self.engine.interrupt()

    async def _reply(self, session, make_chunks: Callable[[], Iterator], refused: Callable[[str], None],
                     asked: Sequence) -> None:
        """Stream the reply that `make_chunks` (a session's turn) generates into a new box;
        `refused` says why, should the session refuse the turn before it begins. The files of
        `asked` (the messages the turn answers) that it cannot send again are named first."""
        box = MessageBox("assistant", show_origin=self.show_origin)
        await self.mount(box)
        box.begin()
        self.anchor()
        self._stop.clear()
        pending = ReplyBuffer()
        redraws = RedrawTimer(self, lambda: self._show_pending(box, pending), self.render_share)
        self._reply_worker(session, make_chunks, box, pending, redraws, refused, asked)

    @work(thread=True, exclusive=True, group="reply")
    def _reply_worker(self, session, make_chunks: Callable[[], Iterator], box: MessageBox,
                      pending: ReplyBuffer, redraws: RedrawTimer, refused: Callable[[str], None],
                      asked: Sequence) -> None:
        error = None
        chunks = None
        engine = session.engine
        self.decoding.acquire()
        try:
            # here, off the screen's thread: each file of the conversation is read again
            notices = not_sent_again(session.workspace, asked) if session.workspace is not None else []
            if notices:
                self.post_message(self._NotSentAgain(notices))
            chunks = make_chunks()
            for chunk in chunks:
                if self._stop.is_set():
                    break
                pending.add(chunk.text, chunk_spans(engine, chunk.text, chunk.tokens, chunk.from_draft),
                            chunk.stats)
                if self._stop.is_set():
                    break
        except EdgespecError as e:
            error = str(e)
        except Exception as e:  # keep the app alive; the session stored the partial reply
            error = f"{type(e).__name__}: {e}"
        finally:
            try:
                if chunks is not None and hasattr(chunks, "close"):
                    chunks.close()  # a partial reply is stored as "stopped"
            except EdgespecError as e:
                error = error or str(e)
            finally:
                self.decoding.release()
            self.post_message(self._Decoded(session, box, error, pending, redraws, refused))

    async def _show_pending(self, box: MessageBox, pending: ReplyBuffer) -> None:
        text, runs, stats = pending.take()
        if text or runs:
            await box.write(text, runs)
        if stats is not None:
            self.post_message(self.ReplyProgressed(stats))

    @on(_NotSentAgain)
    def _not_sent_again(self, event: _NotSentAgain) -> None:
        """The model answers from its earlier version of these files: the user should know."""
        for notice in event.notices:
            self.notify(notice, title="Not sent again", severity="warning", timeout=10)

    @on(_Decoded)
    async def _decoded(self, event: _Decoded) -> None:
        """Show the reply as the session stored it: its text, status and statistics are
        those of `session.reply`, this turn's; a turn refused before it began (none) stored
        nothing, and the view shows the stored conversation again, not the reply of an
        earlier turn in this turn's box (which Ctrl+R would then regenerate)."""
        box, error = event.box, event.error
        event.redraws.stop()
        reply = event.session.reply
        if reply is None and error:
            event.refused(error)
            await self.show(event.session.messages)
            self.post_message(self.ReplyEnded("refused", None, None))
            return
        await self._show_pending(box, event.pending)
        if reply is not None:
            content, status, stats = reply.content, reply.status, reply.stats
        else:
            content, status, stats = box.content, "error" if error else "stopped", None
        if error:
            status = "error" if status == "done" else status
        await box.finish(content=content, status=status, stats=stats)
        if event.session.changed_elsewhere:  # the turn read turns another edgespec stored: show them too
            await self.show(event.session.messages)
        self.post_message(self.ReplyEnded(status, stats, error))
