"""The conversation store: CRUD, search, migrations, export/import, crash safety."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import pytest

from edgespec.chat import store as store_module
from edgespec.chat.export import export_json, export_markdown, import_json
from edgespec.chat.store import ConversationStore, Message, StoreError
from edgespec.engine.events import Stats

TESTS = Path(__file__).parent


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


def _sql(path: Path, sql: str, *args) -> list[tuple]:
    """Run `sql` on the database file itself, as another program would (committed when it writes)."""
    with closing(sqlite3.connect(path)) as db, db:
        return db.execute(sql, args).fetchall()


def _conversation(store, title="Trip"):
    cid = store.create(title=title, settings={"target": "/m/qwen.gguf", "params": {"mode": "draft"}})
    store.append(cid, Message("system", "Be brief."))
    store.append(cid, Message("user", "Where is Lyon?"))
    store.append(cid, Message("assistant", "In France.", stats=Stats(generated_tokens=3, decode_s=0.5, drafted=4,
                                                                     accepted=3, accepted_by={"lookup/user:1": 3}),
                              from_draft=[False, True, True]))
    return cid


def test_messages_come_back_in_order_with_stats_and_origins(store):
    cid = _conversation(store)
    got = store.messages(cid)
    assert [(m.role, m.content) for m in got] == [
        ("system", "Be brief."), ("user", "Where is Lyon?"), ("assistant", "In France.")]
    assert got[2].stats == Stats(generated_tokens=3, decode_s=0.5, drafted=4, accepted=3,
                                 accepted_by={"lookup/user:1": 3})
    assert got[2].stats.tokens_per_s == 6.0 and got[2].from_draft == [False, True, True]
    assert got[0].stats is None and got[0].from_draft is None and got[0].status == "done"
    assert all(m.id is not None for m in got)


def test_list_rename_delete_and_search(store):
    a = _conversation(store, "Trip")
    b = store.create(title="Recipes")
    store.append(b, Message("user", "How long to boil an egg?"))
    assert [c.id for c in store.list()] == [b, a]  # most recently updated first
    assert store.list()[1].n_messages == 3
    assert [c.id for c in store.list(search="egg")] == [b]
    assert [c.id for c in store.list(search="trip")] == [a]
    assert store.list(search="100%") == []
    store.rename(a, "Lyon")
    store.append(a, Message("user", "And Paris?"))
    assert [(c.id, c.title) for c in store.list()] == [(a, "Lyon"), (b, "Recipes")]
    assert store.title(a) == "Lyon"
    assert store.latest() == a
    store.delete(a)
    assert store.title(a) is None
    assert [c.id for c in store.list()] == [b]
    with pytest.raises(StoreError, match="no conversation .*edgespec chats"):
        store.messages(a)


@pytest.mark.parametrize("stored, search", [
    ("Café in Lyon", "CAFÉ"),    # beyond ASCII: SQL's LIKE folds only A-Z
    ("STRASSE", "straße"),       # full case folding: ß folds to ss
    ("ΣΟΦΙΑ", "σοφια"),
    ("100% sure_thing", "100% SURE_"),  # LIKE's wildcards are plain text
])
def test_search_ignores_case_in_every_script(store, stored, search):
    in_title = store.create(title=stored)
    in_message = store.create(title="other", messages=[Message("user", f"said: {stored}.")])
    store.create(title="unrelated", messages=[Message("user", "nothing here")])
    assert sorted(c.id for c in store.list(search=search)) == [in_title, in_message]


def test_update_and_delete_from(store):
    cid = _conversation(store)
    msgs = store.messages(cid)
    msgs[2].content, msgs[2].status = "In France, on the Rhône.", "stopped"
    store.update(msgs[2])
    store.append(cid, Message("user", "Thanks"))
    assert store.messages(cid)[2].content == "In France, on the Rhône."
    assert store.messages(cid)[2].status == "stopped"
    store.delete_from(cid, msgs[1].id)
    assert [m.role for m in store.messages(cid)] == ["system"]


def test_settings(store):
    cid = _conversation(store)
    assert store.settings(cid)["params"] == {"mode": "draft"}
    store.save_settings(cid, {"target": "/m/other.gguf"})
    assert store.settings(cid) == {"target": "/m/other.gguf"}


def test_database_uses_wal_and_reopens(tmp_path):
    path = tmp_path / "chats.db"
    with ConversationStore(path) as s:
        cid = _conversation(s)
    with ConversationStore(path) as s:
        assert len(s.messages(cid)) == 3
    assert _sql(path, "PRAGMA journal_mode") == [("wal",)]


def test_fresh_database_is_at_the_latest_schema_version(store):
    assert store.schema_version == len(store_module.MIGRATIONS)


def test_migrations_run_in_order_from_an_older_version(tmp_path, monkeypatch):
    path = tmp_path / "chats.db"
    with ConversationStore(path) as s:  # today's version
        cid = _conversation(s)
    known = len(store_module.MIGRATIONS)
    newer = (*store_module.MIGRATIONS, "ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
             "CREATE INDEX conversations_by_pin ON conversations (pinned)")
    monkeypatch.setattr(store_module, "MIGRATIONS", newer)
    with ConversationStore(path) as s:
        assert s.schema_version == known + 2
        assert len(s.messages(cid)) == 3
    assert _sql(path, "SELECT pinned FROM conversations WHERE id = ?", cid) == [(0,)]


def test_a_failing_migration_leaves_the_database_at_its_version(tmp_path, monkeypatch):
    path = tmp_path / "chats.db"
    ConversationStore(path).close()
    known = len(store_module.MIGRATIONS)
    monkeypatch.setattr(store_module, "MIGRATIONS", (*store_module.MIGRATIONS,
                                                     "CREATE TABLE t (x); CREATE TABLE nonsense nonsense nonsense"))
    with pytest.raises(StoreError):
        ConversationStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (known,)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 't'").fetchone() is None


def test_a_newer_database_is_refused_not_downgraded(tmp_path):
    path = tmp_path / "chats.db"
    ConversationStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="newer edgespec.*Upgrade edgespec"):
        ConversationStore(path)


def test_export_json_import_json_round_trip(store, tmp_path):
    cid = _conversation(store)
    data = json.loads(json.dumps(export_json(store, cid)))  # as it goes through a file
    with ConversationStore(tmp_path / "other.db") as other:
        new = import_json(other, data)
        assert export_json(other, new) == data
        assert other.list()[0].title == "Trip"


def test_import_refuses_what_is_not_an_export(store):
    with pytest.raises(StoreError, match="Not an edgespec conversation export"):
        import_json(store, {"messages": []})
    with pytest.raises(StoreError, match="Message 0 .* role"):
        import_json(store, {"format": "edgespec.conversation", "version": 1, "messages": [{"role": "robot"}]})
    with pytest.raises(StoreError, match="Upgrade edgespec"):
        import_json(store, {"format": "edgespec.conversation", "version": 7, "messages": []})
    for version in (None, "1", 1.5, True, 0):
        data = {"format": "edgespec.conversation", "messages": []} | ({} if version is None else {"version": version})
        with pytest.raises(StoreError, match="no version number") as e:
            import_json(store, data)
        assert "Upgrade" not in str(e.value)
    assert store.list() == []


def _export(**changes):
    data = {"format": "edgespec.conversation", "version": 1, "title": "T", "settings": {"target": "/m/a.gguf"},
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "yo", "status": "done", "stats": {"generated_tokens": 2},
                          "from_draft": [False, True]}]}
    for key, value in changes.items():
        if key.startswith("m1_"):
            data["messages"][1][key[3:]] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize("changes, message", [
    ({"settings": "x"}, "settings.*object"),
    ({"settings": {"target": 3}}, "settings.*target"),
    ({"settings": {"params": "fast"}}, "settings.*params"),
    ({"settings": {"temperature": "hot"}}, "settings.*temperature"),
    ({"settings": {"max_tokens": float("inf")}}, "settings.*max_tokens"),
    ({"title": ["a"]}, "title"),
    ({"created": 5}, "created"),
    ({"messages": [{"role": "user", "content": ["parts"]}]}, "Message 0.*content"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}, "Message 1.*system"),
    ({"m1_status": "finished"}, "Message 1.*status"),
    ({"m1_stats": "fast"}, "Message 1.*stats"),
    ({"m1_stats": {"tokens_per_s": "fast"}}, "Message 1.*tokens_per_s"),
    ({"m1_from_draft": "yes"}, "Message 1.*from_draft"),
    ({"m1_from_draft": [1, "x"]}, "Message 1.*from_draft"),
])
def test_import_validates_everything_before_writing_anything(store, changes, message):
    import_json(store, _export())  # the document itself is fine
    with pytest.raises(StoreError, match=message):
        import_json(store, _export(**changes))
    assert len(store.list()) == 1


@pytest.mark.parametrize("field", ["created", "updated"])
@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00"])
def test_import_refuses_a_time_a_date_cannot_hold_naming_the_field(store, field, when):
    with pytest.raises(StoreError, match=f"{field}.*{re.escape(when)}"):
        import_json(store, _export(**{field: when}))
    assert store.list() == []


@pytest.mark.parametrize("when", [-62135647200.0, 253402300799.0 + 14 * 3600, float("inf"), float("-inf")])
def test_a_stored_time_a_date_cannot_hold_is_listed_and_exported_at_the_nearest_it_can(store, monkeypatch, when):
    """Stored by an edgespec that let it in: the list must never be locked."""
    cid = _conversation(store)
    _sql(store.path, "UPDATE conversations SET created = ?, updated = ? WHERE id = ?", when, when, cid)
    try:
        for zone in ("Pacific/Kiritimati", "Etc/GMT+12"):  # UTC+14 today, -10:29 in year 1; UTC-12
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            info = store.list()[-1]
            assert info.created.year in (1, 9999) and info.updated == store.info(cid).updated
            data = export_json(store, cid)
            assert data["created"][:4] in ("0001", "9999") and "# Trip" in export_markdown(store, cid)
            store.delete(import_json(store, data))  # and what is exported imports again
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("stats, message", [
    ({"prompt_cached": 3, "prompt_cache": ["x"]}, "prompt_cache"),
    ({"plan_kind": 5}, "plan_kind"),
    ({"generated_tokens": -5}, "generated_tokens.*0 or more"),
    ({"drafted": -1, "accepted": 3}, "drafted.*0 or more"),
    ({"accepted_by": {"draft": -2}}, "accepted_by"),
    ({"drafted": 4, "accepted": 9}, "accepted \\(9\\) is more than drafted \\(4\\)"),
    ({"accepted": 1}, "accepted \\(1\\) is more than drafted \\(0\\)"),
])
def test_import_checks_every_field_of_a_replys_statistics(store, stats, message):
    with pytest.raises(StoreError, match=f"Message 1 .*{message}"):
        import_json(store, _export(m1_stats=stats))
    assert store.list() == []


@pytest.mark.parametrize("settings, message", [
    ({"temperature": -5}, "settings: temperature must be from 0 to 2 .*got -5"),
    ({"top_p": 7}, "settings: top-p must be above 0 and at most 1 .*got 7"),
    ({"k": 65}, "settings: k must be from 0 to 64 .*got 65"),
    ({"top_k": -1}, "settings: top-k must be from 0 to 1,000,000 .*got -1"),
    ({"max_tokens": 0}, "settings: max tokens must be from 1 to 16,777,216 .*got 0"),
    ({"mode": "fast"}, "settings: mode 'fast' is not one of plain, draft, lookup, auto"),
    ({"params": {"temperature": 9.5}}, "settings: params: temperature must be from 0 to 2 .*got 9.5"),
    ({"params": {"seed": -1}}, "settings: params: seed must be from 0 to 4,294,967,294 .*got -1"),
    ({"params": {"seed": 2**32}}, "settings: params: seed must be from 0 to 4,294,967,294 .*got 4,294,967,296"),
    ({"params": {"mode": "turbo"}}, "settings: params: mode 'turbo' is not one of"),
])
def test_import_refuses_settings_out_of_the_ranges_the_app_reads_them_with(store, settings, message):
    """The app refused these only when the chat was opened (its settings then ignored); an
    import refuses them, in the words of the same ranges (edgespec/limits.py)."""
    with pytest.raises(StoreError, match=message):
        import_json(store, _export(settings=settings))
    assert store.list() == []


def test_import_takes_settings_at_the_ends_of_their_ranges(store):
    settings = {"temperature": 2, "top_p": 1.0, "k": 0, "top_k": 0, "mode": "lookup", "max_tokens": 1,
                "params": {"k": 64, "temperature": 0.0, "seed": 0, "mode": "auto", "max_tokens": None}}
    cid = import_json(store, _export(settings=settings))
    assert store.settings(cid) == settings


def test_imported_statistics_left_null_read_as_their_defaults(store):
    cid = import_json(store, _export(m1_stats={"generated_tokens": 2, "mode": None, "drafted": None, "k": None}))
    assert "*2 tokens · plain*" in export_markdown(store, cid)


@pytest.mark.parametrize("where, changes", [
    ("title", {"title": "\ud800"}),
    ("messages[1].content", {"m1_content": "a\udfffb"}),
    ("settings.system_prompt", {"settings": {"system_prompt": "\ud800"}}),
])
def test_import_refuses_text_that_is_not_unicode_naming_where(store, where, changes):
    with pytest.raises(StoreError, match=f"not valid Unicode.*{re.escape(where)}"):
        import_json(store, _export(**changes))  # a lone surrogate, which JSON's \\ud800 escapes allow
    assert store.list() == []


def test_import_takes_no_project_folder_or_workers_from_the_file(store, tmp_path):
    """A file from elsewhere must not choose where `edgespec apply` writes, nor which
    hosts the app sends the model's work to (the app loads on a conversation's workers)."""
    cid = import_json(store, _export(settings={"target": "/m/a.gguf", "root": str(tmp_path),
                                               "rpc": "203.0.113.9:50052"}))
    assert store.settings(cid) == {"target": "/m/a.gguf"}


def test_an_export_carries_no_project_folder_or_workers(store, tmp_path):
    """An import leaves them out, so an export would only tell whoever it is shared with
    where this machine keeps the project and which hosts it uses."""
    cid = store.create(title="t", settings={"target": "/m/a.gguf", "root": str(tmp_path), "rpc": "10.0.0.2:50052"})
    assert export_json(store, cid)["settings"] == {"target": "/m/a.gguf"}


@pytest.mark.parametrize("template", ["chatml", "gguf", "custom", None])
def test_import_keeps_a_template_edgespec_knows(store, template):
    cid = import_json(store, _export(settings={"template": template}))
    assert store.settings(cid).get("template") == template


def test_import_refuses_a_template_edgespec_does_not_know(store):
    with pytest.raises(StoreError, match="settings: template 'nonexistent-tpl'.*chatml"):
        import_json(store, _export(settings={"template": "nonexistent-tpl"}))
    assert store.list() == []


@pytest.mark.parametrize("cid", [0, -1, 2**63, -(2**63) - 1, 10**22])
def test_a_conversation_id_out_of_range_is_no_conversation(store, cid):
    for read in (store.info, store.messages, store.settings):
        with pytest.raises(StoreError, match=f"There is no conversation {cid}"):
            read(cid)
    assert store.title(cid) is None


def test_conversations_with_settings_of_the_wrong_shape_still_export(store):
    """Stored by an earlier edgespec that let them in."""
    cid = store.create(title="old")
    _sql(store.path, "UPDATE conversations SET settings = '\"x\"' WHERE id = ?", cid)
    assert store.settings(cid) == {}
    assert "# old" in export_markdown(store, cid)


def test_export_markdown(store):
    cid = _conversation(store)
    md = export_markdown(store, cid)
    assert md.startswith("# Trip\n")
    assert "qwen.gguf" in md
    assert "## User\n\nWhere is Lyon?" in md
    assert "## Assistant\n\nIn France.\n\n*3 tokens · 6.0 tok/s · accepted 3/4 (75%" in md


CRASHING_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tests.fakes import FakeEngine
    from edgespec.chat import ChatSession, ConversationStore
    engine = FakeEngine(reply=lambda prompt: "word " * 100 if "story" in prompt else "Hi!", delay_s=0.02)
    session = ChatSession(engine, store=ConversationStore({db!r}), template="chatml", system_prompt="Be brief.")
    for chunk in session.send("Hello"):
        pass
    for chunk in session.send("Tell me a long story"):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
""")


