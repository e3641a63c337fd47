"""Speculative sampling is distribution-exact: generated tokens follow the target.

A synthetic target with a 10-token vocabulary, a draft far from it, a near
one, and prompt lookup. For each, many seeded generations of 3 tokens; their
empirical distribution is compared with the exact one computed from the
target's own logits (first two tokens jointly, third token marginally).

False-failure rate: each chi-square test uses alpha = 1e-3 and the seeds are
fixed, so the test is deterministic; a correct sampler would fail a given
check with probability 0.001 over the choice of seeds.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import Engine, ModelSettings
from edgespec.engine.sampling import distribution
from tests.synthetic import write_model

RUNS = 3000
ALPHA = 1e-3
PROMPT = [1, 3, 4, 5, 3, 4, 5, 3, 4]  # repetitive, so that lookup proposes
PARAMS = dict(temperature=1.0, max_tokens=3, k=2, p_min=0.0)
END = -1  # "generation ended here" (an end-of-generation token)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("small-vocab")
    small = dict(n_words=7, logit_scale=0.35, byte_tokens=False)
    return {
        "target": write_model(d / "t.gguf", seed=11, **small),
        "far": write_model(d / "far.gguf", seed=12, **small),
        "near": write_model(d / "near.gguf", seed=13, base_seed=11, noise=0.5, **small),
        # Vocabularies of other sizes (llama.cpp pairs them when they differ by up to 128 ids,
        # as Qwen2.5 7B and its 0.5B draft do): ids only the draft has, or only the target.
        "larger": write_model(d / "larger.gguf", seed=14, **{**small, "n_words": 9}),
        "smaller": write_model(d / "smaller.gguf", seed=15, **{**small, "n_words": 5}),
    }


def exact_distribution(path, params):
    """P(t1, t2) and P(t3) of the target, with END standing for a stop."""
    with Engine.load(ModelSettings(path, n_ctx=64, n_threads=1, n_batch=64)) as engine:
        seq, model = engine.target_seq, engine.target_model

        def p(history):
            return distribution(seq.next_logits(history), params)

        tokens = [t for t in range(model.n_vocab)]
        joint, third = {}, {}
        p1 = p(PROMPT)
        for t1 in tokens:
            if model.is_eog(t1):
                joint[(END, END)] = joint.get((END, END), 0) + p1[t1]
                third[END] = third.get(END, 0) + p1[t1]
                continue
            p2 = p(PROMPT + [t1])
            for t2 in tokens:
                w = p1[t1] * p2[t2]
                if model.is_eog(t2):
                    joint[(t1, END)] = joint.get((t1, END), 0) + w
                    third[END] = third.get(END, 0) + w
                    continue
                joint[(t1, t2)] = w
                p3 = p(PROMPT + [t1, t2])
                for t3 in tokens:
                    key = END if model.is_eog(t3) else t3
                    third[key] = third.get(key, 0) + w * p3[t3]
    return joint, third


def chi_square_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Pearson's test over the cells with expected count >= 5, the rest pooled."""
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for key, prob in probs.items():
        if prob * n >= 5:
            observed.append(counts.get(key, 0))
            expected.append(prob * n)
        else:
            pooled_o += counts.get(key, 0)
            pooled_e += prob * n
    assert sum(counts.get(k, 0) for k in counts if k not in probs) == 0, "impossible outcome generated"
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    expected = np.array(expected) * (sum(observed) / sum(expected))
    return stats.chisquare(observed, expected).pvalue


def outcome(tokens):
    padded = tokens + [END] * (3 - len(tokens))
    return (padded[0], padded[1]), padded[2]


@pytest.mark.parametrize("drafter", ["far", "near", "lookup", "larger", "smaller"])
def test_speculative_sampling_matches_the_target_distribution(models, drafter):
    params = GenerationParams(mode="lookup" if drafter == "lookup" else "draft", **PARAMS)
    joint, third = exact_distribution(models["target"], params)
    draft = None if drafter == "lookup" else ModelSettings(models[drafter], n_ctx=64, n_threads=1, n_batch=64)
    counts_joint, counts_third = {}, {}
    drafted = accepted = 0
    with Engine.load(ModelSettings(models["target"], n_ctx=64, n_threads=1, n_batch=64), draft) as engine:
        for seed in range(RUNS):
            params.seed = seed
            tokens = []
            for chunk in engine.generate(PROMPT, params):
                tokens += chunk.tokens
            drafted += chunk.stats.drafted
            accepted += chunk.stats.accepted
            first_two, last = outcome(tokens)
            counts_joint[first_two] = counts_joint.get(first_two, 0) + 1
            counts_third[last] = counts_third.get(last, 0) + 1
    # The proposals really were exercised: some accepted, some rejected.
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts_joint, joint, RUNS) > ALPHA
    assert chi_square_pvalue(counts_third, third, RUNS) > ALPHA


def test_the_check_itself_detects_a_wrong_distribution(models):
    """Guard against a test that cannot fail: plain sampling at another
    temperature must be rejected by the same statistics."""
    params = GenerationParams(mode="plain", **PARAMS)
    joint, _ = exact_distribution(models["target"], params)
    counts = {}
    with Engine.load(ModelSettings(models["target"], n_ctx=64, n_threads=1, n_batch=64)) as engine:
        wrong = GenerationParams(mode="plain", **{**PARAMS, "temperature": 0.6})
        for seed in range(RUNS):
            wrong.seed = seed
            tokens = list(itertools.chain.from_iterable(c.tokens for c in engine.generate(PROMPT, wrong)))
            key = outcome(tokens)[0]
            counts[key] = counts.get(key, 0) + 1
    assert chi_square_pvalue(counts, joint, RUNS) < ALPHA


@pytest.mark.parametrize("draft", ["larger", "smaller"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_draft_with_another_vocabulary_size_drafts_in_auto_mode(models, draft, temperature):
    settings = dict(n_ctx=64, n_threads=1, n_batch=64)
    with Engine.load(ModelSettings(models["target"], **settings), ModelSettings(models[draft], **settings)) as engine:
        n_vocab = engine.target_model.n_vocab
        used = set()
        for _ in range(20):  # unseeded: a seed with a temperature would decode plainly (choice.decoded_mode)
            params = GenerationParams(mode="auto", temperature=temperature, max_tokens=12, k=3, p_min=0.0)
            costs = engine.auto(params).costs  # a machine where drafting pays: verifying is free
            costs.target, costs.per_draft_token["draft"] = {1: 1.0, 4: 1.0}, 0.0
            for chunk in engine.generate(PROMPT, params):
                used.add(chunk.stats.drafter)
                assert all(t < n_vocab for t in chunk.tokens)
    assert "draft" in used
