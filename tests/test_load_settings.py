"""LoadSettings: one type for loading the models, whose fields the CLI's options are
generated from; and the context size chosen when none is given (placement.fit_context)."""

from __future__ import annotations

import pytest

from edgespec import cli
from edgespec.cli import options
from edgespec.load_settings import LOAD_LIMITS, MIN_CTX, LoadSettings
from edgespec.placement import CTX_FLOOR, ContextNeed, fit_context

GIB = 1 << 30

# the bundled pair's shapes: Qwen2.5-Coder 1.5B (28 layers, 2 KV heads of 128) and 0.5B (24 layers, 2 of 64)
TARGET = ContextNeed(kv_per_token=28 * 2 * (128 + 128) * 2, n_head=12, n_ctx_train=32768)
DRAFT = ContextNeed(kv_per_token=24 * 2 * (64 + 64) * 2, n_head=14, n_ctx_train=32768)
PAIR = (TARGET, DRAFT)  # 40 KiB of KV cache per token together


def test_the_largest_context_whose_kv_caches_fit_a_share_of_memory():
    assert fit_context(PAIR, 64 * GIB) == 32768  # 1.25 GiB of caches: far below a quarter
    assert fit_context(PAIR, 4 * GIB) == 16384  # 32768 would take 1.25 GiB, more than a quarter of 4
    assert fit_context(PAIR, 2 * GIB) == 8192
    assert fit_context(PAIR, 1 * GIB) == CTX_FLOOR  # not even 8192: never less than the floor
    assert fit_context(PAIR, 0) == CTX_FLOOR


def test_the_context_is_capped_by_what_the_models_were_trained_for():
    short_draft = ContextNeed(DRAFT.kv_per_token, DRAFT.n_head, n_ctx_train=8192)
    assert fit_context((TARGET, short_draft), 64 * GIB) == 8192
    assert fit_context((ContextNeed(1, 1, n_ctx_train=2048),), 64 * GIB) == CTX_FLOOR
    assert fit_context((ContextNeed(1, 1, n_ctx_train=None),), 64 * GIB) == 32768  # the header does not say


def test_unknown_memory_gets_the_smallest_choice_and_the_scores_cap_keeps_the_kernel():
    assert fit_context(PAIR, None) == 8192
    # the unfused attention's scores for one batch of 512: 16384 x 512 x 14 heads x 4 bytes = 448 MiB
    assert fit_context(PAIR, 64 * GIB, scores_max=512 << 20) == 16384
    assert fit_context(PAIR, 64 * GIB, scores_max=256 << 20) == 8192


def test_a_context_need_is_read_from_a_gguf_header():
    meta = {"general.architecture": "qwen2", "qwen2.block_count": 28, "qwen2.embedding_length": 1536,
            "qwen2.attention.head_count": 12, "qwen2.attention.head_count_kv": 2, "qwen2.context_length": 32768}
    assert ContextNeed.from_gguf(meta) == TARGET
    assert ContextNeed.from_gguf(meta, kv_type="q8_0").kv_per_token == 28 * 2 * 256 * 34 // 32


def test_the_bundled_pair_gets_at_least_8192_where_memory_allows():
    from edgespec.engine.attention import CPU_SCORES_MAX_BYTES

    assert fit_context(PAIR, 8 * GIB, scores_max=CPU_SCORES_MAX_BYTES) >= 8192


def test_context_size_reads_the_headers(synth_target, tmp_path):
    from edgespec.load import context_size
    from tests.synthetic import write_model

    long = write_model(tmp_path / "long.gguf", n_ctx_train=16384)
    assert context_size(synth_target, available=64 * GIB) == CTX_FLOOR  # trained for 512
    assert context_size(long, long, available=64 * GIB) == 16384
    assert context_size(long, available=None) == 8192


def test_load_engine_loads_both_models_with_the_chosen_context(monkeypatch, tmp_path):
    import edgespec.load as load
    from tests.synthetic import write_model

    long = write_model(tmp_path / "long.gguf", n_ctx_train=16384)
    monkeypatch.setattr("edgespec.machine.available_memory", lambda: 64 * GIB)
    loaded = []
    monkeypatch.setattr(load.Engine, "load", lambda target, draft=None, **kw: loaded.append((target, draft)))
    load.load_engine(str(long), str(long), resolve=str)
    assert [(t.n_ctx, d.n_ctx) for t, d in loaded] == [(16384, 16384)]
    load.load_engine(str(long), resolve=str, settings=LoadSettings(n_ctx=1000))
    assert loaded[-1][0].n_ctx == 1000