def _partial_reply_stored(db) -> bool:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            row = c.execute("SELECT content FROM messages WHERE role = 'assistant' ORDER BY id DESC LIMIT 1 OFFSET 0"
                            ).fetchone()
            count = c.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    except sqlite3.Error:
        return False
    return count == 5 and bool(row and row[0])


def test_killed_writer_keeps_every_message_and_the_partial_reply(tmp_path):
    db = tmp_path / "chats.db"
    script = CRASHING_WRITER.format(root=str(TESTS.parent), db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        streamed = os.read(proc.stdout.fileno(), 64)
        assert streamed, proc.stderr.read().decode()
        deadline = time.monotonic() + 30  # until a throttled save has stored part of the long reply
        while not _partial_reply_stored(db) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with ConversationStore(db) as store:
        [info] = store.list()
        messages = store.messages(info.id)
    assert [(m.role, m.status) for m in messages] == [
        ("system", "done"), ("user", "done"), ("assistant", "done"), ("user", "done"), ("assistant", "interrupted")]
    assert messages[2].content == "Hi!"
    partial = messages[4].content
    assert 0 < len(partial) < len("word " * 100) and ("word " * 100).startswith(partial)


# -- the command line: chats, export, import ----------------------------------------------

def test_cli_chats_export_import(tmp_path, monkeypatch, capsys):
    from edgespec.chat.store import default_path
    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    with ConversationStore() as s:
        assert s.path == default_path() and str(s.path).startswith(str(tmp_path / "home"))
        cid = _conversation(s)
    assert main(["chats"]) == 0
    assert "Trip" in capsys.readouterr().out
    assert main(["export", str(cid), "--format", "md"]) == 0
    assert "## Assistant\n\nIn France." in capsys.readouterr().out
    exported = tmp_path / "trip.json"
    assert main(["export", str(cid), "--format", "json", "-o", str(exported)]) == 0
    assert main(["import", str(exported)]) == 0
    assert "imported as conversation" in capsys.readouterr().out
    assert main(["chats", "--search", "Lyon"]) == 0
    assert capsys.readouterr().out.count("Trip") == 2
    assert main(["export", "999"]) == 1
    assert "no conversation 999" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["import", str(tmp_path / "bad.json")]) == 1
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}",
                                  '{"a": ' * 30_000 + "1" + "}" * 30_000], ids=["lists", "messages", "objects"])
