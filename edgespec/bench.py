"""The benchmark: a prompt suite x speculation modes, interleaved, side by side.

Every repeat runs all modes on a prompt back to back in a rotating order, so
that machine noise hits every mode alike; speedups are ratios within the same
repeat, summarised by their median: to plain llama.cpp (mode `llamacpp`:
llama-cpp-python's high-level `Llama` with its defaults on the same target,
what a user would run instead) and to edgespec's own plain decoding. Greedy
runs also check that every mode produced exactly the plain tokens.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import yaml

from edgespec.engine.events import GenerationParams, Stats
from edgespec.errors import yaml_problem
from edgespec.limits import BENCH_MAX_TOKENS, MAX_DRAFT
from edgespec.machine import cpu_name
from edgespec.modes import MODES

BASELINE = "llamacpp"
DEFAULT_MODES = (BASELINE, *MODES)
REPEATS = 3
"""How many times each prompt runs in each mode by default: speedups are medians over them."""


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
    """Over edgespec's plain decoding."""
    vs_llamacpp: list[float] = field(default_factory=list)
    """Over plain llama.cpp (the `llamacpp` mode)."""
    acceptance: list[float] = field(default_factory=list)
    tokens_per_pass: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    """Per target pass: wall time outside llama_decode, edgespec's own work a
    cycle (run_suite(overhead=True); empty for the `llamacpp` mode)."""
    llama_s: list[float] = field(default_factory=list)
    """Per target pass: time inside llama_decode, target and draft (with overhead_s)."""
    identical: bool = True
    """Greedy: every repeat produced exactly the plain decoding's tokens."""

    def median(self, name: str) -> float:
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


PROMPTS_MAX_BYTES = 1 << 20
"""The largest prompt suite read (the shipped one has 3 KB): a file past it is not a suite, and
PyYAML would take minutes over it."""

_PROMPT_FIELDS = tuple(f.name for f in fields(Prompt))


def load_prompts(path: str | Path | None = None, *, categories: Sequence[str] | None = None) -> list[Prompt]:
    """The shipped suite (edgespec/data/bench_prompts.yaml) or your own file of the same shape:
    `prompts:`, a list of `id`, `category` and `prompt`, each text, the ids unique. Raises
    ValueError naming the file and what is wrong, and where no prompt is in `categories`."""
    where = str(path) if path else "the shipped prompt suite"
    text = _read_suite(Path(path)) if path else resources.files("edgespec").joinpath(
        "data/bench_prompts.yaml").read_text(encoding="utf-8")
    try:
        doc = yaml.safe_load(text)
    except RecursionError:  # YAML nested deeper than Python's stack
        raise ValueError(f"{where}: nested too deeply to be a prompt suite") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({yaml_problem(e)})") from None
    prompts = _prompts(doc, where)
    if categories:
        prompts = [p for p in prompts if p.category in categories]
        if not prompts:
            raise ValueError(f"{where} has no prompt in {', '.join(map(repr, categories))}; its categories are "
                             f"{', '.join(dict.fromkeys(p.category for p in _prompts(doc, where)))}")
    return prompts


