"""`edgespec generate` / `chat` options checked before any model loads, with a fake engine."""

import io
import sys

import pytest
from tests.fakes import FakeEngine

from edgespec import cli
from edgespec.cli import chats, generate, options
from edgespec.cli.bars import ProgressBars
from edgespec.cli.output import stderr_stats
from edgespec.engine.events import GenerationParams, Stats


def load_with(monkeypatch, load):
    """Have `generate` and `chat` load their models with `load`."""
    for command in (generate, chats):
        monkeypatch.setattr(command, "engine_from_args", load)


@pytest.fixture
def engine(monkeypatch):
    """The engine every command gets; it replies with the prompt it was given."""
    fake = FakeEngine(reply=lambda prompt: "[" + prompt + "]")
    load_with(monkeypatch, lambda args, progress=None: fake)
    return fake


@pytest.fixture
def no_load(monkeypatch):
    def load(args, progress=None):
        raise AssertionError("the models were loaded before the options were checked")
    load_with(monkeypatch, load)


@pytest.mark.parametrize("option, message", [
    (["--top-p", "2"], "top-p"), (["--temperature", "-1"], "temperature"), (["--max-tokens", "0"], "max tokens"),
    (["--top-k", "-3"], "top-k"), (["--k", "-1"], "k must be"),
    (["--top-k", str(10**30)], "top-k must be"), (["--max-tokens", str(10**30)], "max tokens must be"),
    (["--seed", str(2**32 - 1)], "seed must be from 0 to 4,294,967,294"),
])
@pytest.mark.parametrize("command", [["generate", "hi"], ["chat", "--once", "hi"]])
def test_bad_sampling_options_are_refused_before_the_models_load(capsys, no_load, home, command, option, message):
    assert cli.main([*command, *option]) == cli.EXIT_ERROR
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--top-k", "\u0664\u0660"], ["--temperature", "\uff10.5"],
                                    ["--ctx", "\u0664\u0660\u0669\u0666"], ["--max-tokens", "\u0968"]])
def test_numbers_in_digits_other_than_0_to_9_are_refused_as_usage_errors(capsys, option):
    """int() reads '٤٠' as 40: digits a keyboard layout or a pasted text put there are named, not read."""
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["generate", "hi", *option])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert option[0] in err and "digits 0-9" in err and "Traceback" not in err


def test_k_above_what_a_verify_pass_holds_is_refused_naming_the_most(capsys, no_load, home):
    from edgespec.engine.choice import FAST_MAX_BATCH

    assert cli.main(["generate", "hi", "--template", "chatml", "--k", "500", "--mode", "lookup"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "k must be" in err and str(FAST_MAX_BATCH - 1) in err and "500" in err


def test_threads_are_checked_and_clamped_to_the_cores(capsys, monkeypatch):
    import os

    args = cli.build_parser().parse_args(["generate", "hi", "--threads", "4096"])
    assert options.load_settings_from_args(args).n_threads == os.cpu_count()
    assert "--threads 4096" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "hi", "--threads", "-2"])
    assert "--threads" in capsys.readouterr().err


