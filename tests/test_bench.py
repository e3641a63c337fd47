"""The benchmark: interleaved modes, ratios within a repeat, llama.cpp as the baseline."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from edgespec import bench
from edgespec.bench import BASELINE, LlamaCppBaseline, Prompt, format_table, run_suite, same_note, summarize
from edgespec.engine.events import Chunk, GenerationParams, Stats

SPEED = {"plain": 10.0, "lookup": 15.0, "auto": 12.0, BASELINE: 11.0}
"""Tokens per second each fake mode reports."""


class FakeEngine:
    has_draft = False

    def __init__(self):
        self.calls: list[str] = []

    def generate(self, tokens, params):
        self.calls.append(params.mode)
        out = [1, 2, 3] if params.mode != "lookup" else [1, 2, 4]  # lookup "drifts" from plain
        yield Chunk("", out, [False] * 3, Stats(mode=params.mode, generated_tokens=3,
                                               decode_s=3 / SPEED[params.mode], target_passes=3))


class FakeBaseline:
    def __init__(self, engine):
        self.engine = engine

    def generate(self, tokens, params):
        self.engine.calls.append(BASELINE)
        return [1, 2, 3], Stats(mode=BASELINE, generated_tokens=3, decode_s=3 / SPEED[BASELINE], target_passes=3)


def test_every_mode_is_compared_with_llama_cpp_and_plain_within_each_repeat():
    engine = FakeEngine()
    prompts = [Prompt("p1", "code", "x"), Prompt("p2", "grounded", "y")]
    results = run_suite(engine, prompts, modes=(BASELINE, "plain", "draft", "lookup", "auto"), repeats=3,
                        encode=lambda text: [0], baseline=FakeBaseline(engine))
    by = {(r.prompt, r.mode): r for r in results}
    assert {m for _, m in by} == {BASELINE, "plain", "lookup", "auto"}  # no draft model: no draft mode
    auto = by[("p1", "auto")]
    assert auto.median("vs_llamacpp") == pytest.approx(12 / 11)
    assert auto.median("speedup") == pytest.approx(12 / 10)
    assert by[("p1", BASELINE)].identical and not by[("p1", "lookup")].identical
    # Each repeat starts with another mode (after one short warm-up per mode and prompt).
    firsts = [engine.calls[i * 16 + 4 + r * 4] for i in range(2) for r in range(3)]
    assert firsts[:3] == [BASELINE, "plain", "lookup"]
    table, summary = format_table(results), summarize(results)
    assert "vs llama.cpp" in table and "1.09x" in table
    assert "llama.cpp" in summary and "plain" in summary


@pytest.mark.parametrize("exact", [False, True])
def test_a_reply_that_is_not_plain_decodings_is_explained_under_the_table(exact):
    """`same` NO reads as a broken promise unless the table says why: llama.cpp's own
    loop, and without --exact a verify pass's rounding, may flip a near-tie."""
    engine = FakeEngine()
    results = run_suite(engine, [Prompt("p1", "code", "x")], modes=("plain", "lookup"), repeats=1,
                        encode=lambda text: [0])
    note = same_note(results, exact=exact)
    assert "1 of 2" in note and "near-tie" in note
    assert ("--exact" in note) is not exact  # under --exact edgespec's modes match: it is llama.cpp's, or a bug
    same = run_suite(FakeEngine(), [Prompt("p1", "code", "x")], modes=("plain", "auto"), repeats=1,
                     encode=lambda text: [0])
    assert same_note(same, exact=exact) == ""


def test_without_a_baseline_the_llama_cpp_mode_is_left_out():
    engine = FakeEngine()
    results = run_suite(engine, [Prompt("p", "code", "x")], modes=(BASELINE, "plain", "auto"), repeats=1,
                        encode=lambda text: [0])
    assert {r.mode for r in results} == {"plain", "auto"}
    assert all(not r.vs_llamacpp for r in results)


class KEngine(FakeEngine):
    """A fake with a draft model that records the draft length each run asks for."""

    has_draft = True

    def __init__(self):
        super().__init__()
        self.asked: list[tuple[str, int]] = []

    def generate(self, tokens, params):
        self.asked.append((params.mode, params.k))
        yield from super().generate(tokens, replace(params, mode="lookup" if params.mode == "draft" else params.mode))