def test_import_of_json_nested_too_deeply_is_refused_with_a_message(tmp_path, monkeypatch, capsys, text):
    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "deep.json").write_text(text)
    assert main(["import", str(tmp_path / "deep.json")]) == 1
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err


# -- a damaged, read-only or full database: messages, not tracebacks ----------------------

def _damage(path: Path, how: str) -> bytes:
    """Write a store of three conversations at `path`, then damage it; returns the damaged bytes."""
    with ConversationStore(path) as s:
        for i in range(3):
            cid = s.create(title=f"chat {i}")
            for _ in range(100):
                s.append(cid, Message("user", "x" * 200))
    with open(path, "r+b") as f:
        if how == "header":
            f.write(b"not a database at all" * 4)
        else:  # a page in the middle, zeroed
            f.seek(4096 * 3)
            f.write(b"\0" * 4096)
    return path.read_bytes()


@pytest.mark.parametrize("how", ["header", "page"])
def test_a_damaged_database_is_kept_aside_under_a_dated_name_and_a_fresh_one_started(tmp_path, how):
    path = tmp_path / "conversations.db"
    damaged = _damage(path, how)
    with ConversationStore(path) as s:
        assert s.list() == [] and s.create(title="new") == 1
        kept = s.moved_aside
        assert kept is not None and kept.parent == tmp_path and kept.name.startswith("conversations.db.damaged-")
        assert str(path) in s.notice and str(kept) in s.notice
    assert kept.read_bytes() == damaged  # kept as it was, never deleted
    with ConversationStore(path) as s:  # the fresh one is fine: nothing more is moved
        assert [c.title for c in s.list()] == ["new"] and s.moved_aside is None


