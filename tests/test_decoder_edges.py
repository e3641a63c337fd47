"""The decode loop's edges on a scripted target (pure: no llama.cpp, milliseconds):
whatever a cycle drafts and accepts, the reply is the one plain decoding gives."""

from __future__ import annotations

import random
from typing import Callable, Sequence

import numpy as np
import pytest

from edgespec.engine.cache import common_prefix_length
from edgespec.engine.decoder import generate
from edgespec.engine.drafters import Draft, Drafter
from edgespec.engine.events import GenerationParams
from edgespec.engine.policy import FixedPolicy

PIECES = ["<s>", "</s>", "Hel", "lo", " ST", "OP", " more", " text", "ab", "c", "d", "!", " x", " y"]
ID = {piece: i for i, piece in enumerate(PIECES)}
EOS = ID["</s>"]
VOCAB = len(PIECES)


def ids(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


class ScriptedTarget:
    """The target's KV sequence as the decoder uses it: its logits after any prefix
    are `model(prefix)`, and it keeps the tokens its "cache" holds."""

    def __init__(self, model: Callable[[Sequence[int]], np.ndarray], *, n_ctx: int = 64):
        self.model, self.n_ctx = model, n_ctx
        self.tokens: list[int] = []
        self._batch = 0

    @property
    def room(self) -> int:
        return self.n_ctx - len(self.tokens)

    def extend(self, tokens: Sequence[int], *, all_logits: bool = False) -> None:
        assert len(tokens) <= self.room, "the decoder overfilled the context"
        self.tokens += tokens
        self._batch = len(tokens)

    def logits(self, i: int) -> np.ndarray:
        i %= self._batch
        return self.model(self.tokens[: len(self.tokens) - self._batch + i + 1])

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def recall(self, tokens, held=None):
        return None

    def sync_steps(self, tokens):
        self.truncate(common_prefix_length(self.tokens, tokens))
        if len(self.tokens) < len(tokens):
            self.extend(tokens[len(self.tokens):])
            yield len(self.tokens)


def scripted(text: Sequence[int]) -> Callable[[Sequence[int]], np.ndarray]:
    """A greedy target that writes `text` (the prompt, then the reply), then EOS."""

    def model(prefix):
        row = np.zeros(VOCAB, dtype=np.float32)
        row[text[len(prefix)] if len(prefix) < len(text) else EOS] = 5.0
        return row

    return model


class Oracle(Drafter):
    """Drafts the script itself: every draft token is accepted."""

    name = "draft"

    def __init__(self, text: Sequence[int]):
        self.text = list(text)

    def propose(self, history, k, params, rng):
        return Draft(self.text[len(history): len(history) + k])


def decode(text, prompt, params: GenerationParams, *, k: int = 0, n_ctx: int = 64):
    """(tokens, from_draft, joined text, last chunk) of a reply to `prompt` by the target that writes `text`."""
    policy = FixedPolicy(Oracle(text) if k else None, k)
    target = ScriptedTarget(scripted(text), n_ctx=n_ctx)
    chunks = list(generate(target, prompt, params, policy, is_eog=lambda t: t == EOS,
                           piece=lambda t: PIECES[t].encode()))
    tokens = [t for c in chunks for t in c.tokens]
    from_draft = [f for c in chunks for f in c.from_draft]
    return tokens, from_draft, "".join(c.text for c in chunks), chunks[-1]


def same_as_plain(text, prompt, **kw):
    plain = decode(text, prompt, GenerationParams(mode="plain", **kw))
    spec = decode(text, prompt, GenerationParams(mode="draft", **kw), k=8)
    assert spec[1].count(True) > 0, "the check needs accepted drafts"
    assert (spec[0], spec[2], spec[3].finish_reason) == (plain[0], plain[2], plain[3].finish_reason)
    assert len(spec[1]) == len(spec[0])
    assert spec[3].stats.generated_tokens == plain[3].stats.generated_tokens == len(plain[0])
    return plain


def test_a_stop_string_inside_an_accepted_draft_ends_the_reply_where_plain_decoding_does():
    """The reply's tokens end with the one that completed the stop string, as one token
    at a time ends them: not with the rest of the cycle, which nobody sees."""
    prompt = ids("<s>")
    text = [*prompt, *ids("Hel", "lo", " ST", "OP", " more", " text", "!", " x")]
    tokens, _, shown, last = same_as_plain(text, prompt, stop=("STOP",), max_tokens=20)
    assert (tokens, shown, last.finish_reason) == (ids("Hel", "lo", " ST", "OP"), "Hello ", "stop")


def test_of_overlapping_stop_strings_the_one_completed_first_cuts_as_in_plain_decoding():
    """"c" is complete one token before "abcd" is: plain decoding stops there, showing "ab"."""
    prompt = ids("<s>")
    text = [*prompt, *ids("ab", "c", "d", "!", " x", " y")]
    tokens, _, shown, _ = same_as_plain(text, prompt, stop=("abcd", "c"), max_tokens=20)
    assert (tokens, shown) == (ids("ab", "c"), "ab")


@pytest.mark.parametrize("max_tokens", [3, 4, 6])
def test_max_tokens_cuts_a_reply_of_accepted_drafts_where_plain_decoding_does(max_tokens):
    prompt = ids("<s>")
    text = [*prompt, *ids("Hel", "lo", " more", " text", "!", " x", " y")]
    tokens, _, _, last = same_as_plain(text, prompt, max_tokens=max_tokens)
    assert len(tokens) == max_tokens and last.finish_reason == "max_tokens"


def test_an_end_of_generation_token_inside_an_accepted_draft_ends_the_reply_before_it():
    prompt = ids("<s>")
    text = [*prompt, *ids("Hel", "lo", "</s>", " more", " text", "!")]
    tokens, _, shown, last = same_as_plain(text, prompt, max_tokens=20)
    assert (tokens, shown, last.finish_reason) == (ids("Hel", "lo"), "Hello", "eog")


@pytest.mark.parametrize("n_ctx", [2, 3, 4, 5, 9])
def test_a_draft_longer_than_the_room_left_fills_the_context_exactly_as_plain_decoding(n_ctx):
    prompt = ids("<s>")
    text = [*prompt, *ids("Hel", "lo", " more", " text", "!", " x", " y", "Hel", "lo", " more")]
    plain = decode(text, prompt, GenerationParams(mode="plain", max_tokens=None), n_ctx=n_ctx)
    spec = decode(text, prompt, GenerationParams(mode="draft", max_tokens=None), k=8, n_ctx=n_ctx)
    assert spec[0] == plain[0] == text[1:n_ctx]
    assert spec[3].finish_reason == plain[3].finish_reason == "context"


def test_an_end_of_generation_token_first_ends_the_reply_with_nothing_in_it():
    prompt = ids("<s>")
    for mode, k in (("plain", 0), ("draft", 8)):
        tokens, _, shown, last = decode([*prompt, EOS, *ids("Hel", "lo")], prompt, GenerationParams(mode=mode), k=k)
        assert (tokens, shown, last.finish_reason, last.stats.generated_tokens) == ([], "", "eog", 0)


class Guesser(Drafter):
    """Drafts up to k tokens of the script, each wrong one time in five (any token: an
    end of generation too)."""

    name = "draft"

    def __init__(self, text: Sequence[int], rng: random.Random):
        self.text, self.rng = list(text), rng

    def propose(self, history, k, params, rng):
        right = self.text[len(history): len(history) + self.rng.randint(0, k)]
        return Draft([t if self.rng.random() < 0.8 else self.rng.randrange(VOCAB) for t in right])


def test_whatever_is_drafted_greedy_replies_are_plain_decodings_token_for_token():
    """Random scripts, drafts, stop strings, max_tokens and contexts: the reply's tokens,
    text, end and count are plain decoding's, and every token has its origin flag."""
    for trial in range(300):
        r = random.Random(trial)
        prompt = [ID["<s>"], *(r.randrange(2, VOCAB) for _ in range(r.randint(0, 3)))]
        text = [*prompt, *(r.randrange(1 if r.random() < 0.1 else 2, VOCAB) for _ in range(r.randint(0, 25)))]
        stop = tuple(r.choice(PIECES[2:])[: r.randint(1, 3)] for _ in range(r.randint(0, 2)))
        params = dict(stop=stop, max_tokens=r.choice([None, 1, 2, 3, 5, 10, 40]))
        n_ctx = r.randint(len(prompt) + 1, len(prompt) + 30)
        replies = []
        for drafter, k in ((None, 0), (Guesser(text, r), r.randint(1, 8))):
            target = ScriptedTarget(scripted(text), n_ctx=n_ctx)
            chunks = list(generate(target, prompt, GenerationParams(mode="draft", k=k, **params),
                                   FixedPolicy(drafter, k), is_eog=lambda t: t == EOS,
                                   piece=lambda t: PIECES[t].encode()))
            tokens = [t for c in chunks for t in c.tokens]
            assert len(tokens) == sum(len(c.from_draft) for c in chunks) == chunks[-1].stats.generated_tokens
            replies.append((tokens, "".join(c.text for c in chunks), chunks[-1].finish_reason))
        assert replies[1] == replies[0], (trial, params, n_ctx)
