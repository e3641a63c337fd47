"""The server benchmark's pure parts: the fixed session, the stream timing, order, ratios, tables."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bs():
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("bench_server")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def vs(bs):
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("bench_server_vs_llamacpp")
    finally:
        sys.path.remove(str(SCRIPTS))


# -- the fixed session ------------------------------------------------------------------------------

def test_each_reference_edit_changes_the_file_and_builds_on_the_last(bs):
    versions = [bs.source_file(), *bs.edited_files()]
    assert len(versions) == len(bs.EDITS) + 1
    assert all(a != b for a, b in zip(versions[:-1], versions[1:]))
    last = versions[-1]
    assert "parse_line" not in last and "parse_record" in last  # edit 1 survives to the end
    assert "DEFAULT_TAX_RATE = 0.25\n" in last
    assert 'not line.startswith("#")' in last


def test_a_reference_edit_whose_text_is_missing_fails_loudly(bs):
    with pytest.raises(ValueError, match="parse_line"):
        bs.edited_files("no such function here\n")


def test_the_fixed_session_sends_the_reference_replies_and_ends_with_the_turns_edit(bs):
    files = bs.edited_files()
    messages = bs.fixed_session(2, system="S")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == "S"
    assert messages[2]["content"] == f"```python\n{files[0]}```"
    assert messages[4]["content"] == f"```python\n{files[1]}```"
    assert messages[-1]["content"].startswith(bs.EDITS[2])
    assert bs.fixed_session(3)[:6] == [{**m, "content": bs.SYSTEM} if m["role"] == "system" else m
                                       for m in messages]  # each turn extends the one before


def test_the_fixed_session_has_only_its_turns(bs):
    with pytest.raises(ValueError, match="turns 0 to 4"):
        bs.fixed_session(len(bs.EDITS))


# -- timing a streamed reply --------------------------------------------------------------------------

def _chunk(content=None, usage=None, timings=None):
    choices = [SimpleNamespace(delta=SimpleNamespace(content=content))] if usage is None else []
    return SimpleNamespace(choices=choices, usage=usage, model_extra={"timings": timings} if timings else {})


class _FakeClient:
    def __init__(self, chunks):
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=lambda **kw: iter(chunks)))


def test_ttft_is_the_first_content_and_the_rate_leaves_the_first_token_out(bs):
    times = iter([0.0, 2.0, 6.0])  # start, first content, end
    chunks = [_chunk(""), _chunk("a"), _chunk("b"), _chunk("c"),
              _chunk(usage=SimpleNamespace(prompt_tokens=100, completion_tokens=9),
                     timings={"cache_n": 40, "predicted_per_second": 2.5, "draft_n": 10, "draft_n_accepted": 6})]
    r = bs.run_turn(_FakeClient(chunks), "m", [], 16, clock=lambda: next(times))
    assert r["ttft_s"] == 2.0 and r["total_s"] == 6.0
    assert r["tokens_per_s"] == 8 / 4.0  # usage's 9 tokens, not the 3 chunks; the first is TTFT's
    assert (r["counted_by"], r["prompt_tokens"], r["cached_tokens"]) == ("usage", 100, 40)
    assert r["acceptance"] == 0.6 and r["server_tokens_per_s"] == 2.5


def test_without_usage_the_content_chunks_are_counted(bs):
    times = iter([0.0, 1.0, 3.0])
    r = bs.run_turn(_FakeClient([_chunk("a"), _chunk("b"), _chunk("c")]), "m", [], 16, clock=lambda: next(times))
    assert (r["counted_by"], r["completion_tokens"], r["tokens_per_s"]) == ("chunks", 3, 1.0)
    assert r["acceptance"] is None and r["cached_tokens"] is None


def test_the_pause_comes_between_a_reply_and_the_next_request_and_is_not_timed(bs, monkeypatch):
    openai = pytest.importorskip("openai")
    sleeps, requests = [], []

    class Client:
        def __init__(self, **kwargs):
            self.models = SimpleNamespace(list=lambda: iter([SimpleNamespace(id="m")]))
            self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

        def create(self, **kwargs):
            requests.append(len(sleeps))
            return iter([_chunk("a")])

    monkeypatch.setattr(openai, "OpenAI", Client)
    monkeypatch.setattr(bs.time, "sleep", sleeps.append)
    assert bs.main(["--turns", "3", "--pause", "2.5"]) == 0
    assert sleeps == [2.5, 2.5] and requests == [0, 1, 2]


# -- order, ratios, goal, tables ----------------------------------------------------------------------

def test_each_repeat_is_a_new_session(vs):
    assert vs.session_system(0) != vs.session_system(1)
    assert vs.session_system(0).endswith(vs.SYSTEM)


def _runs(*pairs):
    return [{"tokens_per_s": tps, "ttft_s": ttft} for tps, ttft in pairs]


RESULTS = {
    # results[name][turn] = runs of repeats 1..3
    "edgespec": [_runs((30, 1.0), (24, 1.2), (36, 0.9)), _runs((20, 2.0), (20, 2.2), (22, 2.0))],
    "llama-server": [_runs((10, 1.0), (12, 1.0), (12, 1.0)), _runs((10, 2.0), (10, 2.0), (10, 2.0))],
    "llama-server -md": [_runs((20, 1.0), (20, 1.0), (24, 1.0)), _runs((16, 2.0), (16, 2.0), (20, 2.0))],
}


def test_ratios_are_medians_of_per_repeat_ratios_and_geomeans_over_turns(vs):
    c = vs.compare(RESULTS, "edgespec", "llama-server -md")
    assert c.tps == pytest.approx([1.5, 1.25])  # turn 1: 30/20, 24/20, 36/24 -> 1.5, 1.2, 1.5
    assert c.ttft == pytest.approx([1.0, 1.0])  # turn 2: 1.0, 1.1, 1.0
    assert c.tps_geomean == pytest.approx(math.sqrt(1.5 * 1.25))


def test_the_faster_llama_server_and_the_goal_against_it(vs):
    best = vs.fastest(RESULTS, ["llama-server", "llama-server -md"])
    assert best == "llama-server -md"
    g = vs.goal(vs.compare(RESULTS, "edgespec", best))
    assert g["tps_met"] and g["ttft_met"]
    slow = {**RESULTS, "edgespec": [_runs((22, 1.5)) * 3, _runs((17, 2.5)) * 3]}
    g = vs.goal(vs.compare(slow, "edgespec", best))
    assert not g["tps_met"] and not g["ttft_met"]


def test_a_missing_figure_makes_the_geomean_unknown_not_better(vs):
    assert math.isnan(vs.geomean([1.5, float("nan")]))
    assert math.isnan(vs.paired_ratio([{"tokens_per_s": 10}], [{"tokens_per_s": 0}], "tokens_per_s"))


def test_the_tables_have_a_row_per_turn_and_server_and_a_geomean_row(vs):
    table = vs.format_turns(RESULTS, list(RESULTS)).splitlines()
    assert len(table) == 1 + 2 * 3
    assert table[1].split()[:2] == ["1", "edgespec"]
    ratios = vs.format_ratios([vs.compare(RESULTS, "edgespec", n) for n in ["llama-server", "llama-server -md"]])
    rows = ratios.splitlines()
    assert rows[-1].split()[0] == "geo" and len(rows) == 1 + 2 + 1
    assert "1.50x" in rows[1]


def test_prompts_tokenized_differently_are_pointed_out(vs):
    same = {"a": [[{"prompt_tokens": 5}]], "b": [[{"prompt_tokens": 5}]]}
    assert vs.prompt_mismatches(same) == []
    differ = {**same, "b": [[{"prompt_tokens": 6}]]}
    assert vs.prompt_mismatches(differ) == ["turn 1: prompt tokens differ: {'a': 5, 'b': 6}"]