def _read_suite(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(PROMPTS_MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the prompt suite ({e.strerror or e})") from None
    if len(data) > PROMPTS_MAX_BYTES:
        raise ValueError(f"{path}: over {PROMPTS_MAX_BYTES >> 20} MiB, too large for a prompt suite")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); a prompt suite is YAML text") from None


def _prompts(doc, where: str) -> list[Prompt]:
    """The suite's prompts, checked: each a mapping of id, category and prompt, all text, ids unique."""
    shape = f"expected `prompts:`, a list of {', '.join(_PROMPT_FIELDS)} (as edgespec/data/bench_prompts.yaml)"
    entries = doc.get("prompts") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: {shape}")
    prompts: list[Prompt] = []
    ids: set[str] = set()
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or set(entry) != set(_PROMPT_FIELDS):
            raise ValueError(f"{where}: prompt {i}: {shape}")
        bad = next((name for name in _PROMPT_FIELDS if not isinstance(entry[name], str) or not entry[name]), None)
        if bad:
            raise ValueError(f"{where}: prompt {i}: its {bad} must be text, and not empty")
        if entry["id"] in ids:
            raise ValueError(f"{where}: prompt {i}: the id {entry['id'][:60]!r} is given twice; the ids name "
                             "the rows of the results")
        ids.add(entry["id"])
        prompts.append(Prompt(**entry))
    return prompts


def rotation(items: Sequence, i: int) -> list:
    """The order of round `i`: each item leads in turn, so that machine noise hits all alike."""
    k = i % len(items)
    return [*items[k:], *items[:k]]


def mode_params(mode: str, base: GenerationParams) -> GenerationParams:
    """The settings a benchmark mode runs with: one of MODES, or BASELINE (plain llama.cpp),
    or a drafting mode with a draft length of its own after a colon ("draft:3",
    "lookup:8"), so that fixed lengths run beside auto, which keeps the suite's k.
    Raises ValueError naming the mode that is not one."""
    name, colon, length = mode.partition(":")
    if name not in (*MODES, BASELINE):
        raise ValueError(f"no benchmark mode {mode!r}: the modes are {', '.join((BASELINE, *MODES))}, "
                         "and draft, lookup or auto with a draft length, as draft:3")
    if not colon:
        return _with(base, mode="plain" if name == BASELINE else name)
    if name in ("plain", BASELINE) or not length.isdigit() or not 1 <= int(length) <= MAX_DRAFT:
        raise ValueError(f"benchmark mode {mode!r}: only draft, lookup and auto take a draft length, "
                         f"from 1 to {MAX_DRAFT}, as draft:3")
    return _with(base, mode=name, k=int(length))


def run_suite(
    engine,
    prompts: Sequence[Prompt],
    *,
    modes: Sequence[str] = DEFAULT_MODES,
    repeats: int = REPEATS,
    params: GenerationParams | None = None,
    encode: Callable[[str], list[int]],
    baseline: "LlamaCppBaseline | None" = None,
    overhead: bool = False,
    first_replies: bool = False,
    on_result: Callable[[str], None] | None = None,
) -> list[Result]:
    """Run every prompt in every mode `repeats` times, interleaved. `encode`
    turns a prompt into the model's input (the chat template); `baseline` runs
    the `llamacpp` mode (left out without one); `overhead`: also split each
    run's wall time into llama_decode's and the rest (Result.overhead_s);
    `first_replies`: every timed run of an edgespec mode as a new session's first
    reply (Engine.reset(learnt=True)): the draft model reads the prompt afresh and
    auto starts from its priors, as in a new chat, where otherwise the repeats
    find the prompt read and auto taught by the runs before."""
    base = params or GenerationParams(max_tokens=BENCH_MAX_TOKENS)
    settings = {m: mode_params(m, base) for m in modes}
    modes = [m for m in modes if (settings[m].mode != "draft" or engine.has_draft) and (m != BASELINE or baseline)]
    generate = _timed_generate if overhead else _generate

    def run_engine(tokens, p):
        if first_replies:
            engine.reset(learnt=True)
        return generate(engine, tokens, p)

    run = {m: (baseline.generate if m == BASELINE else run_engine) for m in modes}
    results = []
    for prompt in prompts:
        tokens = encode(prompt.prompt)
        for m in modes:  # warm-up: caches, pages
            run[m](tokens, _with(base, mode="plain", max_tokens=8))
        by_mode = {m: Result(prompt.id, prompt.category, m) for m in modes}
        for r in range(repeats):
            runs = {m: run[m](tokens, settings[m]) for m in rotation(modes, r)}
            plain_tps = runs["plain"][1].tokens_per_s if "plain" in runs else None
            cpp_tps = runs[BASELINE][1].tokens_per_s if BASELINE in runs else None
            for m, (out, stats, *split) in runs.items():
                res = by_mode[m]
                res.tokens_per_s.append(stats.tokens_per_s)
                if plain_tps:
                    res.speedup.append(stats.tokens_per_s / plain_tps)
                if cpp_tps:
                    res.vs_llamacpp.append(stats.tokens_per_s / cpp_tps)
                if stats.drafted:
                    res.acceptance.append(stats.acceptance_rate)
                res.tokens_per_pass.append(stats.tokens_per_pass)
                if split and stats.target_passes:
                    res.overhead_s.append(split[0] / stats.target_passes)
                    res.llama_s.append(split[1] / stats.target_passes)
                if base.temperature == 0 and "plain" in runs and out != runs["plain"][0]:
                    res.identical = False
        results.extend(by_mode.values())
        if on_result:
            on_result(format_table(list(by_mode.values()), header=not any(r.prompt != prompt.id for r in results)))
    return results


class LlamaCppBaseline:
    """Plain decoding as a llama-cpp-python user gets it: the high-level `Llama`
    with its defaults (llama.cpp's own kernels and sampler chain), on the same
    model file, context and threads as the engine's target. Timed as the engine
    times itself: the prompt but its last token is read first, untimed; every
    generated token counts, over the time after that."""

    def __init__(self, path: str, *, n_ctx: int, n_threads: int | None, is_eog: Callable[[int], bool],
                 **llama_options):
        """`llama_options` go to `Llama` as they are (none: its defaults)."""
        from llama_cpp import Llama

        from edgespec.llama.backend import sigint_noted

        threads = n_threads or os.cpu_count() or 1
        # Ctrl+C during the load lands in llama.cpp's log callback, where ctypes drops it: noted, raised after
        with sigint_noted() as interrupted:
            self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                             verbose=False, **llama_options)
        if interrupted():
            self.llm.close()
            raise KeyboardInterrupt
        self.is_eog = is_eog

    def generate(self, tokens: Sequence[int], params: GenerationParams, *,
                 keep_cache: bool = False) -> tuple[list[int], Stats]:
        """`keep_cache`: keep what the cache shares with `tokens`, as `Llama.generate`
        does for its users, instead of reading them all again."""
        keep = 0
        if keep_cache:
            keep = self.llm.longest_token_prefix(self.llm.input_ids[:self.llm.n_tokens].tolist(), list(tokens[:-1]))
        self.llm.n_tokens = keep  # eval() writes from here on
        self.llm.eval(list(tokens[keep:-1]))
        if params.seed is not None:
            self.llm.set_seed(params.seed)
        stats = Stats(mode=BASELINE, prompt_tokens=len(tokens))
        out: list[int] = []
        start = time.perf_counter()
        # generate() finds the prompt but its last token already evaluated (prefix match) and reads only that one.
        for token in self.llm.generate(list(tokens), temp=params.temperature, top_k=params.top_k,
                                       top_p=params.top_p, min_p=0.0):
            if self.is_eog(token):
                break
            out.append(token)
            if len(out) >= params.max_tokens:
                break
        stats.decode_s = time.perf_counter() - start
        stats.generated_tokens = stats.target_passes = len(out)
        return out, stats

    def close(self) -> None:
        self.llm.close()