@pytest.mark.parametrize("values", [{"n_ctx": MIN_CTX - 1}, {"n_threads": 0}, {"n_gpu_layers": -2},
                                    {"n_gpu_layers_draft": -5}, {"n_ctx": 4096.5}, {"n_threads": True},
                                    {"exact": True, "flash_attn": False}])
def test_load_settings_refuse_what_cannot_load(values):
    with pytest.raises(ValueError):
        LoadSettings(**values)


def test_the_cli_options_are_generated_from_the_load_settings():
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "hi"])
    assert options.load_settings_from_args(args).hardware() == LoadSettings()
    help_text = parser._subparsers._group_actions[0].choices["generate"].format_help()
    for name, (flag, _) in options.LOAD_FLAGS.items():
        assert flag in help_text and LOAD_LIMITS[name].range().split()[0] in help_text
    args = parser.parse_args(["generate", "hi", "--ctx", "16384", "--threads", "1", "--n-gpu-layers", "-1",
                              "--n-gpu-layers-draft", "0", "--exact", "--flash-attn", "on"])
    assert options.load_settings_from_args(args).hardware() == LoadSettings(
        n_ctx=16384, n_threads=1, n_gpu_layers=-1, n_gpu_layers_draft=0, exact=True, flash_attn=True)


@pytest.mark.parametrize("option", [["--ctx", str(MIN_CTX - 1)], ["--n-gpu-layers", "-2"], ["--threads", "0"],
                                    ["--n-gpu-layers-draft", "x"]])
def test_a_load_setting_out_of_range_is_a_usage_error_naming_the_option(capsys, option):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["generate", "hi", *option])
    assert e.value.code == 2 and option[0] in capsys.readouterr().err


def test_generate_json_reports_the_context_size(capsys, home, monkeypatch):
    import json

    from edgespec.cli import generate
    from tests.fakes import FakeEngine

    fake = FakeEngine(reply=lambda prompt: "ok", n_ctx=16384)
    monkeypatch.setattr(generate, "engine_from_args", lambda args, progress=None: fake)
    assert cli.main(["generate", "hi", "--template", "chatml", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_ctx"] == 16384


def test_serve_fills_the_same_settings_and_refuses_a_bad_one_before_taking_the_port(capsys, home, monkeypatch):
    pytest.importorskip("fastapi")
    import edgespec.server as server

    def bind(*args, **kw):
        raise AssertionError("the port was taken before the options were checked")

    monkeypatch.setattr(server, "bind", bind)
    assert cli.main(["serve", "--exact", "--flash-attn", "off"]) == cli.EXIT_ERROR
    assert "--exact" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["serve", "--ctx", "16384", "--flash-attn", "off"])
    assert options.load_settings_from_args(args).hardware() == LoadSettings(n_ctx=16384, flash_attn=False)


def test_the_bare_command_takes_the_load_options_for_the_app(monkeypatch):
    """`edgespec --ctx 16384 --flash-attn on` opens the app with them: they replace the
    default settings' for this run (as --rpc does), the rest stay the settings'."""
    import edgespec.tui as tui

    seen = {}
    monkeypatch.setattr(tui, "run_app", lambda **kw: seen.update(kw))
    assert cli.main(["--ctx", "16384", "--flash-attn", "on"]) == 0
    assert (seen["load"].n_ctx, seen["load"].flash_attn) == (16384, True)
    saved = LoadSettings(n_ctx=8192, n_threads=2, exact=True)
    assert seen["load"].over(saved) == LoadSettings(n_ctx=16384, n_threads=2, exact=True, flash_attn=True)
    assert cli.main([]) == 0 and seen["load"].over(saved) == saved


@pytest.fixture
def store(tmp_path):
    from edgespec.chat.store import ConversationStore

    with ConversationStore(tmp_path / "chats.db") as s:
        yield s


async def test_the_apps_command_line_load_settings_are_its_defaults(store):
    from tests.app_helpers import make_app, wait_for

    loads = []

    def load(choice, settings, progress):
        from tests.fakes import SpecFakeEngine

        loads.append(settings.load)
        return SpecFakeEngine(reply=lambda prompt: "ok", n_ctx=settings.load.n_ctx or 4096)

    app = make_app(store, load=load, load_given=LoadSettings(n_ctx=16384))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.model_state == "ready")
        assert loads[-1].n_ctx == 16384 and app.chat.settings.load.n_ctx == 16384
