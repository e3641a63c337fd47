"""The engine on real quantized models: SmolLM2-135M (98 MB) and, when the
bundled parts are installed, the Qwen2.5-Coder 1.5B / 0.5B pair it ships for."""

from __future__ import annotations

import pytest

from edgespec.chat.template import chat_template
from edgespec.engine.events import GenerationParams
from edgespec.engine.exact import PROBE_LIMIT
from edgespec.engine.choice import FAST_MAX_BATCH
from edgespec.engine.runtime import Engine, ModelSettings

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat this list exactly, one item per line: apple, banana, cherry, apple, banana, cherry.",
]


def chat_tokens(engine, question):
    template = chat_template(engine)
    return engine.tokenize(template.render([{"role": "user", "content": question}]), special=True)


def generate(engine, tokens, **kw):
    out, last = [], None
    for last in engine.generate(tokens, GenerationParams(**kw)):
        out += last.tokens
    return out, last.stats


def test_smollm2_as_its_own_draft_accepts_nearly_every_token_and_changes_nothing(smollm2):
    """The draft runs llama.cpp's fast kernels and an F16 cache, the target the
    exact ones and a Q8_0 cache: the same weights, rounded apart, so a rare
    near-tie is rejected; the output is the target's all the same."""
    with Engine.load(ModelSettings(smollm2, n_ctx=1024, exact=True), ModelSettings(smollm2, n_ctx=1024)) as engine:
        for question in QUESTIONS:
            tokens = chat_tokens(engine, question)
            plain, _ = generate(engine, tokens, mode="plain", max_tokens=48)
            for k in (1, 4, 8):
                spec, stats = generate(engine, tokens, mode="draft", k=k, max_tokens=48, p_min=0.0)
                assert spec == plain, f"k={k}"
                assert stats.drafted > 0 and stats.acceptance_rate >= 0.6
            for mode in ("lookup", "auto"):
                assert generate(engine, tokens, mode=mode, k=4, max_tokens=48)[0] == plain, mode


@pytest.mark.qwen
def test_qwen_pair_greedy_speculation_equals_plain(qwen_pair):  # noqa: F811
    _, target, draft = qwen_pair
    with Engine.load(ModelSettings(target, n_ctx=1024, exact=True), ModelSettings(draft, n_ctx=1024)) as engine:
        for question in QUESTIONS:
            tokens = chat_tokens(engine, question)
            plain, _ = generate(engine, tokens, mode="plain", max_tokens=40)
            for mode in ("draft", "lookup", "auto"):
                spec, stats = generate(engine, tokens, mode=mode, k=4, max_tokens=40)
                assert spec == plain, mode
            # The 0.5B draft agrees with its 1.5B sibling most of the time on code.
            assert stats.mode == "auto"
        _, draft_stats = generate(engine, chat_tokens(engine, QUESTIONS[0]), mode="draft", k=4, max_tokens=40)
        assert draft_stats.acceptance_rate > 0.5


def test_default_kernels_speculate_past_the_exact_cap_and_exact_is_opt_in(smollm2):
    """By default the target runs llama.cpp's own kernels (as plain llama.cpp does)
    and verify passes are not capped by the exactness probe; `exact` caps them at
    what was measured to be exact."""
    with Engine.load(ModelSettings(smollm2, n_ctx=512)) as fast:
        assert fast.describe().exact is False
        assert fast.max_verify_batch() == FAST_MAX_BATCH
        _, stats = generate(fast, chat_tokens(fast, QUESTIONS[1]), mode="lookup", k=16, max_tokens=48)
        assert stats.drafted > 0
    with Engine.load(ModelSettings(smollm2, n_ctx=512, exact=True)) as exact:
        assert exact.describe().exact is True
        assert 1 <= exact.max_verify_batch() <= PROBE_LIMIT


