"""Pure parts of the engine: prompt lookup, streaming text, stop strings, pairing rules."""

import random

import numpy as np
import pytest

from edgespec.engine.detok import Detokenizer, StopStrings
from edgespec.engine.drafters import PromptLookup
from edgespec.errors import IncompatibleDraftError
from edgespec.models.compat import VocabInfo, ensure_compatible, pairing_problems


def test_lookup_proposes_the_continuation_of_the_latest_match():
    history = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 1, 2, 3]
    assert PromptLookup().lookup(history, 3) == [7, 8, 0]  # the later "1 2 3" wins


def test_lookup_prefers_longer_ngrams():
    # "2 3" last followed by 4, but the 3-gram "1 2 3" only ever by 7.
    history = [1, 2, 3, 7, 2, 3, 4, 1, 2, 3]
    assert PromptLookup(ngram_max=3).match(history, 1) == ([7], "3-gram")
    # Matching only "2 3", the earlier occurrence still wins: its context agrees one token further.
    assert PromptLookup(ngram_max=2).match(history, 1) == ([7], "3-gram")


def test_lookup_prefers_the_occurrence_whose_context_agrees_longest():
    """In code the same line often occurs twice; the reply copies the one whose
    preceding tokens it has just written, not necessarily the latest."""
    history = [1, 2, 3, 4, 5, 9, 3, 4, 6, 1, 2, 3, 4]
    assert PromptLookup(ngram_max=2).match(history, 2) == ([5, 9], "4-gram")  # "3 4" agrees back to "1 2"
    assert PromptLookup(ngram_max=2).match([8, 3, 4, 5, 9, 3, 4, 6, 7, 3, 4], 1) == ([6], "2-gram")  # a tie: latest


def test_lookup_can_skip_the_token_an_edit_replaced():
    # Copying "1 2 3 4 5 6" with 4 renamed to 99: no n-gram ending in 99 occurs before.
    history = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 99]
    assert PromptLookup().match(history, 3) == ([], "")
    assert PromptLookup().match(history, 3, skip=True) == ([5, 6, 8], "skip")


def test_one_lookup_follows_a_growing_history_and_a_new_one_alike():
    """Lookup keeps the history as an array between cycles, extended as the decoder's
    list grows: its proposals are a fresh lookup's, cycle after cycle, and for a new
    list, the same list again after another, and a list cut shorter."""
    rng = np.random.default_rng(3)
    lookup = PromptLookup()

    def same(h):
        assert lookup.match(h, 8, skip=True) == PromptLookup().match(list(h), 8, skip=True)

    history = rng.integers(0, 6, 40).tolist()
    for _ in range(30):
        history.extend(rng.integers(0, 6, int(rng.integers(1, 4))).tolist())
        same(history)
    other = rng.integers(0, 6, len(history) + 5).tolist()
    other[len(history) - 1] = history[-1]  # ends where the last one did, at its length
    same(other)
    same(history)
    del history[50:]
    same(history)
    history.extend([9, 9, 9])
    same(history)


def test_a_new_history_in_a_freed_ones_place_is_not_taken_for_it_grown():
    """A reply's history list is freed when it ends, and the next reply's list may get
    its id: lookup must not read it as the old one grown, even where it agrees at the
    old one's end (its proposals were the old text's, and a seeded reply another)."""
    lookup = PromptLookup()
    old = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    lookup.match(old, 4)
    del old  # (CPython gives the next list the freed one's place)
    new = [9, 9, 9, 9, 5, 6, 7, 8, 1, 2, 3, 9, 9]
    assert lookup.match(new, 4) == PromptLookup().match(new, 4)


def reference_match(history, k, *, ngram_max=4, ngram_min=2, context_max=32, kinds_max=8):
    """Prompt lookup's rule, spelled out: the longest n-gram ending the history that
    occurred before; of its occurrences the one whose preceding tokens agree longest
    (up to context_max), the latest on a tie."""
    end = len(history)
    for n in range(min(ngram_max, end - 1), ngram_min - 1, -1):
        tail = history[end - n:]
        found = []
        for p in range(end - n):
            if history[p:p + n] == tail:
                agree = 0
                while (agree < min(context_max, end - n) and p - agree - 1 >= 0
                       and history[p - agree - 1] == history[end - n - agree - 1]):
                    agree += 1
                found.append((agree, p))
        if found:
            agree, p = max(found)
            return history[p + n:p + n + k], f"{min(n + agree, kinds_max)}-gram"
    return [], ""


def test_lookup_finds_what_the_rule_spelled_out_finds():
    """Random histories over a few tokens (many repeats, many ties) and some that copy
    a long stretch: the search, narrowed from the last token's places, agrees with
    the rule read straight off the history, match and kind."""
    rng = random.Random(7)
    for trial in range(400):
        vocab = rng.choice([2, 3, 5, 50])
        history = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        if trial % 4 == 0 and len(history) > 10:  # a reply copying what came before
            start = rng.randrange(len(history) - 5)
            history += history[start:start + rng.randrange(3, 15)]
        assert PromptLookup().match(history, 6) == reference_match(history, 6), history