def machine() -> str:
    """The CPU, for people reading figures: they change from machine to machine."""
    return f"{cpu_name()}, {os.cpu_count()} cores"


def _with(params: GenerationParams, **changes) -> GenerationParams:
    return GenerationParams(**{**asdict(params), **changes})


def _generate(engine, tokens, params):
    out, last = [], None
    for last in engine.generate(tokens, params):
        out += last.tokens
    return out, last.stats


def _timed_generate(engine, tokens, params):
    """_generate, and its seconds outside and inside llama_decode (target and draft contexts)."""
    contexts = [seq.ctx for seq in (engine.target_seq, engine.draft_seq) if seq is not None]
    in_llama = -sum(c.decode_s for c in contexts)
    start = time.perf_counter()
    out, stats = _generate(engine, tokens, params)
    wall = time.perf_counter() - start
    in_llama += sum(c.decode_s for c in contexts)
    return out, stats, wall - in_llama, in_llama


def format_table(results: Sequence[Result], *, header: bool = True) -> str:
    """A row per prompt and mode (medians); an overhead column where it was measured."""
    overhead = any(r.overhead_s for r in results)
    lines = []
    if header:
        lines.append(f"{'prompt':<16} {'category':<10} {'mode':<9} {'tok/s':>6} {'vs llama.cpp':>12} "
                     f"{'vs plain':>8} {'accept':>7} {'tok/pass':>8}" + (f" {'overhead/pass':>13}" if overhead else "")
                     + "  same")
    for r in results:
        acc = f"{r.median('acceptance'):.0%}" if r.acceptance else "-"
        cpp = f"{r.median('vs_llamacpp'):.2f}x" if r.vs_llamacpp else "-"
        plain = f"{r.median('speedup'):.2f}x" if r.speedup else "-"
        per_pass = f"{r.median('overhead_s') * 1000:.2f} ms" if r.overhead_s else "-"
        same = "yes" if r.identical else "NO"
        lines.append(f"{r.prompt:<16} {r.category:<10} {r.mode:<9} {r.median('tokens_per_s'):>6.1f} {cpp:>12} "
                     f"{plain:>8} {acc:>7} {r.median('tokens_per_pass'):>8.2f}"
                     + (f" {per_pass:>13}" if overhead else "") + f"  {same}")
    return "\n".join(lines)