def test_a_mode_may_carry_its_own_draft_length_beside_auto():
    """--modes draft:3,lookup:8,auto: fixed draft lengths run beside auto (which keeps
    the suite's k), each a row of its own."""
    engine = KEngine()
    params = GenerationParams(max_tokens=8, k=16)
    results = run_suite(engine, [Prompt("p", "code", "x")], modes=("plain", "draft:3", "lookup:8", "auto"),
                        repeats=2, params=params, encode=lambda text: [0])
    assert [r.mode for r in results] == ["plain", "draft:3", "lookup:8", "auto"]
    timed = engine.asked[4:]  # after one warm-up per mode
    assert set(timed) == {("plain", 16), ("draft", 3), ("lookup", 8), ("auto", 16)}
    assert {r.mode: r.median("speedup") for r in results}["lookup:8"] == pytest.approx(1.5)


class SessionEngine(FakeEngine):
    """A fake that records when it is told to start over."""

    def reset(self, *, learnt=False):
        self.calls.append(f"reset learnt={learnt}")


@pytest.mark.parametrize("first_replies", [True, False])
def test_first_replies_start_every_edgespec_run_as_a_new_session(first_replies):
    """--first-replies: before each timed run of an edgespec mode the engine forgets its
    caches and what auto learnt (a new chat's first reply pays the draft model's reading
    of the prompt and starts auto from its priors); llama.cpp's runs stay as they are."""
    engine = SessionEngine()
    run_suite(engine, [Prompt("p", "code", "x")], modes=(BASELINE, "plain", "auto"), repeats=2,
              encode=lambda text: [0], baseline=FakeBaseline(engine), first_replies=first_replies)
    calls = engine.calls
    runs = [call for call in calls if not call.startswith("reset")]
    assert len(runs) == 9 and runs.count(BASELINE) == 3  # each mode: a warm-up (plain, short) and two repeats
    resets = [calls[i - 1] == "reset learnt=True" for i, call in enumerate(calls) if call in ("plain", "auto")]
    assert resets == [first_replies] * 6
    assert calls.count("reset learnt=True") == (6 if first_replies else 0)


def test_the_bench_command_takes_first_replies(monkeypatch):
    from edgespec.cli import build_parser

    assert build_parser().parse_args(["bench", "--first-replies"]).first_replies
    assert not build_parser().parse_args(["bench"]).first_replies


@pytest.mark.parametrize("modes", ["draft:x", "draft:0", "lookup:99999", "llamacpp:3", "plain:2", "fast"])
def test_a_mode_that_is_not_one_is_refused_before_anything_loads(modes, capsys):
    from edgespec.cli import main

    assert main(["bench", "--modes", modes, "--target", "/nonexistent.gguf"]) != 0
    err = capsys.readouterr().err
    assert "mode" in err and "Traceback" not in err and "nonexistent" not in err


