"""What the chat layer gives the engine's lookup pool (chat/remember.py): a stored
conversation's turns, not a private one's; deleting forgets (fake engine)."""

from __future__ import annotations

import pytest

from edgespec.chat import ChatSession, ConversationStore
from edgespec.chat.remember import ANCHOR, continued, conversation_doc, request_doc
from tests.fakes import FakeEngine


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


def _turn(chat, text):
    return list(chat.send(text))


def test_a_stored_conversation_is_remembered_whole_after_each_turn(store):
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml", system_prompt="Be brief.")
    _turn(chat, "Hi")
    doc = conversation_doc(chat.conversation_id)
    first = engine.remembered[doc]
    assert engine.detokenize(first).endswith("reply 1")
    _turn(chat, "Again")
    second = engine.remembered[doc]
    assert second[:len(first)] == first and engine.detokenize(second).endswith("reply 2")
    assert second[len(first):] == engine.prompts[-1][len(first):] + engine.tokenize("reply 2")


def test_a_private_conversation_is_kept_out_and_what_it_gave_is_forgotten(store):
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml")
    _turn(chat, "Hi")
    doc = conversation_doc(chat.conversation_id)
    chat.keep_private(True)
    assert engine.forgotten == [doc] and doc not in engine.remembered
    _turn(chat, "Secret")
    assert doc not in engine.remembered


def test_a_conversation_stored_as_private_stays_out_when_opened_again(store):
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml")
    _turn(chat, "Hi")
    store.save_settings(chat.conversation_id, {**store.settings(chat.conversation_id), "private": True})
    engine.remembered.clear()
    again = ChatSession(engine, store=store, template="chatml", conversation_id=chat.conversation_id)
    _turn(again, "More")
    assert engine.remembered == {}


def test_an_unsaved_conversation_is_not_remembered():
    engine = FakeEngine()
    _turn(ChatSession(engine, template="chatml"), "Hi")
    assert engine.remembered == {}


def test_a_turn_continues_what_was_remembered():
    known = list(range(100))
    assert continued(known, [*known, 7, 8]) == [*known, 7, 8]
    # the earliest turns left the prompt: what follows the end of what was known is added
    trimmed = [1, 2, *known[-ANCHOR - 5:], 7, 8]
    assert continued(known, trimmed) == [*known, 7, 8]
    # an edited history: the conversation as it now reads
    assert continued(known, [5, 6, 7]) == [5, 6, 7]
    assert continued([], [5, 6]) == [5, 6]


def test_requests_of_one_client_conversation_share_a_document():
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    later = [*first, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    other = [{"role": "system", "content": "S"}, {"role": "user", "content": "Other"}]
    assert request_doc(first) == request_doc(later) != request_doc(other)
    assert request_doc([1, 2, 3]) != request_doc([1, 2, 4])
    assert request_doc(first).startswith("request:")


def test_the_server_remembers_each_request_and_its_reply():
    from edgespec.engine.events import GenerationParams
    from edgespec.server.completion import Completer

    engine = FakeEngine(chat_template=None)
    completer = Completer(engine, template="chatml")
    first = [{"role": "user", "content": "Hi"}]
    list(completer.chat(first, GenerationParams(max_tokens=20)))
    later = [*first, {"role": "assistant", "content": "reply 1"}, {"role": "user", "content": "More"}]
    list(completer.chat(later, GenerationParams(max_tokens=20)))
    list(completer.complete([5, 6, 7], GenerationParams(max_tokens=20)))
    assert list(engine.remembered) == [request_doc(first), request_doc([5, 6, 7])]
    assert engine.remembered[request_doc(first)] == [*engine.prompts[1], *engine.tokenize("reply 2")]


def test_deleting_a_conversation_in_the_app_forgets_it_with_or_without_an_engine(home):
    from edgespec.engine.pool import Pool
    from edgespec.load import pool_folder
    from edgespec.tui.screens.chat import forget_conversation

    engine = FakeEngine()
    forget_conversation(engine, 3)
    assert engine.forgotten == [conversation_doc(3)]
    vocab = "0123456789abcdef"
    pool = Pool.open(pool_folder(), vocab)
    pool.add(conversation_doc(4), [1, 2, 3])
    pool.add(conversation_doc(5), [4, 5, 6])
    assert pool.save()
    forget_conversation(None, 4)  # no engine loaded (or the pool is off): the files still forget it
    assert Pool.open(pool_folder(), vocab).index.documents() == [conversation_doc(5)]


def test_the_apps_private_setting_is_stored_and_given_to_the_session(store):
    from edgespec.tui.chat_settings import ChatSettings, give_session

    assert ChatSettings.from_dict(ChatSettings(private=True).to_dict()).private is True
    engine = FakeEngine()
    chat = ChatSession(engine, store=store, template="chatml")
    _turn(chat, "Hi")
    give_session(chat, ChatSettings(private=True), store, ("auto", 4))
    assert chat.private and engine.forgotten == [conversation_doc(chat.conversation_id)]
    _turn(chat, "Secret")
    assert engine.remembered == {}
    give_session(chat, ChatSettings(), store, ("auto", 4))
    _turn(chat, "Public again")
    assert list(engine.remembered) == [conversation_doc(chat.conversation_id)]


def test_lookup_pool_sets_the_pools_budget_and_0_turns_it_off(monkeypatch, home):
    import edgespec.cli as cli
    import edgespec.tui as tui
    from edgespec.engine.runtime import CacheSettings
    from edgespec.load import pool_folder

    seen = {}
    monkeypatch.setattr(tui, "run_app", lambda **kw: seen.update(kw))
    assert cli.main(["--lookup-pool", "0"]) == 0
    assert (seen["cache"].pool, seen["cache"].pool_mib) == (pool_folder(), 0)  # off, but deletions reach its files
    assert cli.main(["--lookup-pool", "16"]) == 0 and seen["cache"].pool_mib == 16
    assert cli.main([]) == 0 and seen["cache"].pool_mib == CacheSettings().pool_mib
    with pytest.raises(SystemExit):
        cli.main(["--lookup-pool", "-1"])


def test_chat_private_keeps_the_conversation_out_and_stores_the_choice(home, monkeypatch, capsys):
    import edgespec.cli as cli
    import edgespec.cli.chats as chats
    from edgespec.cli.options import open_store

    engine = FakeEngine()
    monkeypatch.setattr(chats, "engine_from_args", lambda args, progress=None: _Held(engine))
    assert cli.main(["chat", "--new", "--private", "--once", "Secret", "--template", "chatml"]) == 0
    assert engine.remembered == {}
    cid = open_store().latest()
    assert open_store().settings(cid)["private"] is True
    assert cli.main(["chat", "--conversation", str(cid), "--once", "More", "--template", "chatml"]) == 0
    assert engine.remembered == {}  # stored private: still kept out
    assert cli.main(["chat", "--new", "--once", "Public", "--template", "chatml"]) == 0
    assert list(engine.remembered) == [conversation_doc(open_store().latest())]


class _Held:
    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        return self.engine

    def __exit__(self, *exc):
        return False


def test_bench_drafts_from_no_pool_unless_asked():
    from edgespec.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench"]).lookup_pool == 0
    assert parser.parse_args(["bench", "--lookup-pool", "8"]).lookup_pool == 8
    assert parser.parse_args(["generate", "hi"]).lookup_pool > 0
