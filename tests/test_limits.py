"""One table of ranges and defaults (edgespec/limits.py): the CLI, the app's settings,
the server's schemas and the engine refuse and accept the same values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from edgespec import cli
from edgespec.cli.options import params_from_args
from edgespec.engine.events import GenerationParams
from edgespec.limits import LIMITS, MAX_CTX, MAX_DRAFT, MAX_SEED, MAX_TOP_K
from edgespec.engine.sampling import check_params
from edgespec.server.schemas import ChatCompletionRequest
from edgespec.tui.chat_settings import ChatSettings


def test_the_table_holds_the_ranges_a_llama_cpp_or_openai_user_expects():
    table = {name: (limit.low, limit.high, limit.default, limit.above_low) for name, limit in LIMITS.items()}
    assert table == {
        "k": (0, MAX_DRAFT, MAX_DRAFT, False), "temperature": (0, 2, 0, False), "top_k": (0, MAX_TOP_K, 0, False),
        "top_p": (0, 1, 1, True), "seed": (0, MAX_SEED, None, False), "max_tokens": (1, MAX_CTX, 512, False),
    }
    from edgespec.engine.choice import FAST_MAX_BATCH

    assert MAX_DRAFT == FAST_MAX_BATCH - 1 == 64  # the longest draft one verify pass holds


def test_the_largest_seed_is_one_llama_cpp_and_numpy_both_keep():
    """llama.cpp's sampler takes a 32-bit seed and reads its largest (LLAMA_DEFAULT_SEED) as
    a new random seed each time; numpy's Generator takes any seed from 0."""
    import llama_cpp
    import numpy as np

    assert MAX_SEED == llama_cpp.LLAMA_DEFAULT_SEED - 1 == 2**32 - 2
    assert np.random.default_rng(MAX_SEED).random() == np.random.default_rng(MAX_SEED).random()


@pytest.mark.parametrize("face, said", [("cli", "seed must be from 0 to 4,294,967,294"),
                                        ("engine", "seed must be from 0 to 4,294,967,294"),
                                        ("server", "less than or equal to 4294967294")])
def test_a_seed_past_the_largest_is_refused_naming_the_range(face, said):
    with pytest.raises((ValueError, ValidationError)) as refused:
        CHECKS[face]("seed", 10**30)
    assert said in str(refused.value)


def _edges():
    """(field, value, allowed) at each end of each range in the table."""
    for name, limit in LIMITS.items():
        kind = float if isinstance(limit.low, float) else int
        step = 0.1 if kind is float else 1
        if limit.low is not None:
            yield name, kind(limit.low), not limit.above_low
            yield name, kind(limit.low - step), False
            yield name, kind(limit.low + step), True
        if limit.high is not None:
            yield name, kind(limit.high), True
            yield name, kind(limit.high + step), False


EDGES = list(_edges())
FACES = ["cli", "app", "server", "engine"]


def _cli(field, value):
    option = "--" + field.replace("_", "-")
    params_from_args(cli.build_parser().parse_args(["generate", "hi", option, str(value)]))


def _app(field, value):
    if field == "seed":
        pytest.skip("the app's settings have no seed")
    ChatSettings(**{field: value})


def _server(field, value):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    if field == "k":
        body["speculation"] = {"k": value}
    else:
        body[field] = value
    ChatCompletionRequest.model_validate(body)


def _engine(field, value):
    check_params(GenerationParams(**{field: value}))


CHECKS = {"cli": _cli, "app": _app, "server": _server, "engine": _engine}


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("field, value, allowed", EDGES)
def test_every_face_refuses_and_accepts_the_same_values(face, field, value, allowed):
    check = CHECKS[face]
    if allowed:
        check(field, value)
    else:
        with pytest.raises((ValueError, ValidationError)):
            check(field, value)


def test_the_defaults_agree():
    """Without a pair to recommend a mode and k (models named by file), every face
    decodes with the engine's defaults."""
    cli_params = params_from_args(cli.build_parser().parse_args(["generate", "hi", "--target", "m.gguf"]))
    app = ChatSettings().params()
    engine = GenerationParams()
    for field in ("mode", "k", "temperature", "top_k", "top_p", "max_tokens"):
        assert getattr(cli_params, field) == getattr(app, field) == getattr(engine, field), field


def test_a_mode_named_without_k_takes_its_own_k_not_the_recommended_modes():
    """A pair's (or the server's) k goes with its own mode: --mode lookup after a pair
    that recommends auto at k 64 drafts lookup's k, not 64 tokens every cycle."""
    from edgespec.modes import MODE_K
    from edgespec.server.api import ServerSettings, _params

    assert MODE_K["lookup"] < MODE_K["auto"] == LIMITS["k"].default
    cli_params = params_from_args(cli.build_parser().parse_args(
        ["generate", "hi", "--target", "m.gguf", "--mode", "lookup"]))
    assert (cli_params.mode, cli_params.k) == ("lookup", MODE_K["lookup"])
    app = ChatSettings(mode="lookup").params(("auto", 64))
    assert (app.mode, app.k) == ("lookup", MODE_K["lookup"])
    app = ChatSettings().params(("auto", 40))
    assert (app.mode, app.k) == ("auto", 40)
    settings = ServerSettings("m", defaults=GenerationParams(mode="auto", k=40))

    def served(speculation):
        body = {"messages": [{"role": "user", "content": "hi"}], "speculation": speculation}
        params = _params(ChatCompletionRequest.model_validate(body), settings)
        return params.mode, params.k

    assert served({"mode": "lookup"}) == ("lookup", MODE_K["lookup"])
    assert served({"mode": "auto"}) == ("auto", 40)
    assert served({"k": 3}) == ("auto", 3)
    assert served({"mode": "draft", "k": 12}) == ("draft", 12)