@pytest.mark.parametrize("ctx", ["4294969344", "99999999999999999999", str(2**24 + 1)])
def test_a_context_past_what_llama_cpp_holds_is_refused_not_wrapped(capsys, ctx):
    """llama.cpp's n_ctx is 32 bits: 4,294,969,344 ran as a 2,048-token context, and a
    larger one asked for terabytes (killed by the kernel). No model is trained past
    millions of tokens: --ctx stops at 2^24."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "hi", "--ctx", ctx])
    err = capsys.readouterr().err
    assert "--ctx" in err and "16,777,216" in err, err
    args = cli.build_parser().parse_args(["generate", "hi", "--ctx", str(2**24)])
    assert options.load_settings_from_args(args).n_ctx == 2**24


def test_k_0_outside_plain_mode_is_plain_decoding_and_the_stats_line_says_why():
    from edgespec.engine.choice import Policies
    from edgespec.engine.drafters import PromptLookup

    policies = Policies(None, None, exact=False, drafters=[PromptLookup()], costs_path=lambda k: None)
    plan = policies.choose(GenerationParams(mode="lookup", k=0)).plan([])
    assert (plan.kind, plan.drafter, plan.k) == ("plain", None, 0)
    stats = Stats(mode="lookup", drafter="none", reason=plan.reason, generated_tokens=3)
    assert plan.reason and plan.reason in stderr_stats(stats)


@pytest.mark.parametrize("face", ["generate", "serve"])
def test_a_seed_with_a_temperature_decodes_plainly_in_auto_mode_whatever_the_face(face):
    """Auto's choices depend on timings, and a sampled reply on what was drafted: a
    seed promises the same reply, so the engine decodes it plainly."""
    from edgespec.engine.choice import decoded_mode

    def mode(*argv):
        args = cli.build_parser().parse_args([face, *(["hi"] if face == "generate" else []), *argv])
        return decoded_mode(options.params_from_args(args))

    assert mode("--seed", "3", "--temperature", "0.8") == "plain"
    assert mode("--seed", "3") == mode("--temperature", "0.8") == "auto"  # greedy, or no promise
    assert mode("--seed", "3", "--temperature", "0.8", "--mode", "draft") == "draft"  # fixed: reproducible


def test_a_pair_decodes_in_its_own_mode_and_k_unless_told(home):
    """models.yaml's pairs say how to run them (qwen2.5-coder-7b: draft, k 5); --mode and --k
    given win; models named by file decode in the default mode and k."""
    from edgespec.limits import LIMITS
    from edgespec.models.registry import DEFAULT_PAIR, load_registry
    from edgespec.modes import DEFAULT_MODE, MODE_K

    def params(*argv):
        p = options.params_from_args(cli.build_parser().parse_args(["generate", "hi", *argv]))
        return p.mode, p.k

    pair = load_registry().pair_or_model("qwen2.5-coder-7b")
    assert (pair.mode, pair.k) == ("draft", 5)
    assert params("--pair", "qwen2.5-coder-7b") == ("draft", 5)
    # a pair's k is for its own mode: another mode takes that mode's k
    assert params("--pair", "qwen2.5-coder-7b", "--mode", "auto") == ("auto", MODE_K["auto"])
    assert params("--pair", "qwen2.5-coder-7b", "--mode", "draft") == ("draft", 5)
    assert params("--pair", "qwen2.5-coder-7b", "--k", "3") == ("draft", 3)
    assert params("--pair", "qwen2.5-coder-7b", "--mode", "lookup", "--k", "0") == ("lookup", 0)
    bundled = load_registry().pair_or_model(DEFAULT_PAIR)
    assert params() == (bundled.mode, bundled.k)
    assert bundled.mode == "auto" and bundled.k > MODE_K["lookup"]
    assert params("--mode", "lookup") == ("lookup", MODE_K["lookup"])  # not auto's long drafts, every cycle
    assert params("--mode", "draft") == ("draft", MODE_K["draft"])
    assert params("--mode", "lookup", "--k", "40") == ("lookup", 40)
    assert params("--target", "model.gguf") == (DEFAULT_MODE, LIMITS["k"].default)
    for face in (["chat"], ["serve"]):
        args = cli.build_parser().parse_args([*face, "--pair", "qwen2.5-coder-7b"])
        assert (options.params_from_args(args).mode, options.params_from_args(args).k) == ("draft", 5)


def test_generate_takes_a_template_for_a_model_without_one(capsys, engine):
    assert cli.main(["generate", "hi"]) == cli.EXIT_ERROR
    assert "--template" in capsys.readouterr().err
    assert cli.main(["generate", "hi", "--template", "chatml"]) == 0
    assert "<|im_start|>user\nhi<|im_end|>" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    assert "--template FORMAT" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat", "--once", "hi"], ["bench"], ["serve"]])
def test_an_unknown_template_is_refused_while_parsing_naming_the_known_ones(capsys, command):
    """Before the models load (minutes on a big one): the names come from BUILTIN_FORMATS."""
    from edgespec.chat import BUILTIN_FORMATS

    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args([*command, "--template", "chatm1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--template" in err and "'chatm1'" in err and all(name in err for name in BUILTIN_FORMATS), err
    for value in ("gemma", "{{ messages[0].content }}"):  # a built-in name, or Jinja source, as before
        assert cli.build_parser().parse_args([*command, "--template", value]).template == value


def test_invalid_utf8_on_stdin_is_replaced_and_reported(capsys, engine, monkeypatch):
    raw = io.BytesIO("héllo ".encode() + b"\xff\xfe world")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape"))
    assert cli.main(["generate", "--template", "chatml"]) == 0
    out, err = capsys.readouterr()
    assert "héllo \ufffd\ufffd world" in out
    assert "not valid UTF-8" in err and "byte 7" in err


def test_gpu_layers_on_a_build_without_gpu_say_so_once(capsys, monkeypatch, synth_target):
    import edgespec.llama

    monkeypatch.setattr(edgespec.llama, "system_info", lambda: {"backend": "cpu", "gpu_offload": False})
    args = cli.build_parser().parse_args(["generate", "hi", "--n-gpu-layers", "-1", "--n-gpu-layers-draft", "-1"])
    options.load_settings_from_args(args)
    err = capsys.readouterr().err
    assert err.count("no GPU backend") == 1 and "GGML_METAL" in err and "GGML_CUDA" in err
    options.load_settings_from_args(cli.build_parser().parse_args(["generate", "hi"]))
    assert capsys.readouterr().err == ""


def test_progress_is_drawn_one_line_per_finished_file_off_a_terminal():
    import io

    from edgespec.models.progress import Progress

    out = io.StringIO()
    bars = ProgressBars(out)
    bars(Progress("m.gguf", 0, 2_000_000, 0.0, None))
    bars(Progress("m.gguf", 1_000_000, 2_000_000, 1e6, 1.0))
    assert out.getvalue() == ""  # not a terminal: nothing until the file is done
    bars(Progress("m.gguf", 2_000_000, 2_000_000, 1e6, 0.0))
    bars(Progress("m.gguf", 2_000_000, 2_000_000, 4e6, 0.0, stage="verify"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "download" in lines[0] and "m.gguf" in lines[0] and "2.0/2.0 MB" in lines[0]
    assert "verify" in lines[1] and "100%" in lines[1]



def test_flash_attention_is_a_model_option_and_exact_kernels_refuse_it_off(capsys, home, monkeypatch):
    import edgespec.load

    asked = []

    def load_engine(*args, **kw):
        asked.append(kw["settings"].flash_attn)
        raise KeyboardInterrupt  # stop here: the models are not the point

    monkeypatch.setattr(edgespec.load, "load_engine", load_engine)
    for value in ("on", "off", "auto"):
        with pytest.raises(KeyboardInterrupt):
            options.engine_from_args(cli.build_parser().parse_args(["generate", "hi", "--flash-attn", value]))
    assert asked == [True, False, None]
    assert cli.main(["generate", "hi", "--exact", "--flash-attn", "off"]) == cli.EXIT_ERROR
    assert "--exact needs flash attention" in capsys.readouterr().err and len(asked) == 3


def test_the_app_takes_no_draft_and_the_cache_options_as_the_commands_do(monkeypatch):
    """`edgespec --no-draft` (the app) loads no draft model, as `generate`, `chat` and
    `serve` do; the cache options reach the app's engine too."""
    import edgespec.tui as tui

    seen = {}
    monkeypatch.setattr(tui, "run_app", lambda **kw: seen.update(kw))
    assert cli.main(["--no-draft", "--parallel", "2", "--cache-ram", "0", "--cache-disk", "0"]) == 0
    assert seen["no_draft"] is True
    assert (seen["cache"].slots, seen["cache"].ram_mib, seen["cache"].disk) == (2, 0, None)
    assert seen["cache"].measured is not None  # no snapshots on disk, but flash attention is measured once
    assert cli.main([]) == 0 and seen["no_draft"] is False and seen["cache"].disk is not None