def test_lookup_without_a_match_or_budget_proposes_nothing():
    assert PromptLookup().lookup([1, 2, 3, 4, 5], 4) == []
    assert PromptLookup().lookup([1, 2, 1, 2], 0) == []
    assert PromptLookup().lookup([7], 4) == []


def test_lookup_continuation_may_run_into_the_tail():
    assert PromptLookup(ngram_min=1).lookup([4, 4, 4], 5) == [4]


def test_detokenizer_holds_back_a_split_character():
    pieces = {1: b"a", 2: "€".encode()[:1], 3: "€".encode()[1:], 4: b"b"}
    d = Detokenizer(pieces.__getitem__)
    assert d.add([1, 2]) == "a"
    assert d.add([3]) == "€"
    assert d.add([4]) + d.flush() == "b"


def test_stop_strings_end_at_the_first_complete_one_and_hold_back_exactly_a_possible_start():
    """Against the rule itself, on random texts fed in random pieces: what is shown is the
    text up to the earliest stop string once one is complete, else all of it but the
    longest tail that may begin one."""
    rng = random.Random(7)
    for trial in range(2000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randrange(1, 5))) for _ in range(rng.randrange(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 12)))
        s, fed, shown = StopStrings(stops), "", ""
        while len(fed) < len(text):
            piece = text[len(fed):len(fed) + rng.randrange(1, 4)]
            fed += piece
            out, stopped = s.feed(piece)
            shown += out
            first = min((i for i in (fed.find(stop) for stop in stops) if i >= 0), default=-1)
            if first >= 0:
                assert (shown, stopped) == (fed[:first], True), (stops, text, trial)
                break
            held = max((n for n in range(1, len(fed) + 1) for stop in stops if stop.startswith(fed[-n:])), default=0)
            assert (shown, stopped) == (fed[:len(fed) - held], False), (stops, text, trial)
        else:
            assert shown + s.flush() == text


def test_many_stop_strings_cost_little_per_token():
    """A request may name a hundred thousand stop strings (4 MB of them): each was searched
    for at every token, a fifth of a second a token, and a long reply kept the server for hours."""
    import threading

    s, done = StopStrings([f"stop {i}." for i in range(100_000)]), threading.Event()

    def feed():
        for _ in range(300):
            s.feed(" word")
        done.set()

    threading.Thread(target=feed, daemon=True).start()
    assert done.wait(10), "300 tokens took more than 10 s"


class _Counted(str):
    """A stop string that tallies the characters each look at it takes."""

    looked = 0

    def _tally(self, n):
        _Counted.looked += n

    def __getitem__(self, key):
        out = str.__getitem__(self, key)
        self._tally(len(out))
        return out

    def __iter__(self):
        self._tally(len(self))
        return str.__iter__(self)

    def __eq__(self, other):
        self._tally(len(other))
        return str.__eq__(self, other)

    def __lt__(self, other):
        self._tally(len(other))
        return str.__lt__(self, other)

    def __gt__(self, other):
        self._tally(len(other))
        return str.__gt__(self, other)

    def startswith(self, prefix, *args):
        self._tally(len(prefix))
        return str.startswith(self, prefix, *args)

    __hash__ = str.__hash__


def _stop_work(length):
    """Characters of a stop string of `length` looked at while a reply twice as long
    streams in one character a token, always the start of the stop string."""
    _Counted.looked = 0
    s = StopStrings([_Counted("a" * (length - 1) + "b")])
    for i in range(2 * length):
        assert s.feed("a") == ("" if i < length - 1 else "a", False)
    return _Counted.looked


def test_holding_back_a_possible_start_of_one_long_stop_string_costs_linear_work():
    """Each token looked at the whole held-back tail (as long as the stop string):
    a 10,000-character stop string cost 100 times what a 1,000-character one did."""
    assert _stop_work(10_000) < 20 * _stop_work(1_000)


def test_stop_strings_cut_the_text_and_hold_back_a_possible_start():
    s = StopStrings(["</end>"])
    assert s.feed("hello </e") == ("hello ", False)  # "</e" may begin "</end>": it waits
    assert s.feed("nd> more") == ("", True)
    s = StopStrings(["###"])
    assert s.feed("a#") == ("a", False)
    assert s.feed("b") == ("#b", False)
    assert s.feed("##") == ("", False)
    assert s.flush() == "##"


def test_no_stop_strings_pass_text_straight_through():
    s = StopStrings([])
    assert s.feed("abc") == ("abc", False)


def vocab(n, *, bos=1, eos=2, add_bos=True, kind="gpt2", texts=None):
    return VocabInfo(kind, texts or [f"t{i}" for i in range(n)], bos, eos, add_bos)


def test_compatible_pair_has_no_problems():
    assert pairing_problems(vocab(1000), vocab(1050)) == []


def test_vocab_size_difference_is_named():
    with pytest.raises(IncompatibleDraftError, match="draft vocab has 49152 tokens, target 151936"):
        ensure_compatible(vocab(151936), vocab(49152))


