"""Where layers run: placement's rule on hand-made devices and model sizes, and
a model's needs read from a synthetic GGUF file."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edgespec.errors import ModelLoadError
from edgespec.load import placement
from edgespec.load_settings import LoadSettings
from edgespec.models.gguf_header import read_tensor_sizes
from edgespec.placement import FREE_CAP_ENV, MIB, ModelNeed, free_cap, place


@dataclass(frozen=True)
class Dev:
    name: str
    free: int
    kind: str = "GPU"


TARGET = ModelNeed(layers=(100 * MIB,) * 28, output=300 * MIB, compute=200 * MIB)
"""28 layers of 100 MiB, a 300 MiB output layer: 3,300 MiB in all."""
DRAFT = ModelNeed(layers=(20 * MIB,) * 24, output=100 * MIB, compute=100 * MIB)
"""680 MiB in all."""


def gpu(mib: int, name: str = "CUDA0") -> list[Dev]:
    return [Dev("CPU", 64 << 30, kind="CPU"), Dev(name, mib * MIB)]


def test_a_model_needs_its_last_layers_then_its_output():
    assert TARGET.n_layers == 29
    assert TARGET.bytes(0) == 0
    assert TARGET.bytes(1) == 300 * MIB  # one layer and the compute buffer
    assert TARGET.bytes(28) == 3000 * MIB
    assert TARGET.bytes(29) == 3300 * MIB
    assert TARGET.most_layers(1000 * MIB) == 8


def test_both_models_wholly_on_the_gpu_when_they_fit_together():
    p = place(gpu(8192), TARGET, DRAFT, margin=0)
    assert (p.target, p.target_of, p.draft, p.draft_of) == (29, 29, 25, 25)
    assert p.devices == ("CUDA0",) and p.free == 8192 * MIB and p.used == 3980 * MIB


def test_the_draft_wholly_and_as_many_target_layers_as_fit_the_rest():
    p = place(gpu(2000), TARGET, DRAFT, margin=0)  # 680 MiB for the draft, 1,320 left: 11 layers + compute
    assert (p.draft, p.target) == (25, 11)
    assert p.used <= p.free


def test_the_margin_is_left_on_each_gpu():
    assert place(gpu(2000 + 256), TARGET, DRAFT).target == 11


def test_nothing_fits_on_a_tiny_gpu():
    p = place(gpu(150), TARGET, DRAFT, margin=0)
    assert (p.target, p.draft) == (0, 0) and p.devices == ("CUDA0",)


def test_no_gpu_no_layers():
    p = place([Dev("CPU", 64 << 30, kind="CPU")], TARGET, DRAFT)
    assert (p.target, p.draft, p.devices) == (0, 0, ())
    assert "CPU" in p.describe()


def test_several_gpus_add_up_and_integrated_ones_count():
    p = place([Dev("Vulkan0", 2000 * MIB, kind="iGPU"), Dev("Vulkan1", 2000 * MIB)], TARGET, DRAFT, margin=0)
    assert (p.target, p.draft) == (29, 25) and p.devices == ("Vulkan0", "Vulkan1")


def test_the_cap_limits_the_free_memory_counted():
    p = place(gpu(80_000), TARGET, DRAFT, margin=0, cap=2000 * MIB)
    assert (p.draft, p.target, p.free) == (25, 11, 2000 * MIB)
    assert free_cap({FREE_CAP_ENV: "2000"}) == 2000 * MIB and free_cap({}) is None
    with pytest.raises(ValueError, match=FREE_CAP_ENV):
        free_cap({FREE_CAP_ENV: "lots"})


def test_a_count_given_is_kept_and_the_other_model_placed_in_what_it_leaves():
    p = place(gpu(2000), TARGET, DRAFT, margin=0, target_layers=-1)
    assert (p.target, p.draft) == (29, 0)  # the target's 3,300 MiB leave nothing
    p = place(gpu(2000), TARGET, DRAFT, margin=0, target_layers=5)  # 700 MiB
    assert (p.target, p.draft) == (5, 25)
    p = place(gpu(2000), TARGET, DRAFT, margin=0, draft_layers=0)
    assert (p.target, p.draft) == (18, 0)
    p = place(gpu(150), TARGET, DRAFT, target_layers=3, draft_layers=2)
    assert (p.target, p.draft) == (3, 2)
    assert place(gpu(150)[:1], TARGET, DRAFT, target_layers=-1).target == 29


def test_more_layers_than_the_model_has_is_refused():
    with pytest.raises(ModelLoadError, match=r"30 GPU layers asked for the target, which has 29"):
        place(gpu(8192), TARGET, DRAFT, target_layers=30)
    with pytest.raises(ModelLoadError, match="draft"):
        place(gpu(8192), TARGET, DRAFT, draft_layers=-2)


def test_no_draft_model():
    p = place(gpu(8192), TARGET, None, margin=0)
    assert (p.target, p.draft, p.draft_of) == (29, 0, 0)


def test_a_synthetic_models_needs_come_from_its_header(synth_target, monkeypatch):
    meta, sizes = read_tensor_sizes(synth_target)
    need = ModelNeed.from_gguf(meta, sizes, n_ctx=512)
    # tests/synthetic.py: 2 layers, n_embd 64, 2 heads of 32, 1 KV head, n_ff 128, F32 weights
    weights = 4 * (64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 128 * 64)
    kv = 512 * 1 * (32 + 32) * 2
    assert need.layers == (weights + kv,) * 2
    assert need.output == 4 * (meta["n_vocab"] * 64 + 64)
    assert need.n_layers == 3

    total = need.bytes(3)
    monkeypatch.setenv(FREE_CAP_ENV, "0")
    assert placement(synth_target, synth_target, n_ctx=512, devices=gpu(8192)).target == 0
    monkeypatch.delenv(FREE_CAP_ENV)
    found = placement(synth_target, synth_target, n_ctx=512, devices=gpu(8192))
    assert (found.target, found.draft, found.used) == (3, 3, 2 * total)
    assert placement(synth_target, n_ctx=512, devices=[]) is None  # no GPU: the models run as before


def test_the_apps_gpu_layers_default_to_auto():
    from edgespec.tui.chat_settings import ChatSettings

    assert (ChatSettings().load.n_gpu_layers, ChatSettings().load.n_gpu_layers_draft) == (None, None)
    tuned = ChatSettings.from_dict({"n_gpu_layers": "12", "gpu_layers_draft": -1})  # earlier names still read
    assert (tuned.load.n_gpu_layers, tuned.load.n_gpu_layers_draft) == (12, -1)
    assert ChatSettings.from_dict({"gpu_layers_target": "auto"}, defaults=tuned).load.n_gpu_layers is None
    assert ChatSettings.from_dict(ChatSettings().to_dict(), defaults=tuned) == ChatSettings()
    with pytest.raises(ValueError, match="GPU layers"):
        ChatSettings.from_dict({"n_gpu_layers_draft": -3})


def test_the_app_asks_for_auto_and_with_workers_for_all(monkeypatch):
    import edgespec.load as load
    from edgespec.net import Endpoint, Split
    from edgespec.tui.library import ModelChoice, load_choice
    from edgespec.tui.chat_settings import ChatSettings

    loaded = {}
    monkeypatch.setattr(load, "load_engine", lambda *a, **kw: loaded.update(kw))

    class Library:
        def resolve(self, name, progress=None):
            return f"/models/{name}.gguf"

    load_choice(ModelChoice(target="t"), ChatSettings(), library=Library())
    assert (loaded["settings"].n_gpu_layers, loaded["settings"].n_gpu_layers_draft) == (None, None)
    load_choice(ModelChoice(target="t"), ChatSettings.from_dict({"rpc": "127.0.0.1:5001"}), library=Library())
    assert loaded["settings"].n_gpu_layers is None
    assert loaded["settings"].rpc == Split((Endpoint("127.0.0.1", 5001),))
    monkeypatch.undo()
    # load_engine's rule, for every face: workers named, no count given: every target layer goes to them
    settings = []
    monkeypatch.setattr(load.Engine, "load", lambda target, draft=None, **kw: settings.append(target))
    workers = Split((Endpoint("127.0.0.1", 5001),))
    load.load_engine("t.gguf", resolve=str, settings=LoadSettings(n_ctx=512, rpc=workers))
    load.load_engine("t.gguf", resolve=str, settings=LoadSettings(n_ctx=512, rpc=workers, n_gpu_layers=3))
    assert [s.n_gpu_layers for s in settings] == [-1, 3]