def _opened_with(path: Path, pragma: str, monkeypatch) -> ConversationStore:
    """The store at `path`, opened again on a connection that SQLite was told `pragma` first."""
    connect = sqlite3.connect

    def connect_then(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.execute(pragma)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect_then)
    return ConversationStore(path)


def test_a_read_only_database_is_a_store_error_naming_the_file(store, monkeypatch):
    cid = store.create(title="t")
    store.close()
    # as a file the user cannot write (root ignores chmod)
    with _opened_with(store.path, "PRAGMA query_only = ON", monkeypatch) as s:
        with pytest.raises(StoreError, match=f"{s.path}.*(read-only|cannot be written).*writable"):
            s.append(cid, Message("user", "hi"))
        assert s.messages(cid) == []  # reading still works


def test_a_full_disk_is_a_store_error_naming_the_file(store, monkeypatch):
    cid = store.create(title="t")
    store.close()
    [(pages,)] = _sql(store.path, "PRAGMA page_count")
    with _opened_with(store.path, f"PRAGMA max_page_count = {pages}", monkeypatch) as s:  # as a full disk
        with pytest.raises(StoreError, match=f"{s.path}.*full.*[Ff]ree"):
            s.append(cid, Message("user", "x" * 100_000))


@pytest.mark.parametrize("command", [["chats"], ["export", "1"], ["import", "{export}"]])
def test_cli_on_a_damaged_database_says_where_the_old_one_went(tmp_path, monkeypatch, capsys, command):
    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "data").mkdir(parents=True)
    export = tmp_path / "e.json"
    export.write_text(json.dumps({"format": "edgespec.conversation", "version": 1, "messages": []}))
    _damage(tmp_path / "home" / "data" / "conversations.db", "header")
    main([c.format(export=export) for c in command])
    err = capsys.readouterr().err
    assert "conversations.db.damaged-" in err and "Traceback" not in err