def test_special_token_and_text_differences_are_named():
    assert "draft EOS token is 3, target 2" in pairing_problems(vocab(100), vocab(100, eos=3))[0]
    assert "tokenizer" in pairing_problems(vocab(100), vocab(100, kind="llama"))[0]
    texts = [f"t{i}" for i in range(100)]
    texts[42] = "other"
    assert "token 42" in pairing_problems(vocab(100), vocab(100, texts=texts))[0]


class ScriptedCache:
    """A draft model's cache whose next-token distributions are given: row i has
    top probability sure[i] on token 10 + i."""

    def __init__(self, sure):
        self.rows, self.evaluated, self.room = [self._row(i, p) for i, p in enumerate(sure)], 0, 100
        self.tokens: list[int] = []

    @staticmethod
    def _row(i, p, vocab=32):
        probs = np.full(vocab, (1.0 - p) / (vocab - 1))
        probs[10 + i] = p
        return np.log(probs)

    def next_logits(self, history):
        self.tokens, self.history_length = list(history), len(history)
        return self.rows[0]

    def extend(self, tokens):
        self.tokens += tokens

    def logits(self, i):  # the row after the draft tokens read so far
        return self.rows[len(self.tokens) - self.history_length]


def test_the_draft_model_stops_when_its_whole_draft_is_too_unsure():
    """Each guess 90% sure, so the whole draft is 90%, 81%, 73%, 66% sure: with
    p_draft 0.7 the fourth guess is not worth its target column; p_min alone
    (each guess on its own) lets it through."""
    from edgespec.engine.drafters import DraftModel
    from edgespec.engine.events import GenerationParams

    history = [1, 2, 3]

    def draft(**kw):
        cache = ScriptedCache([0.9] * 6)
        return DraftModel(cache).propose(history, 5, GenerationParams(p_min=0.3, **kw), None).tokens

    assert draft(p_draft=0.7) == [10, 11, 12]
    assert draft() == [10, 11, 12, 13, 14]


class ProbedCache:
    """A target cache whose batched passes are exact except at the batch sizes in `inexact`."""

    def __init__(self, inexact=(), n_vocab=50):
        self.inexact, self.tokens, self.room, self.passes = set(inexact), [], 64, []
        self.ctx = type("Ctx", (), {"n_vocab": n_vocab})()

    def extend(self, tokens, all_logits=False):
        self.batch = len(tokens)
        self.passes.append(len(tokens))
        self.tokens += tokens

    def logits(self, i):
        row = np.zeros(self.ctx.n_vocab)
        row[(len(self.tokens) - self.batch + i) % self.ctx.n_vocab] = 1.0  # a function of the position
        return row + (0.5 if self.batch in self.inexact else 0.0)

    def truncate(self, n):
        self.tokens = self.tokens[:n]


@pytest.mark.parametrize("inexact, largest", [((), 8), ((4,), 3), ((2,), 1), ((8,), 7), ((3, 6), 2)])
def test_the_exactness_probe_uses_only_sizes_measured_exact(inexact, largest):
    from edgespec.engine.exact import largest_exact_batch

    cache = ProbedCache(inexact)
    n, timings = largest_exact_batch(cache, limit=8)
    assert n == largest and cache.tokens == []  # the cache is left as it was
    assert set(timings) == {1, *range(2, min(largest + 1, 8) + 1)}  # every size up to the first inexact one


def test_lookup_credits_its_draft_to_the_region_its_match_was_copied_from():
    from edgespec.engine.regions import Region, Regions

    lookup = PromptLookup(ngram_max=2)
    history = [0, 5, 6, 7, 8, 1, 2, 3, 9, 5, 6]  # "5 6" occurs in the file (1-5) first
    lookup.start(Regions(9, [Region(0, 9, "user:1"), Region(1, 5, "file:a.py")]))
    draft = lookup.propose(history, 2, None, None)
    assert (draft.tokens, draft.source) == ([7, 8], "lookup/file:a.py")
    assert lookup.offer(history, 2).source == "lookup/file:a.py"
    assert lookup.propose([0, 5, 6, 7, 8, 1, 2, 3, 9, 1, 2], 1, None, None).source == "lookup/user:1"
    lookup.start(Regions(3, []))
    assert lookup.propose([4, 1, 2, 3, 1, 2], 1, None, None).source == "lookup/reply"  # copied from the reply
    assert lookup.propose([1, 2, 3, 1, 2], 1, None, None).source == "lookup/prompt"  # no region holds it


def test_regions_name_the_innermost_label_then_prompt_then_reply():
    from edgespec.engine.regions import PROMPT, REPLY, Region, Regions

    regions = Regions(20, [Region(2, 10, "user:1"), Region(4, 6, "file:x"), Region(12, 15, "assistant:2")])
    assert [regions.label_at(i) for i in (0, 2, 4, 5, 6, 9, 10, 12, 16, 20, 99)] == [
        PROMPT, "user:1", "file:x", "file:x", "user:1", "user:1", PROMPT, "assistant:2", PROMPT, REPLY, REPLY]
