"""The accept step and the samplers, on hand-made distributions (no model)."""

import numpy as np
import pytest
from scipy import stats

from edgespec.engine.events import GenerationParams
from edgespec.engine.sampling import check_params, distribution, sample, top_k_filter, top_p_filter
from edgespec.engine.verify import accept_greedy, accept_sampled


def one_hot_logits(winners, vocab=8):
    rows = np.full((len(winners), vocab), -5.0, dtype=np.float32)
    for i, w in enumerate(winners):
        rows[i, w] = 5.0
    return list(rows)


def test_greedy_accepts_the_agreeing_prefix_and_takes_the_targets_correction():
    rows = one_hot_logits([3, 4, 7, 1])  # the target wants 3, 4, 7, then 1
    assert accept_greedy([3, 4, 5], rows) == (2, 7)


def test_greedy_all_accepted_gives_the_bonus_token():
    assert accept_greedy([3, 4, 7], one_hot_logits([3, 4, 7, 1])) == (3, 1)


def test_greedy_first_rejected_and_empty_draft():
    rows = one_hot_logits([2, 4])
    assert accept_greedy([6], rows) == (0, 2)
    assert accept_greedy([], rows[:1]) == (0, 2)


def test_sampled_draft_equal_to_target_is_always_accepted():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, _ = accept_sampled([1, 3], np.stack([p, p]), [p, p, p], rng)
        assert n == 2


def test_sampled_token_the_target_never_wants_is_always_rejected():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    for _ in range(100):
        n, token = accept_sampled([2], q[None], [p, p], rng)
        assert n == 0 and token in (0, 1)


@pytest.mark.parametrize("point_mass", [False, True])
def test_sampled_first_token_is_distributed_as_the_target(point_mass):
    """One draft token from q (or a fixed proposal), then the accept rule: the
    emitted first token must follow p. Chi-square at alpha = 1e-4 with a fixed
    seed: deterministic, and a correct rule fails it with probability 1e-4."""
    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    q = np.array([0.5, 0.05, 0.05, 0.3, 0.1])
    rng = np.random.default_rng(1234)
    n = 20000
    counts = np.zeros(5)
    for _ in range(n):
        if point_mass:
            draft, probs = [0], None  # a lookup proposes token 0 every time
        else:
            draft, probs = [sample(q, rng)], q[None]
        accepted, token = accept_sampled(draft, probs, [p, p], rng)
        counts[draft[0] if accepted else token] += 1
    assert stats.chisquare(counts, p * n).pvalue > 1e-4


def test_distribution_transforms():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    greedy_like = GenerationParams(temperature=1.0, top_k=1)
    assert distribution(logits, greedy_like).tolist() == [1.0, 0.0, 0.0, 0.0]
    top_p = distribution(logits, GenerationParams(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(top_p, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    hot = distribution(logits, GenerationParams(temperature=100.0))
    assert hot.max() - hot.min() < 0.02
    assert top_k_filter(logits, 0) is logits


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_temperature_near_zero_samples_the_most_likely_token(temperature):
    """Logits over a tiny temperature overflow float32 (a request may send 1e-40):
    the distribution is still one, all its mass on the largest logit."""
    logits = np.array([2.0, 9.0, -3.0, 8.5], dtype=np.float32)
    probs = distribution(logits, GenerationParams(temperature=temperature))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert sample(probs, np.random.default_rng(0)) == 1


def test_top_p_on_a_large_flat_vocabulary_keeps_the_right_count():
    probs = np.full(100_000, 1e-5)
    kept = top_p_filter(probs, 0.5)
    assert np.count_nonzero(kept) == 50_000
    assert kept.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(max_tokens=0), dict(k=-1),
                                 dict(temperature=float("nan")), dict(temperature=float("inf")),
                                 dict(top_p=float("nan")), dict(seed=-1)])
def test_out_of_range_settings_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_", "[ -]")):
        check_params(GenerationParams(**bad))
