"""`edgespec generate` end to end through cli.main, on synthetic models."""

from __future__ import annotations

import pytest

from edgespec.cli import main
from tests.synthetic import write_model


pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


def generate(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["generate", "--raw", "w1 w2 w3", "--max-tokens", "20", "--threads", "1", *argv])
    except SystemExit as e:  # argparse refuses an option
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("n_words", [45, 70])
def test_sampling_with_a_draft_of_another_vocabulary_size(capsys, synth_target, tmp_path, n_words):
    draft = write_model(tmp_path / "draft.gguf", seed=5, n_words=n_words)  # the target has 58 words
    for mode in ("draft", "auto"):
        code, out, err = generate(capsys, "--target", str(synth_target), "--draft", str(draft), "--mode", mode,
                                  "--temperature", "0.8", "--seed", "1")
        assert code == 0 and out.strip() and "ended: max_tokens" in err, err


@pytest.mark.parametrize("mode", ["draft", "auto", "plain"])
@pytest.mark.parametrize("ctx", ["8", "2"])
def test_a_context_too_small_to_speculate_in_is_refused_with_the_minimum(capsys, synth_target, synth_near_draft,
                                                                        mode, ctx):
    code, out, err = generate(capsys, "--target", str(synth_target), "--draft", str(synth_near_draft),
                              "--mode", mode, "--ctx", ctx)
    assert code == 2 and "--ctx" in err and "from 32 to" in err and "n_batch" not in err


def test_the_smallest_context_allowed_works_in_every_mode(capsys, synth_target, synth_near_draft):
    for mode in ("draft", "auto", "lookup", "plain"):
        for kernels in ([], ["--exact"]):
            code, _, err = generate(capsys, "--target", str(synth_target), "--draft", str(synth_near_draft),
                                    "--mode", mode, "--ctx", "32", *kernels)
            assert code == 0, (mode, kernels, err)


def test_the_same_seed_gives_the_same_sampled_reply_in_auto_mode(capsys, smollm2):
    import json

    runs = []
    for _ in range(2):
        code, out, err = generate(capsys, "--target", str(smollm2), "--no-draft", "--mode", "auto", "--json",
                                  "--seed", "3", "--temperature", "0.8", "--max-tokens", "24", "--ctx", "256")
        assert code == 0, err
        runs.append(json.loads(out))
    assert runs[0]["tokens"] == runs[1]["tokens"]
    assert [(r["stats"]["mode"], r["stats"]["drafted"]) for r in runs] == [("plain", 0)] * 2


@pytest.mark.parametrize("redirect, status, said", [
    ("paths > /dev/full", 1, "No space left on device"),
    ("paths >&-", 0, ""),  # stdout closed: nothing to say it on
    ("generate --template chatml <&-", 1, "the prompt is empty"),  # stdin closed: an empty prompt
])
def test_a_closed_or_full_stream_ends_with_a_message_not_a_traceback(tmp_path, redirect, status, said):
    """`edgespec chats > /dev/full` failed with an OSError traceback, and a closed stdout
    or stdin (which Python leaves as None) with an AttributeError one."""
    import os
    import shlex
    import subprocess
    import sys

    env = {**os.environ, "EDGESPEC_HOME": str(tmp_path / "home")}
    done = subprocess.run(f"exec {shlex.quote(sys.executable)} -m edgespec {redirect}", shell=True,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and said in done.stderr, done.stderr