def test_a_choice_without_a_draft_loads_none_even_from_a_pair():
    from edgespec.tui.library import ModelChoice, load_choice
    from edgespec.tui.chat_settings import ChatSettings

    loaded = {}

    class Library:
        def resolve(self, name, progress=None):
            return f"/models/{name}.gguf"

        def pair(self, name):
            return "target", "draft"

    import edgespec.load as load

    def fake_load(target, draft=None, **kw):
        loaded.update(target=target, draft=draft, no_draft=kw["no_draft"])
        return "engine"

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load, "load_engine", fake_load)
        load_choice(ModelChoice(pair="p", no_draft=True), ChatSettings(), library=Library())
    assert loaded["no_draft"] is True


def test_a_model_path_under_a_home_that_does_not_exist_is_said_in_the_app(monkeypatch):
    """The app's model picker takes ~USER/... paths as the command line does: a user with no
    home folder here is one line, not a RuntimeError from Path.expanduser."""
    from edgespec.errors import EdgespecError
    from edgespec.tui.chat_settings import ChatSettings
    from edgespec.tui.library import ModelChoice, load_choice
    import edgespec.load as load

    monkeypatch.setattr(load, "load_engine", lambda target, draft=None, **kw: kw["resolve"](target))
    with pytest.raises(EdgespecError, match="names no home folder"):
        load_choice(ModelChoice(target="~no-such-user-edgespec/m.gguf"), ChatSettings())


