"""`edgespec cache`: the cache folder's parts, their sizes, and clearing them."""

import pytest

from edgespec import cli


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "cache"
    (root / "kv").mkdir(parents=True)
    (root / "kv" / "a.kv").write_bytes(b"x" * 3000)
    (root / "measured").mkdir()
    (root / "measured" / "m.json").write_text("{}")
    (tmp_path / "home" / "models").mkdir(parents=True)
    (tmp_path / "home" / "models" / "m.gguf").write_bytes(b"GGUF")
    return root


def test_show_lists_each_part_with_its_size(cache, capsys):
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:] if line.strip()}
    assert set(rows) >= {"kv", "measured", "verified", "pool"} and rows["verified"] == "0" and rows["kv"] != "0"


def test_clear_removes_the_named_parts_and_never_the_models(cache, tmp_path):
    assert cli.main(["cache", "clear", "kv"]) == 0
    assert not (cache / "kv").exists() and (cache / "measured" / "m.json").exists()
    assert cli.main(["cache", "clear"]) == 0
    assert not (cache / "measured").exists()
    assert (tmp_path / "home" / "models" / "m.gguf").read_bytes() == b"GGUF"


def test_clear_does_not_follow_a_link_out_of_the_cache(cache, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (cache / "pool").symlink_to(outside)
    assert cli.main(["cache", "clear", "pool"]) == 0
    assert (outside / "keep.txt").read_text() == "keep"


def test_clear_says_which_linked_part_it_left_alone(cache, tmp_path, capsys):
    """A part linked elsewhere is not followed, and the user is told so: a bare exit 0 read as cleared."""
    outside = tmp_path / "precious"
    outside.mkdir()
    (cache / "pool").symlink_to(outside)
    assert cli.main(["cache", "clear", "pool"]) == 0
    err = capsys.readouterr().err
    assert "pool" in err and "precious" in err and "link" in err


def test_clear_removes_a_file_where_a_part_s_folder_belongs(cache, capsys):
    (cache / "verified").write_text("not a folder")
    assert cli.main(["cache", "clear", "verified"]) == 0
    assert not (cache / "verified").exists()
    assert "cleared verified" in capsys.readouterr().err


def test_an_unknown_part_is_a_clear_error(cache):
    assert cli.main(["cache", "clear", "models"]) == 1
