"""The benchmark: a prompt suite x speculation modes, interleaved, side by side.

Every repeat runs all modes on a prompt back to back in a rotating order, so
that machine noise hits every mode alike; speedups are ratios to plain
decoding within the same repeat, summarised by their median. Greedy runs also
check that every mode produced exactly the plain tokens.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import yaml

from edgespec.engine.events import GenerationParams

DEFAULT_MODES = ("plain", "draft", "lookup", "auto")


@dataclass
class Prompt:
    id: str
    category: str
    prompt: str


@dataclass
class Result:
    """One prompt in one mode, over all repeats."""

    prompt: str
    category: str
    mode: str
    tokens_per_s: list[float] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    tokens_per_pass: list[float] = field(default_factory=list)
    identical: bool = True
    """Greedy: every repeat produced exactly the plain decoding's tokens."""

    def median(self, name: str) -> float:
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


def load_prompts(path: str | Path | None = None, *, categories: Sequence[str] | None = None) -> list[Prompt]:
    """The shipped suite (edgespec/data/bench_prompts.yaml) or your own file of the same shape."""
    text = (Path(path).read_text() if path
            else resources.files("edgespec").joinpath("data/bench_prompts.yaml").read_text())
    prompts = [Prompt(**p) for p in yaml.safe_load(text)["prompts"]]
    if categories:
        prompts = [p for p in prompts if p.category in categories]
    return prompts


def run_suite(
    engine,
    prompts: Sequence[Prompt],
    *,
    modes: Sequence[str] = DEFAULT_MODES,
    repeats: int = 3,
    params: GenerationParams | None = None,
    encode: Callable[[str], list[int]],
    on_result: Callable[[str], None] | None = None,
) -> list[Result]:
    """Run every prompt in every mode `repeats` times, interleaved. `encode`
    turns a prompt into the model's input (the chat template)."""
    base = params or GenerationParams(max_tokens=128)
    if not engine.has_draft:
        modes = [m for m in modes if m != "draft"]
    results = []
    for prompt in prompts:
        tokens = encode(prompt.prompt)
        _generate(engine, tokens, _with(base, mode="plain", max_tokens=8))  # warm-up: caches, pages
        by_mode = {m: Result(prompt.id, prompt.category, m) for m in modes}
        for r in range(repeats):
            order = list(modes[r % len(modes):]) + list(modes[: r % len(modes)])
            runs = {m: _generate(engine, tokens, _with(base, mode=m)) for m in order}
            plain_tps = runs["plain"][1].tokens_per_s if "plain" in runs else None
            for m, (out, stats) in runs.items():
                res = by_mode[m]
                res.tokens_per_s.append(stats.tokens_per_s)
                if plain_tps:
                    res.speedup.append(stats.tokens_per_s / plain_tps)
                if stats.drafted:
                    res.acceptance.append(stats.acceptance_rate)
                res.tokens_per_pass.append(stats.tokens_per_pass)
                if base.temperature == 0 and "plain" in runs and out != runs["plain"][0]:
                    res.identical = False
        results.extend(by_mode.values())
        if on_result:
            on_result(format_table(list(by_mode.values()), header=not any(r.prompt != prompt.id for r in results)))
    return results


def _with(params: GenerationParams, **changes) -> GenerationParams:
    return GenerationParams(**{**asdict(params), **changes})


def _generate(engine, tokens, params):
    out, last = [], None
    for last in engine.generate(tokens, params):
        out += last.tokens
    return out, last.stats


def format_table(results: Sequence[Result], *, header: bool = True) -> str:
    lines = []
    if header:
        lines.append(f"{'prompt':<16} {'category':<10} {'mode':<7} {'tok/s':>7} {'speedup':>8} "
                     f"{'accept':>7} {'tok/pass':>8}  same")
    for r in results:
        acc = f"{r.median('acceptance'):.0%}" if r.acceptance else "-"
        same = "yes" if r.identical else "NO"
        lines.append(f"{r.prompt:<16} {r.category:<10} {r.mode:<7} {r.median('tokens_per_s'):>7.1f} "
                     f"{r.median('speedup'):>7.2f}x {acc:>7} {r.median('tokens_per_pass'):>8.2f}  {same}")
    return "\n".join(lines)


def summarize(results: Sequence[Result]) -> str:
    """Per category and mode: geometric mean, worst and best speedup vs plain."""
    lines = [f"{'category':<10} {'mode':<7} {'geomean':>8} {'worst':>7} {'best':>7}"]
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        groups.setdefault((r.category, r.mode), []).append(r.median("speedup"))
        groups.setdefault(("all", r.mode), []).append(r.median("speedup"))
    for (category, mode), speedups in groups.items():
        if mode == "plain":
            continue
        gm = statistics.geometric_mean(speedups)
        lines.append(f"{category:<10} {mode:<7} {gm:>7.2f}x {min(speedups):>6.2f}x {max(speedups):>6.2f}x")
    return "\n".join(lines)


def write_json(results: Sequence[Result], path: str | Path, *, meta: dict | None = None) -> None:
    rows = [{**asdict(r), **{f"median_{k}": r.median(k) for k in ("tokens_per_s", "speedup", "acceptance")}}
            for r in results]
    Path(path).write_text(json.dumps({"meta": meta or {}, "results": rows}, indent=2))


def write_chart(results: Sequence[Result], path: str | Path, *, title: str = "") -> None:
    """A PNG: speedup vs plain per prompt (bars per mode), 1.0x marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = list(dict.fromkeys(r.prompt for r in results))
    modes = [m for m in dict.fromkeys(r.mode for r in results) if m != "plain"]
    fig, ax = plt.subplots(figsize=(max(8, len(prompts) * 0.9), 4.5))
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        values = [next((r.median("speedup") for r in results if r.prompt == p and r.mode == mode), 0)
                  for p in prompts]
        ax.bar([x + i * width for x in range(len(prompts))], values, width, label=mode)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(prompts))])
    ax.set_xticklabels(prompts, rotation=30, ha="right")
    ax.set_ylabel("speedup vs plain (median)")
    ax.set_title(title or "edgespec: speculative decoding vs plain")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
