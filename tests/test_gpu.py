"""Placement and decoding on a GPU that llama.cpp sees (scripts/gpu_check.sh runs
these on a Vulkan build). Each test skips itself on a build or machine without one."""

from __future__ import annotations

import pytest

from edgespec.load import load_engine, placement
from edgespec.load_settings import LoadSettings
from edgespec.models.gguf_header import read_tensor_sizes
from edgespec.placement import FREE_CAP_ENV, MARGIN_BYTES, MIB, ModelNeed
from tests.test_engine_real import QUESTIONS, chat_tokens, generate

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpus():
    from edgespec.llama.rpc import offload_devices

    found = [d for _, d in offload_devices()]
    if not found:
        pytest.skip("llama.cpp sees no GPU device (a CPU build, or no GPU here)")
    return found


def load(target, draft=None, **kw):
    return load_engine(str(target), str(draft) if draft else None, resolve=lambda p: p,
                       pair_models=lambda name: (name, None), settings=LoadSettings(**kw))


def offloaded(engine, role="target") -> tuple[int, int, set[str]]:
    m = engine.describe().models[role]
    return m.n_gpu_layers, m.n_layer + 1, {row.device for row in m.layers}


def test_both_synthetic_models_go_wholly_to_the_gpu_by_default(gpus, synth_target, synth_near_draft):
    with load(synth_target, synth_near_draft, n_ctx=512) as engine:
        for role in ("target", "draft"):
            layers, of, devices = offloaded(engine, role)
            assert layers == of and "CPU" not in devices, role
        tokens = engine.tokenize("hello world", special=True)
        plain, _ = generate(engine, tokens, mode="plain", max_tokens=16)
        assert len(plain) == 16


@pytest.mark.slow
def test_a_capped_gpu_takes_the_draft_and_part_of_the_target(gpus, smollm2, monkeypatch):
    whole = placement(smollm2, smollm2, n_ctx=512)
    assert (whole.target, whole.draft) == (whole.target_of, whole.draft_of)
    need = ModelNeed.from_gguf(*read_tensor_sizes(smollm2), n_ctx=512)
    per_gpu = (need.bytes(need.n_layers) + need.bytes(need.n_layers // 2)) // len(gpus) + MARGIN_BYTES
    monkeypatch.setenv(FREE_CAP_ENV, str(-(-per_gpu // MIB)))
    with load(smollm2, smollm2, n_ctx=512) as engine:
        target, of, devices = offloaded(engine)
        assert 0 < target < of and "CPU" in devices
        assert offloaded(engine, "draft")[0] == offloaded(engine, "draft")[1]


@pytest.mark.slow
def test_smollm2_on_the_gpu_speculates_the_target_s_own_tokens(gpus, smollm2):
    with load(smollm2, smollm2, n_ctx=1024) as engine:
        assert offloaded(engine)[0] == offloaded(engine)[1]
        tokens = chat_tokens(engine, QUESTIONS[1])
        plain, _ = generate(engine, tokens, mode="plain", max_tokens=32)
        spec, stats = generate(engine, tokens, mode="draft", k=4, max_tokens=32, p_min=0.0)
        assert stats.drafted > 0
        assert spec[:8] == plain[:8]  # a GPU batch may round a late near-tie apart


def test_an_explicit_count_is_kept_on_the_gpu(gpus, synth_target):
    with load(synth_target, n_ctx=512, n_gpu_layers=1) as engine:
        assert offloaded(engine)[0] == 1


@pytest.mark.slow
def test_exact_on_the_gpu_is_plain_greedy_token_for_token_or_decodes_plainly(gpus, smollm2):
    """--exact where the target's layers are on the GPU: the exactness probe runs on
    that backend's kernels, and either speculation is plain greedy decoding token
    for token, or no verify batch is exact there and every mode decodes plainly."""
    from edgespec.engine.events import GenerationParams

    with load(smollm2, smollm2, n_ctx=1024, exact=True) as engine:
        assert offloaded(engine)[0] == offloaded(engine)[1]
        tokens = chat_tokens(engine, QUESTIONS[1])
        plain, _ = generate(engine, tokens, mode="plain", max_tokens=24)
        for mode in ("draft", "auto"):
            spec, stats = generate(engine, tokens, mode=mode, k=4, max_tokens=24, p_min=0.0)
            assert spec == plain, mode
            if engine.max_verify_batch() < 2:  # no verify batch is exact here: it decodes plainly
                plan = engine.policy(GenerationParams(mode=mode, k=4)).plan(tokens)
                assert (plan.kind, plan.k, plan.drafter, stats.drafted) == ("plain", 0, None, 0), mode


def test_more_layers_than_the_model_has_is_a_clear_error_on_the_gpu(gpus, synth_target):
    from edgespec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="layers"):
        load(synth_target, n_ctx=256, n_gpu_layers=10_000)