def same_note(results: Sequence[Result], *, exact: bool) -> str:
    """Why `same` says NO, where a row does (empty where none does): every token is
    still the target's greedy choice, but a pass over several tokens adds up in
    another order than a single token's (docs/design.md)."""
    differ = sum(not r.identical for r in results)
    if not differ:
        return ""
    head = f"same: NO for {differ} of {len(results)} rows, a reply not token for token plain decoding's. "
    if exact:
        return head + (f"{BASELINE} adds up in llama.cpp's own kernels' order and may flip a near-tie; "
                       "an edgespec mode that differs under exact kernels is a bug worth reporting.")
    return head + ("Each token is still the target's argmax, but a verify pass over several tokens (and "
                   f"{BASELINE}'s own loop) adds up in another order than a single token's pass and may flip a "
                   "near-tie; --exact makes edgespec's modes match plain decoding (docs/design.md).")


def overhead_medians(results: Sequence[Result]) -> tuple[float, float] | None:
    """Medians over every edgespec run: seconds per target pass outside llama_decode
    (edgespec's Python loop) and inside it; None where not measured."""
    outside = [s for r in results for s in r.overhead_s]
    inside = [s for r in results for s in r.llama_s]
    return (statistics.median(outside), statistics.median(inside)) if outside else None


def format_overhead(results: Sequence[Result]) -> str:
    found = overhead_medians(results)
    if found is None:
        return ""
    outside, inside = found
    return (f"edgespec's overhead per target pass (median over runs): {outside * 1000:.2f} ms; "
            f"llama_decode per pass: {inside * 1000:.1f} ms ({outside / inside:.1%} of it)")


def summarize(results: Sequence[Result]) -> str:
    """Per category and mode: geometric mean, worst and best speedup over plain
    llama.cpp (when measured) and over edgespec's plain decoding."""
    lines = [f"{'category':<10} {'mode':<9} {'over':<10} {'geomean':>8} {'worst':>7} {'best':>7}"]
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        for over, name in (("llama.cpp", "vs_llamacpp"), ("plain", "speedup")):
            if getattr(r, name) and r.mode not in ("plain", BASELINE):
                for category in (r.category, "all"):
                    groups.setdefault((category, r.mode, over), []).append(r.median(name))
        if r.mode == "plain" and r.vs_llamacpp:
            groups.setdefault(("all", "plain", "llama.cpp"), []).append(r.median("vs_llamacpp"))
    for (category, mode, over), speedups in sorted(groups.items(), key=lambda g: (g[0][2], g[0][0] == "all")):
        gm = statistics.geometric_mean(speedups)
        lines.append(f"{category:<10} {mode:<9} {over:<10} {gm:>7.2f}x {min(speedups):>6.2f}x {max(speedups):>6.2f}x")
    return "\n".join(lines)


def write_json(results: Sequence[Result], path: str | Path, *, meta: dict | None = None) -> None:
    rows = [{**asdict(r), **{f"median_{k}": r.median(k) for k in ("tokens_per_s", "speedup", "vs_llamacpp",
                                                                  "acceptance")}}
            for r in results]
    _replace(Path(path), json.dumps({"meta": meta or {}, "results": rows}, indent=2).encode())


def _replace(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (workspace.apply.write_atomic), so that a full disk keeps
    the results of an earlier run there as they were; EdgespecError naming the file."""
    from edgespec.workspace.apply import write_atomic

    write_atomic(path, data, str(path),
                 failed=lambda e: f"{path}: cannot write it ({e.strerror or e}); what was there before is kept")


def write_chart(results: Sequence[Result], path: str | Path, *, title: str = "") -> None:
    """A PNG: speedup per prompt (bars per mode) over plain llama.cpp when it was
    measured, else over edgespec's plain decoding; 1.0x marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = list(dict.fromkeys(r.prompt for r in results))
    over_cpp = any(r.vs_llamacpp for r in results)
    name, over = ("vs_llamacpp", "plain llama.cpp") if over_cpp else ("speedup", "plain")
    modes = [m for m in dict.fromkeys(r.mode for r in results) if m != (BASELINE if over_cpp else "plain")]
    fig, ax = plt.subplots(figsize=(max(8, len(prompts) * 0.9), 4.5))
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        values = [next((r.median(name) for r in results if r.prompt == p and r.mode == mode), 0)
                  for p in prompts]
        ax.bar([x + i * width for x in range(len(prompts))], values, width, label=mode)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(prompts))])
    ax.set_xticklabels(prompts, rotation=30, ha="right")
    ax.set_ylabel(f"speedup over {over} (median)")
    ax.set_title(title or f"edgespec vs {over}")
    if modes:  # `--modes plain` compares nothing: no bars, no legend (matplotlib warns of an empty one)
        ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    _replace(Path(path), png.getvalue())
