"""A conversation with a loaded model: turns, KV-cache reuse, context limits, persistence.

Each turn renders the whole conversation with the chat template and passes
all of its tokens to `Engine.generate`, which keeps whatever prefix its target
and draft caches already hold and evaluates only the rest. The session's job
is to make that prefix long: when the new rendering starts with the text of
the previous prompt and reply, the previous tokens are kept exactly as they
were generated and only the new text is tokenized, so turn N costs the new
tokens only. When anything earlier changed (an edit, a template that rewrites
old turns, dropped messages) the whole text is tokenized afresh and the
engine still reuses the longest common prefix.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from edgespec.chat import attachments
from edgespec.chat.attachments import Attachment, PendingEdit, changed_on_disk as files_changed
from edgespec.chat.prompt import Prompt, PromptEncoder
from edgespec.chat.remember import continued, conversation_doc
from edgespec.chat.reply_lock import reply_lock
from edgespec.chat.store import ConversationStore, Message
from edgespec.engine.events import Chunk, GenerationParams
from edgespec.engine.protocol import ChatEngine
from edgespec.errors import ContextFullError, EdgespecError, FileAccessError, cut
from edgespec.workspace.root import Workspace

SAVE_EVERY_S = 0.5
"""How often a streaming reply is written to the store (and always at its end)."""
REPLY_SHARE = 4
"""Room kept for the reply: max_tokens, but at most 1/REPLY_SHARE of the context."""
TITLE_CHARS = 60


def reply_room(max_tokens: int, n_ctx: int) -> int:
    """Tokens of the context kept for the reply (see REPLY_SHARE)."""
    return min(max_tokens, n_ctx // REPLY_SHARE)


TOKEN_CHARS_MAX = 1024
"""More characters than any one token spells (real vocabularies stop far below):
a window of n characters is at least n / TOKEN_CHARS_MAX tokens, so one that
cannot fit is known without rendering or tokenizing it."""


@dataclass
class _Fitted:
    """What one turn sends to the engine."""

    prompt: Prompt
    dropped: int
    """Oldest non-system messages left out so that the conversation fits."""


def settled_words(words: str) -> str:
    """`words` but the one being written, and the space before it: a word may still
    grow, and its tokens with it (read ahead, they would be read again). Scanned from
    the end: the screen asks at every keystroke, and a pasted blob is one long word."""
    end = len(words)
    while end and not words[end - 1].isspace():
        end -= 1
    return words[:end].rstrip()


class ChangedElsewhereError(EdgespecError):
    """An edit or a regeneration was refused: another edgespec changed the stored chat
    since it was shown, so the message the user picked may not be the one stored there."""


class ChatSession:
    """Messages of one conversation, turned into replies by an Engine and kept in a store."""

    def __init__(self, engine: ChatEngine, *, store: ConversationStore | None = None, conversation_id: int | None = None,
                 system_prompt: str | None = None, params: GenerationParams | None = None,
                 template: str | None = None, model_name: str = "the model",
                 on_wait: Callable[[], None] | None = None, stop: threading.Event | None = None,
                 workspace: Workspace | None = None):
        """`template`: a built-in format's name (or Jinja source) to use instead of the
        model's own; required when the GGUF has none. `system_prompt` starts new
        conversations. `on_wait` is called when a turn has to wait for another
        process replying in the same conversation, and `stop` set while it waits
        gives that turn up (ReplyWaitStopped, nothing stored). `workspace`: the project folder
        files are attached from (none: a message cannot attach files). Raises
        TemplateError when there is no usable template."""
        self.engine = engine
        self.workspace = workspace
        self.on_wait = on_wait
        self.stop = stop
        self.store = store
        self.params = params or GenerationParams()
        self._encoder = PromptEncoder(engine, template=template, model=model_name)
        self.template = self._encoder.template
        self.system_prompt = system_prompt
        self.messages: list[Message] = []
        self.conversation_id: int | None = None
        self.reply: Message | None = None
        """The reply of the last turn asked for (send, regenerate, edit), once that turn
        began it; None when it was refused before (a file that cannot be attached, a
        message that does not fit): nothing of it was stored, and the reply that ends
        the conversation is an earlier turn's, which a screen must not show as this one's."""
        self._dropped: int | None = 0
        """Turns the last prompt left out; None when unknown (a conversation just loaded)."""
        self._held = ExitStack()
        """The reply lock of the turn in progress (see _turn)."""
        self.private = False
        """Kept out of the engine's lookup pool (see keep_private)."""
        self._remembered: list[int] = []
        """What this session gave the lookup pool of the conversation (chat/remember.py)."""
        self.changed_elsewhere = False
        """Whether the last turn found the stored conversation changed by another process,
        and read it again: a screen shows `messages` again."""
        if conversation_id is not None:
            self.load(conversation_id)
        else:
            self.new(system_prompt=system_prompt)

    # -- conversations -----------------------------------------------------------------
    def new(self, *, system_prompt: str | None = None) -> None:
        """Start an empty conversation (stored at its first message)."""
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.messages = [Message("system", self.system_prompt)] if self.system_prompt else []
        self.conversation_id = None
        self.reply = None
        self._dropped = 0
        self._remembered = []

    def load(self, conversation_id: int) -> None:
        """Switch to a stored conversation."""
        if self.store is None:
            raise ValueError("load() needs a ConversationStore")
        self.messages = self.store.messages(conversation_id)
        self.conversation_id = conversation_id
        self.reply = None
        self._dropped = None
        self._remembered = []
        self.private = bool(self.store.settings(conversation_id).get("private"))  # ChatSettings.private, as stored

    def keep_private(self, private: bool) -> None:
        """Keep this conversation out of the lookup pool (and remove what it gave it), or
        let its next turns in."""
        if private and self.conversation_id is not None:
            self.engine.forget(conversation_doc(self.conversation_id))
        self.private = private
        self._remembered = []

    # -- turns -------------------------------------------------------------------------
    def send(self, text: str, files: Sequence[str] = ()) -> Iterator[Chunk]:
        """Append a user message attaching `files` (paths in the workspace) and stream
        the reply. Files of the conversation that changed on disk since it last saw
        them are attached again. Raises a FileAccessError for a file that cannot be
        attached, FilesDoNotFitError when the files leave no room, before anything
        is stored or read."""
        self.reply = None
        attached = self._attach(files)
        with self._turn():
            candidate = [*self.messages, Message("user", text, attachments=self._with_changed(attached))]
            fitted = self._fit(candidate, self._dropped)
            self.messages = candidate
            yield from self._reply(fitted)

    def read_ahead(self, files: Sequence[str] = (), words: str = "") -> int:
        """Read the next turn's prompt up to the word being written (the conversation
        so far, `files` as send() would attach them, and `words` but their last, which
        may still grow) while the user is still writing: the engine keeps what it read,
        in the draft model too where the reply's mode drafts with it (Engine.read), so
        that sending reads only the last words and the template's tail. A file attached
        to a new message is most of its prompt (1,900 tokens, 25 s on a 2-core CPU, for
        a 166-line file), and writing the request takes about as long.

        Returns how many prompt tokens are now read (0: none worth it). Stores and
        remembers nothing; engine.interrupt() stops it, keeping what it read. Raises
        as send() does for files that cannot be attached or a prompt that cannot fit."""
        attached = self._with_changed(self._attach(files))
        settled = settled_words(words)
        # The tokens read are those two renderings that go on differently share.
        a, b = (self._fit([*self.messages, Message("user", settled + more, attachments=attached)],
                          self._dropped).prompt.tokens
                for more in ((" a", " ?") if settled else ("a", "?")))
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if n < 2:
            return 0
        with closing(self.engine.read(a[:n], self.params)) as stream:
            for _ in stream:
                pass
        return n

    def pending_edits(self) -> list[PendingEdit]:
        """The changes the last reply makes to the conversation's files (none when the
        conversation does not end with a reply), but those applied already
        (attachments.not_applied)."""
        if not self.messages or self.messages[-1].role != "assistant":
            return []
        reply = self.messages[-1]
        edits = attachments.pending_edits(reply.content, self.messages[:-1], workspace=self.workspace)
        return attachments.not_applied(edits, reply.attachments, self.workspace)

    def applied_already(self) -> bool:
        """Whether the last reply's changes were applied (record_applied) and none is left to apply."""
        reply = self.messages[-1] if self.messages else None
        return (reply is not None and reply.role == "assistant" and not self.pending_edits()
                and any(a.origin == "applied" for a in reply.attachments))

    def record_applied(self, written: Sequence[Attachment]) -> None:
        """Remember that the files in `written` now hold what the last reply made of
        them (the user applied its edits), so that the next turn does not send them
        again: the reply already shows that content."""
        reply = self.messages[-1]
        applied = [dataclasses.replace(a, origin="applied") for a in written]  # as apply_edits gives them
        reply.attachments = [*reply.attachments, *applied]
        if self.store is not None and reply.id is not None:
            self.store.attach(reply.id, applied)

    def _with_changed(self, attached: list[Attachment], messages: Sequence[Message] | None = None) -> list[Attachment]:
        """`attached` (files just read), and the files of `messages` (the conversation's)
        that changed on disk since it saw them."""
        if self.workspace is None:
            return attached
        ours = {a.path for a in attached}
        changed = files_changed(self.workspace, self.messages if messages is None else messages)
        return attached + [a for a in changed if a.path not in ours]

    def _asked_again(self, messages: list[Message]) -> tuple[list[Message], list[Attachment]]:
        """`messages` (ending with the user message a regeneration or an edit answers
        again), that message carrying the files that changed on disk since the
        conversation saw them, as send() attaches them to a new message: the reply is
        to what the files hold now (a reply to a stale copy could not be applied); and
        those files (to store with it once the turn fits)."""
        changed = self._with_changed([], messages)
        if not changed:
            return messages, []
        asked = dataclasses.replace(messages[-1], attachments=[*messages[-1].attachments, *changed])
        return [*messages[:-1], asked], changed

    def _store_changed(self, message: Message, changed: list[Attachment]) -> None:
        """Keep `changed` (see _asked_again) with stored `message`, as a new message keeps them."""
        if changed and self.store is not None and message.id is not None:
            self.store.attach(message.id, changed)

    def _attach(self, paths: Sequence[str]) -> list[Attachment]:
        if not paths:
            return []
        if self.workspace is None:
            raise FileAccessError("This session has no project folder to attach files from.")
        attached = attachments.read_files(self.workspace, paths)
        attachments.check_fit(attached, self.engine, reply_room(self.params.max_tokens, self.engine.n_ctx))
        return attached

    def regenerate(self) -> Iterator[Chunk]:
        """Drop the last assistant reply (if any) and reply to the last user message again
        (with the files that changed on disk since, as send() does)."""
        self.reply = None
        with self._turn(as_shown=True):
            keep = self.messages[:-1] if self.messages and self.messages[-1].role == "assistant" else self.messages
            if not keep or keep[-1].role != "user":
                raise ValueError("regenerate() needs a conversation that ends with a user message")
            keep, changed = self._asked_again(list(keep))
            fitted = self._fit(keep, self._dropped)
            self._forget(self.messages[len(keep):])
            self._store_changed(keep[-1], changed)
            self.messages = keep
            yield from self._reply(fitted)

    def edit(self, index: int, text: str) -> Iterator[Chunk]:
        """Replace user message `index`, drop every message after it, and reply (with the
        files that changed on disk since, as send() does)."""
        self.reply = None
        with self._turn(as_shown=True):
            yield from self._edit(index, text)

    @contextmanager
    def _turn(self, *, as_shown: bool = False) -> Iterator[None]:
        """One turn holds its stored conversation (another process replying there is
        waited for), and starts from what is stored: messages another process added
        meanwhile are read, so that the prompt holds finished turns only. A turn
        `as_shown` (an edit, a regeneration: it picks a message the user sees) is then
        refused (ChangedElsewhereError) when what is stored is not what was shown."""
        self.changed_elsewhere = False
        with ExitStack() as self._held:
            if self.store is not None and self.conversation_id is not None:
                self._held.enter_context(reply_lock(self.store.path, self.conversation_id, on_wait=self.on_wait,
                                                    stop=self.stop))
                ours = max((m.id for m in self.messages if m.id is not None), default=None)
                # A reply still being written when it was read ("interrupted" until it ends) is read again.
                unfinished = any(m.status == "interrupted" for m in self.messages[-1:])
                if self.store.last_message_id(self.conversation_id) != ours or unfinished:
                    shown = [(m.id, m.content) for m in self.messages]
                    self.load(self.conversation_id)
                    self.changed_elsewhere = [(m.id, m.content) for m in self.messages] != shown
                if as_shown and self.changed_elsewhere:
                    raise ChangedElsewhereError(
                        "This chat was changed by another edgespec since it was shown; it is shown again as "
                        "stored. Edit or regenerate again.")
            yield

    def _edit(self, index: int, text: str) -> Iterator[Chunk]:
        old = self.messages[index]
        if old.role != "user":
            raise ValueError(f"message {index} is a {old.role} message; only user messages can be edited")
        index %= len(self.messages)
        candidate, changed = self._asked_again([*self.messages[:index], dataclasses.replace(old, content=text)])
        edited = candidate[-1]
        keep = index - self._n_system(candidate)
        fitted = self._fit(candidate, None if self._dropped is None else min(self._dropped, keep))
        self._forget(self.messages[index + 1:])
        if self.store is not None and edited.id is not None:
            self.store.update(edited)
        self._store_changed(edited, changed)
        self.messages = candidate
        yield from self._reply(fitted)

    # -- the prompt --------------------------------------------------------------------
    def _fit(self, messages: list[Message], dropped: int | None) -> _Fitted:
        """The prompt for `messages`, leaving out the oldest turns (never the system
        prompt, never the last message) until it fits with room for the reply.

        Costs a few renders of about the window, whatever the conversation's length:
        the previous cut (`dropped`) is tried first (it nearly always still fits),
        else the cut is searched from the newest message back (doubling, then
        bisecting), so no render holds much more than a context's worth of turns.
        `dropped` None (not known): the search alone."""
        n_system = self._n_system(messages)
        turns = messages[n_system:]
        room = reply_room(self.params.max_tokens, self.engine.n_ctx)
        # A window starts with a user turn (some templates insist on alternation),
        # or is the last message alone.
        cuts = [i for i, m in enumerate(turns[:-1]) if m.role == "user" and i >= (dropped or 0)] + [len(turns) - 1]
        tried: dict[int, _Fitted | None] = {}

        def fits(c: int) -> bool:
            if c not in tried:
                window = messages[:n_system] + turns[cuts[c]:]
                chars = sum(len(m.content) + sum(len(a.content) for a in m.attachments) for m in window)
                at_least = chars // TOKEN_CHARS_MAX
                if at_least + room > self.engine.n_ctx:  # cannot fit: not worth rendering (it may be huge)
                    tried[c], size = None, f"at least {at_least}"
                else:
                    prompt = self._encoder.encode(attachments.model_messages(window))
                    fitted = len(prompt.tokens) + room <= self.engine.n_ctx
                    tried[c], size = _Fitted(prompt, cuts[c]) if fitted else None, str(len(prompt.tokens))
                if c == len(cuts) - 1 and tried[c] is None:
                    raise ContextFullError(
                        f"The message does not fit: the prompt is {size} tokens and a reply needs room "
                        f"for {room} more, but the context holds {self.engine.n_ctx}. Shorten the message"
                        + (" or the system prompt" if n_system else "") + ", or load the model with a larger context.")
            return tried[c] is not None

        # Each turn costs at least one token, so a window of more turns than the
        # context holds cannot fit: do not render it.
        if dropped is not None and len(turns) - cuts[0] <= self.engine.n_ctx and fits(0):
            return tried[0]
        fits(len(cuts) - 1)
        good, step = len(cuts) - 1, 1  # good fits; bad (below it) does not, or is out of bounds
        while good - step > 0 and fits(good - step):
            good, step = good - step, step * 2
        bad = max(good - step, 0) if 0 in tried or good - step > 0 else -1
        while good - bad > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
        return tried[good]

    # -- the reply ---------------------------------------------------------------------
    def _reply(self, fitted: _Fitted) -> Iterator[Chunk]:
        """Stream the reply to `fitted`, keeping the store up to date as it grows."""
        prompt, self._dropped = fitted.prompt, fitted.dropped
        reply = self.reply = Message("assistant", "", status="interrupted", from_draft=[])
        self.messages.append(reply)
        self._persist()
        params = prompt.params(self.params)
        tokens: list[int] = []
        stats = finish = None
        saved = time.monotonic()
        try:
            with closing(self.engine.generate(prompt.tokens, params, regions=prompt.regions)) as stream:
                for chunk in stream:
                    chunk.stats.dropped_messages = fitted.dropped
                    stats = chunk.stats
                    reply.content += chunk.text
                    reply.from_draft += chunk.from_draft
                    tokens += chunk.tokens
                    finish = chunk.finish_reason or finish
                    if finish:
                        reply.status = "done"
                    yield chunk
                    if self.store is not None and time.monotonic() - saved >= SAVE_EVERY_S:
                        self._save(reply, stats)
                        saved = time.monotonic()
            if not finish:  # the engine was interrupted (Esc, a client gone): what was generated is kept
                reply.status = "stopped"
        except GeneratorExit:
            if not finish:
                reply.status = "stopped"
            raise
        except BaseException:
            reply.status = "interrupted"
            raise
        finally:
            if stats is not None:
                reply.stats = stats
            self._save(reply, stats)
            self._encoder.remember(prompt, reply.content, tokens)
            self._remember([*prompt.tokens, *tokens])

    def _remember(self, tokens: list[int]) -> None:
        """Give the lookup pool this turn's prompt and reply, as a stored conversation
        that is not private (an unsaved one, which nothing could delete, is not kept)."""
        if self.private or self.conversation_id is None:
            return
        self._remembered = continued(self._remembered, tokens)
        self.engine.remember(conversation_doc(self.conversation_id), self._remembered)

    # -- persistence -------------------------------------------------------------------
    def _persist(self) -> None:
        """Store the conversation (creating it if needed) and every message not stored yet."""
        if self.store is None:
            return
        settings = self._settings()
        if self.conversation_id is None:
            first = next((m.content for m in self.messages if m.role == "user"), "New chat")
            title = cut(first.strip().splitlines()[0], TITLE_CHARS) if first.strip() else "New chat"
            self.conversation_id = self.store.create(title=title, settings=settings)
            # Held from the moment it exists: a second writer must not answer its first turn half-written.
            self._held.enter_context(reply_lock(self.store.path, self.conversation_id))
        else:  # keep what others stored there (the app's own settings)
            stored = self.store.settings(self.conversation_id)
            if {**stored, **settings} != stored:
                self.store.save_settings(self.conversation_id, {**stored, **settings})
        for m in self.messages:
            if m.id is None:
                self.store.append(self.conversation_id, m)

    def _save(self, reply: Message, stats) -> None:
        if self.store is not None and reply.id is not None:
            self.store.update(dataclasses.replace(reply, stats=stats))

    def _forget(self, messages: list[Message]) -> None:
        """Delete `messages` (the tail of the conversation) from the store."""
        stored = [m.id for m in messages if m.id is not None]
        if self.store is not None and self.conversation_id is not None and stored:
            self.store.delete_from(self.conversation_id, min(stored))

    def _settings(self) -> dict:
        try:
            paths = {role: m.path for role, m in self.engine.describe().models.items()}
        except Exception:  # describing is best effort; it must never cost a reply
            paths = {}
        settings = {
            "target": paths.get("target"), "draft": paths.get("draft"),
            "template": self.template.name, "params": dataclasses.asdict(self.params),
            "private": self.private,  # the app's ChatSettings.private
        }
        if self.workspace is not None and any(m.attachments for m in self.messages):
            settings["root"] = str(self.workspace.root)  # where `edgespec apply` writes its files
        return json.loads(json.dumps(settings, default=str))  # as the store gives it back

    @staticmethod
    def _n_system(messages: list[Message]) -> int:
        return 1 if messages and messages[0].role == "system" else 0