def test_the_app_gets_the_whole_rpc_split_not_only_the_workers(monkeypatch):
    """`edgespec --rpc ... --tensor-split ... --local-output` (the app) loads with the
    same split as every other command; workers changed in the settings replace it."""
    import edgespec.load as load
    import edgespec.tui as tui
    from edgespec.net import Endpoint, Split
    from edgespec.tui.library import ModelChoice, load_choice
    from edgespec.tui.chat_settings import ChatSettings

    seen = {}
    monkeypatch.setattr(tui, "run_app", lambda **kw: seen.update(kw))
    assert cli.main(["--rpc", "127.0.0.1:5001", "--tensor-split", "1,3", "--local-output"]) == 0
    split = Split((Endpoint("127.0.0.1", 5001),), (1.0, 3.0), local_output=True)
    assert seen["rpc"] == split

    loaded = {}
    monkeypatch.setattr(load, "load_engine", lambda *a, **kw: loaded.update(kw))

    class Library:
        def resolve(self, name, progress=None):
            return f"/models/{name}.gguf"

    def workers(text):
        return ChatSettings.from_dict({"rpc": text})

    load_choice(ModelChoice(target="t"), workers("127.0.0.1:5001"), library=Library(), split=split)
    assert loaded["settings"].rpc == split
    load_choice(ModelChoice(target="t"), workers("127.0.0.1:6000"), library=Library(), split=split)
    assert loaded["settings"].rpc == Split((Endpoint("127.0.0.1", 6000),))


def test_chat_waits_for_another_reply_in_the_conversation_and_then_answers(engine, monkeypatch, tmp_path, capsys):
    """`chat --conversation ID --once` while another process replies there: it says it waits,
    then answers once the other reply is stored (the lock is held here by a thread)."""
    import threading

    from edgespec.chat import ConversationStore
    from edgespec.chat.reply_lock import reply_lock

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / engine.describe().target.path).write_bytes(b"")  # the stored model is still there: no note of it
    assert cli.main(["chat", "--new", "--template", "chatml", "--once", "first"]) == 0
    capsys.readouterr()
    waiting, notes = threading.Event(), []

    def note(text):
        notes.append(text)
        waiting.set()

    monkeypatch.setattr(chats, "note", note)
    with ConversationStore() as store:
        path = store.path
    holding = threading.Event()

    def hold():
        with reply_lock(path, 1):
            holding.set()
            waiting.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(30)
    assert cli.main(["chat", "--conversation", "1", "--template", "chatml", "--once", "second"]) == 0
    holder.join(30)
    assert len(notes) == 1 and waiting.is_set()
    with ConversationStore() as store:
        assert [m.content for m in store.messages(1) if m.role == "user"] == ["first", "second"]


def test_generate_names_the_model_whose_chat_template_is_broken(capsys, monkeypatch):
    """`chat` named the file; `generate` said "the chat template of the model"."""
    load_with(monkeypatch, lambda args, progress=None: FakeEngine(chat_template="{% for %}"))
    assert cli.main(["generate", "hi"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "fake.gguf" in err and "the model" not in err, err
