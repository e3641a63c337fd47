"""A reply's statistics are one typed shape (Stats) live, stored, exported and served,
and every face shows the same accepted tokens per source (Stats.accepted_by). Fake engines."""

from __future__ import annotations

import json

import pytest

from edgespec.chat import ChatSession, ConversationStore
from edgespec.chat.export import export_json, import_json
from edgespec.chat.store import StoreError
from edgespec.cli import chats, generate, main
from edgespec.engine.events import Stats
from tests.fakes import SpecFakeEngine

HELLO = "Tell me about lookup"


class Sourced(SpecFakeEngine):
    """Credits its accepted tokens to "draft" and to lookup in the prompt's last region,
    and keeps the statistics of its last reply."""

    sources = True

    def generate(self, prompt_tokens, params, *, regions=()):
        for chunk in super().generate(prompt_tokens, params, regions=regions):
            self.last = chunk.stats
            yield chunk


def test_stats_read_back_from_their_stored_form_are_the_same_stats():
    live = Stats(mode="auto", prompt_tokens=40, generated_tokens=12, drafted=10, accepted=7, target_passes=5,
                 accepted_by={"draft": 4, "lookup/file:a.py": 3}, decode_s=0.5, ttft_s=0.1, stop_reason="eog")
    stored = json.loads(json.dumps(live.to_dict()))
    assert Stats.from_dict(stored) == live
    assert stored["tokens_per_s"] == live.tokens_per_s == 24.0 and stored["accepted_by"] == live.accepted_by


def test_stats_stored_before_sources_read_back_without_them():
    old = {"mode": "draft", "generated_tokens": 3, "drafted": 4, "accepted": 3, "acceptance_rate": 0.75,
           "tokens_per_s": 41.5, "decode_s": 0.07}
    stats = Stats.from_dict(old)
    assert (stats.accepted, stats.accepted_by, stats.acceptance_rate, stats.ttft_s) == (3, {}, 0.75, None)


def test_a_reply_credits_every_accepted_token_to_a_source_the_prompt_names(tmp_path):
    engine = Sourced(reply=lambda prompt: "a reply long enough for several cycles")
    with ConversationStore(tmp_path / "chats.db") as store:
        session = ChatSession(engine, store=store, template="chatml")
        list(session.send(HELLO))
        stored = store.messages(session.conversation_id)[-1].stats
    assert isinstance(stored, Stats) and stored == engine.last
    assert sum(stored.accepted_by.values()) == stored.accepted > 0
    assert set(stored.accepted_by) == {"draft", "lookup/user:0"}  # the session passed the prompt's regions


def test_an_export_carries_accepted_by_and_an_older_export_still_imports(tmp_path):
    engine = Sourced()
    with ConversationStore(tmp_path / "chats.db") as store:
        session = ChatSession(engine, store=store, template="chatml")
        list(session.send(HELLO))
        data = export_json(store, session.conversation_id)
        assert data["messages"][-1]["stats"]["accepted_by"] == engine.last.accepted_by
        again = import_json(store, json.loads(json.dumps(data)))
        assert store.messages(again)[-1].stats == engine.last
        del data["messages"][-1]["stats"]["accepted_by"]  # as exports made before sources were counted
        older = import_json(store, data)
        assert store.messages(older)[-1].stats.accepted_by == {}
        data["messages"][-1]["stats"]["accepted_by"] = {"draft": "many"}
        with pytest.raises(StoreError, match="accepted_by"):
            import_json(store, data)


def test_generate_json_the_server_and_the_stored_reply_show_the_same_accepted_by(tmp_path, monkeypatch, capsys,
                                                                                  home):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from edgespec.server import ServerSettings, create_app
    from tests.server_helpers import ServerThread, http

    shown = {}
    engine = Sourced(reply=lambda prompt: "the same reply in every face")
    monkeypatch.setattr(generate, "engine_from_args", lambda args, progress=None: engine)
    monkeypatch.setattr(chats, "engine_from_args", lambda args, progress=None: engine)
    assert main(["generate", HELLO, "--template", "chatml", "--json"]) == 0
    shown["generate --json"] = json.loads(capsys.readouterr().out)["stats"]["accepted_by"]

    with ConversationStore(tmp_path / "chats.db") as store:
        session = ChatSession(engine, store=store, template="chatml")
        list(session.send(HELLO))
        shown["stored reply"] = store.messages(session.conversation_id)[-1].stats.accepted_by

    served = ServerThread(create_app(lambda: engine, ServerSettings(model_id="fake", template="chatml")))
    try:
        served.wait_ready(30)
        status, body = http("POST", served.url + "/v1/chat/completions",
                            json.dumps({"messages": [{"role": "user", "content": HELLO}]}).encode())
        assert status == 200, body
        shown["server timings"] = body["timings"]["accepted_by"]
    finally:
        served.stop()
    assert shown["generate --json"] == shown["stored reply"] == shown["server timings"], shown
    assert set(shown["server timings"]) == {"draft", "lookup/user:0"}