def test_rotation_lets_each_lead_in_turn():
    orders = [bench.rotation(["a", "b", "c"], i) for i in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


class _Context:
    def __init__(self):
        self.decode_s = 0.0


class TimedEngine(FakeEngine):
    """A fake whose every generation spends 0.06 s per pass in llama_decode (its clock, not the wall's)."""

    def __init__(self):
        super().__init__()
        self.target_seq = SimpleNamespace(ctx=_Context())
        self.draft_seq = None

    def generate(self, tokens, params):
        self.target_seq.ctx.decode_s += 0.06 * 3
        yield from super().generate(tokens, params)


def test_overhead_is_wall_time_outside_llama_decode_per_target_pass(monkeypatch):
    clock = iter(range(0, 1000, 1))  # each generation takes 1 s of wall time
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    results = run_suite(TimedEngine(), [Prompt("p", "code", "x")], modes=("plain", "auto"), repeats=2,
                        encode=lambda text: [0], overhead=True)
    for r in results:
        assert r.llama_s == pytest.approx([0.06, 0.06])
        assert r.overhead_s == pytest.approx([(1 - 0.18) / 3] * 2)
    assert bench.overhead_medians(results) == pytest.approx(((1 - 0.18) / 3, 0.06))
    assert "overhead/pass" in format_table(results) and "overhead/pass" not in format_table(
        run_suite(FakeEngine(), [Prompt("p", "code", "x")], modes=("plain",), repeats=1, encode=lambda text: [0]))


def test_machine_names_the_cpu():
    assert "cores" in bench.machine()


@pytest.mark.slow
def test_llama_cpp_baseline_decodes_greedily_like_plain_edgespec(smollm2):
    """Token for token when both run the same kernels: Llama's defaults keep flash
    attention off, which edgespec chooses where the probe finds it reads no slower
    (engine/attention.py), so the test asks for it. (Where the two differ, a
    near-tie can flip, which the benchmark's `same` column shows.)"""
    from edgespec.engine.runtime import Engine, ModelSettings

    with Engine.load(ModelSettings(smollm2, n_ctx=512, flash_attn=False)) as engine:
        tokens = engine.tokenize("<|im_start|>user\nCount from one to twenty.<|im_end|>\n<|im_start|>assistant\n")
        plain = [t for chunk in engine.generate(tokens, GenerationParams(mode="plain", max_tokens=40))
                 for t in chunk.tokens]
        baseline = LlamaCppBaseline(smollm2, n_ctx=512, n_threads=None, is_eog=engine.is_eog)
        try:
            out, stats = baseline.generate(tokens, GenerationParams(max_tokens=40))
            again, _ = baseline.generate(tokens, GenerationParams(max_tokens=12))
        finally:
            baseline.close()
    assert out == plain
    assert again == plain[:12]
    assert stats.generated_tokens == len(out) and stats.tokens_per_s > 0


# -- the command at its edges: hostile files, options and outputs, before any model loads ---------

def bench_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`edgespec bench ARGV` with a target that is not there: whatever the options, nothing loads."""
    from edgespec.cli import main

    code = main(["bench", "--target", "/nonexistent/model.gguf", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def said_in_one_line(err: str) -> bool:
    """One line that edgespec wrote (no traceback), and the models never loaded."""
    return (err.startswith("edgespec: error: ") and err.count("\n") == 1 and "Traceback" not in err
            and "nonexistent" not in err)


@pytest.mark.parametrize("text, said", [
    ("- a\n- b\n", "expected `prompts:`"),
    ("prompts: 3\n", "expected `prompts:`"),
    ("prompts: []\n", "expected `prompts:`"),
    ("prompts:\n  - id: a\n    category: c\n", "prompt 1: expected"),
    ("prompts:\n  - {id: a, category: c, prompt: p, temperature: 1}\n", "prompt 1: expected"),
    ("prompts:\n  - {id: a, category: c, prompt: [1, 2]}\n", "prompt 1: its prompt must be text"),
    ("prompts:\n  - {id: a, category: c, prompt: ''}\n", "prompt 1: its prompt must be text"),
    ("prompts:\n  - {id: a, category: c, prompt: p}\n  - {id: a, category: d, prompt: q}\n", "prompt 2: the id 'a'"),
    ("prompts: [\n  - {id: a\n", "not valid YAML (line"),
    pytest.param("[" * 50_000 + "]" * 50_000, "prompt suite", id="nested-50000-deep"),
    pytest.param("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
     "prompts:\n  - {id: a, category: c, prompt: *c}\n", "its prompt must be text", id="aliases"),
])
def test_a_prompt_suite_of_the_wrong_shape_is_refused_naming_the_file(capsys, tmp_path, text, said):
    suite = tmp_path / "suite.yaml"
    suite.write_text(text)
    code, _, err = bench_cli(capsys, "--prompts", str(suite))
    assert code == 1 and said_in_one_line(err) and str(suite) in err and said in err, err


@pytest.mark.parametrize("make, said", [
    (lambda p: None, "No such file"),
    (lambda p: p.mkdir(), "Is a directory"),
    (lambda p: p.write_bytes(b"prompts:\n  - {id: a, category: c, prompt: \xff\xfe}\n"), "not UTF-8"),
    (lambda p: p.write_bytes(b"#" * (bench.PROMPTS_MAX_BYTES + 1)), "too large"),
])
def test_a_prompt_suite_that_cannot_be_read_is_refused_naming_the_file(capsys, tmp_path, make, said):
    suite = tmp_path / "suite.yaml"
    make(suite)
    code, _, err = bench_cli(capsys, "--prompts", str(suite))
    assert code == 1 and said_in_one_line(err) and str(suite) in err and said in err, err


def test_a_category_with_no_prompt_is_refused_naming_those_there_are(capsys):
    code, _, err = bench_cli(capsys, "--category", "nonesuch")
    assert code == 1 and said_in_one_line(err) and "'nonesuch'" in err and "code" in err and "grounded" in err


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_repeats_below_one_are_refused(capsys, value):
    from edgespec.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--repeats", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--repeats" in err and ("at least 1" in err or "whole number" in err)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_tokens_below_one_are_refused_before_the_models_load(capsys, value):
    code, _, err = bench_cli(capsys, "--max-tokens", value)
    assert code == 1 and said_in_one_line(err) and "max tokens must be from 1 to" in err


def test_an_out_folder_the_results_cannot_go_in_is_refused_before_the_run(capsys, tmp_path):
    """Said before the models load (it was said after the whole run, and the results lost),
    and a file of the user's named as --out is left as it was."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    for out in ("/dev/full", str(mine), str(mine / "results"), "~no-such-user-of-edgespec/results"):
        code, _, err = bench_cli(capsys, "--out", out)
        assert code == 1 and said_in_one_line(err) and f"--out {out}" in err, err
    assert mine.read_text() == "mine"


def test_an_out_folder_is_made_only_when_the_results_are_written(capsys, tmp_path):
    """A run that fails before (here the models do not load) leaves no folder the user did
    not have; one that cannot be made is still said before the run, from the folder above."""
    out = tmp_path / "new" / "results"
    code, _, err = bench_cli(capsys, "--out", str(out))
    assert code == 1 and "nonexistent" in err
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    code, _, err = bench_cli(capsys, "--out", str(mine / "new" / "results"))
    assert code == 1 and said_in_one_line(err) and f"{mine} is not a folder" in err, err


class TemplateEngine:
    """A model without a chat template, that bench runs (tests/fakes.FakeEngine's tokenizer)."""

    def __new__(cls):
        from tests.fakes import FakeEngine

        engine = FakeEngine(reply=lambda prompt: "ok ok ok")
        engine.is_eog = lambda token: token == engine.eos
        engine.reset = lambda *, learnt=False: None
        return engine


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """`edgespec bench` on TemplateEngine, its results in tmp_path/out."""
    from edgespec.cli import generate, main

    engine = TemplateEngine()
    monkeypatch.setattr(generate, "engine_from_args", lambda args, progress=None: engine)
    monkeypatch.setattr(bench, "write_chart", lambda results, path: path.write_bytes(b"png"))

    def run(*argv: str) -> int:
        return main(["bench", "--modes", "plain,lookup", "--repeats", "1", "--category", "code",
                     "--out", str(tmp_path / "out"), *argv])
    run.engine = engine
    return run


def test_a_model_without_a_chat_template_is_benchmarked_with_template(fake_bench, capsys, tmp_path):
    """The error for a model without a template says to choose one with --template: bench takes it."""
    assert fake_bench() == 1
    assert "--template" in capsys.readouterr().err
    assert fake_bench("--template", "chatml") == 0
    assert (tmp_path / "out" / "results.json").exists()


def test_bench_into_a_closed_pipe_ends_quietly_with_the_engine_closed(fake_bench, monkeypatch, capsys):
    from edgespec.errors import EXIT_BROKEN_PIPE
    from tests.test_cli_edges import ClosedPipe

    monkeypatch.setattr("sys.stdout", ClosedPipe(allowed=10))
    assert fake_bench("--template", "chatml") == EXIT_BROKEN_PIPE
    assert fake_bench.engine.closed and "Traceback" not in capsys.readouterr().err


def test_bench_onto_a_full_disk_says_so_in_one_line(fake_bench, monkeypatch, capsys):
    import errno
    import io

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("sys.stdout", Full())
    assert fake_bench("--template", "chatml") == 1
    err = capsys.readouterr().err
    assert err == "edgespec: error: No space left on device\n" and fake_bench.engine.closed


def test_ctrl_c_mid_run_ends_the_bench_with_130_and_writes_no_results(synth_target, home, tmp_path):
    """A benchmark interrupted once it runs (its first line printed): the interrupted status, one
    line, and no results.json half-written, whichever mode (llama.cpp's own loop included) was running."""
    import os
    import signal
    import subprocess
    import sys

    from edgespec.errors import EXIT_INTERRUPTED

    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "bench", "--target", str(synth_target), "--no-draft", "--template",
         "chatml", "--modes", "plain,lookup,llamacpp", "--repeats", "100000", "--ctx", "512", "--threads", "1",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell's foreground command
    try:
        assert run.stdout.readline().startswith(b"backend ")  # loaded; the suite runs next
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == EXIT_INTERRUPTED and err.strip() == b"edgespec: interrupted", err
    assert not (out / "results.json").exists()


def test_results_that_do_not_fit_on_the_disk_leave_the_earlier_ones_as_they_were(tmp_path):
    """A full disk (here a file size limit) while writing results.json: said naming the file,
    and the results of an earlier run there are kept whole (they were cut short), no temporary left."""
    import subprocess
    import sys

    earlier = tmp_path / "results.json"
    earlier.write_text('{"earlier": true}')
    script = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
from edgespec import bench
from edgespec.errors import EdgespecError
results = [bench.Result("prompt", "code", "plain", tokens_per_s=[1.5] * 5000)]
try:
    bench.write_json(results, {str(earlier)!r})
except EdgespecError as e:
    print(e)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert f"{earlier}: cannot write it" in done.stdout, done.stdout + done.stderr
    assert earlier.read_text() == '{"earlier": true}' and list(tmp_path.iterdir()) == [earlier]
