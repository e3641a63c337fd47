"""The real bundled Qwen2.5-Coder pair, assembled once and shared.

Assembly (1.6 GB from 28 installed packages, and the draft requantized to Q4_0)
takes seconds, so it happens once per
machine into a directory outside pytest's per-session temp dirs
(EDGESPEC_TEST_HOME, default: next to them); later sessions only check the marker.
Tests using these fixtures are marked `qwen` and skip when the parts are missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgespec.errors import ModelFileError
from edgespec.models.fetch import fetch
from edgespec.models.registry import DEFAULT_PAIR, load_registry


def shared_home(tmp_path_factory) -> Path:
    env = os.environ.get("EDGESPEC_TEST_HOME")
    return Path(env) if env else tmp_path_factory.getbasetemp().parent / "edgespec-test-home"


@pytest.fixture(scope="session")
def qwen_pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(EDGESPEC_HOME holding the assembled pair, target path, draft path)."""
    home = shared_home(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGESPEC_HOME", str(home))
        reg = load_registry()
        pair = reg.pair(DEFAULT_PAIR)
        paths = []
        for name in (pair.target, pair.draft):
            entry = reg.model(name)
            try:  # assembled from the parts (the draft: then requantized to Q4_0)
                paths.append(fetch(entry, download=False, registry=reg))
            except ModelFileError as e:
                pytest.skip(f"the bundled Qwen2.5-Coder pair is not installed ({e})")
    return home, paths[0], paths[1]