def test_a_database_from_before_attachments_is_upgraded_and_keeps_its_messages(tmp_path):
    path = tmp_path / "chats.db"
    db = sqlite3.connect(path)
    db.executescript(store_module.MIGRATIONS[0] + ";PRAGMA user_version = 1;"
                     "INSERT INTO conversations (title, created, updated) VALUES ('old', 0, 0);"
                     "INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'hi', 0);")
    db.close()
    with ConversationStore(path) as s:
        assert s.schema_version == len(store_module.MIGRATIONS)
        [message] = s.messages(1)
    assert (message.content, message.attachments) == ("hi", [])


@pytest.mark.parametrize("blocked", ["a folder", "a link to itself"])
def test_a_reply_lock_that_cannot_be_opened_is_a_store_error_naming_it(tmp_path, blocked):
    """The lock file of a conversation (beside the database) that is a folder, or a link that
    cannot be followed, is said in one line naming it; it raised a bare OSError (a traceback)."""
    from edgespec.chat.reply_lock import reply_lock

    lock = tmp_path / "c.db.locks" / "1.lock"
    lock.parent.mkdir()
    if blocked == "a folder":
        lock.mkdir()
    else:
        lock.symlink_to(lock)
    with pytest.raises(StoreError, match="1.lock"):
        with reply_lock(tmp_path / "c.db", 1):
            pass
