"""The `edgespec` command: argparse entry and subcommands.

The one place that turns errors into messages and exit codes: everything
below raises EdgespecError (or ValueError for bad settings) with a message
written for the user.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable

from edgespec import __version__
from edgespec.bench import BASELINE, DEFAULT_MODES
from edgespec.engine.events import MODES, GenerationParams, stats_line
from edgespec.errors import EdgespecError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = getattr(args, "handler", _cmd_app)
    try:
        return handler(args) or 0
    except (EdgespecError, ValueError) as e:
        print(f"edgespec: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nedgespec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


MODEL_NAMES = "a .gguf path, a registry name or hf:OWNER/REPO/FILE.gguf"
"""How a model may be named wherever the CLI takes one."""

MIN_CTX = 32
"""Smallest --ctx. llama.cpp's batch is never larger than the context asked for,
and a verify pass (up to 17 tokens) and the draft model's 16-token calibration
must each fit in one batch; nor does any chat fit in fewer tokens."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Chat with local GGUF models, made faster by lossless speculative decoding. "
        "With no command, opens the chat app.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show versions and llama.cpp's backend, then exit")
    app = parser.add_argument_group("chat app (no command)")
    _add_model_names(app)
    _add_no_draft(app)
    add_rpc_options(app)
    add_cache_options(app)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_generate(sub)
    _add_bench(sub)
    _add_model_commands(sub)
    _add_chat_commands(sub)
    _add_serve(sub)
    _add_worker(sub)
    return parser


class _VersionAction(argparse.Action):
    """--version: edgespec's version and what llama.cpp was built with (CPU, Metal, CUDA)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from edgespec.llama import system_info

        info = system_info()
        gpu = "GPU offload available" if info["gpu_offload"] else "no GPU offload"
        rpc = "RPC available (edgespec worker, --rpc)" if info["rpc"] else "no RPC (scripts/install.sh builds it)"
        print(f"edgespec {__version__}\nllama-cpp-python {info['llama_cpp_python']}, "
              f"backend {info['backend']} ({gpu}; {rpc})\n{info['system_info']}")
        parser.exit()


def _cmd_app(args: argparse.Namespace) -> int:
    """The chat app; a missing or broken model is shown there (with how to get it), not raised."""
    from edgespec.tui import run_app

    run_app(pair=args.pair, target=args.target, draft=args.draft, no_draft=args.no_draft, rpc=rpc_split(args),
            cache=cache_from_args(args))
    return 0


# -- shared options --------------------------------------------------------

def add_model_options(p: argparse.ArgumentParser) -> None:
    """--target/--draft/--pair and how to run them (GPU layers, threads, context)."""
    g = p.add_argument_group("models")
    _add_model_names(g)
    _add_no_draft(g)
    g.add_argument("--n-gpu-layers", type=int, default=None, metavar="N",
                   help="target layers on the GPU, or with --rpc on the workers and GPUs (-1: all; "
                        "default 0, with --rpc all)")
    g.add_argument("--n-gpu-layers-draft", type=int, default=0, metavar="N", help="draft layers on the GPU (-1: all)")
    g.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    g.add_argument("--ctx", type=_context_size, default=4096, metavar="N",
                   help=f"context size in tokens (default 4096, at least {MIN_CTX})")
    g.add_argument("--exact", action="store_true",
                   help="batch-invariant kernels for the target: greedy speculation then equals plain greedy decoding "
                        "token for token (slower on some machines; verify batches capped at those measured exact)")
    g.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto",
                   help="flash attention (default auto: off where all layers run on the CPU, whose kernel for it "
                        "is slower deep in a conversation, unless the context is so long that the attention "
                        "scores it does without would take too much memory; elsewhere llama.cpp's choice)")
    add_rpc_options(g)
    add_cache_options(g)


def add_cache_options(g) -> None:
    """--parallel, --cache-ram, --cache-disk: conversations held in the KV caches and their snapshots."""
    from edgespec.engine.runtime import SLOTS, CacheSettings

    default = CacheSettings()
    g.add_argument("--parallel", type=_positive, default=None, metavar="N",
                   help=f"conversations held in the KV caches at once (default {SLOTS} where flash attention is on, "
                        "1 where it is off: its kernel attends to every conversation's cells); those let go wait "
                        "in RAM, and coming back to one reads only its new tokens")
    g.add_argument("--cache-ram", type=_non_negative, default=default.ram_mib, metavar="MiB",
                   help=f"host memory for the caches of conversations let go (default {default.ram_mib}; 0: none)")
    g.add_argument("--cache-disk", type=_non_negative, default=default.disk_mib, metavar="MiB",
                   help=f"disk space for them between runs, in edgespec's cache folder (default {default.disk_mib}; "
                        "0: none)")


def cache_from_args(args: argparse.Namespace):
    from edgespec.load import kv_cache

    return kv_cache(parallel=args.parallel, ram_mib=args.cache_ram, disk_mib=args.cache_disk)


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return value


FLASH_ATTN = {"auto": None, "on": True, "off": False}
"""--flash-attn, as ModelSettings.flash_attn takes it."""


def add_rpc_options(g) -> None:
    """--rpc and --tensor-split: the target's layers on llama.cpp RPC workers (`edgespec worker`)."""
    g.add_argument("--rpc", type=_rpc_workers, default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="put the target's offloaded layers on these llama.cpp RPC workers (`edgespec worker` or "
                        "rpc-server) and this machine's GPUs; the draft model stays here")
    g.add_argument("--tensor-split", type=_weights, default=None, metavar="W[,W...]",
                   help="with --rpc: how to weight the devices (the workers' in --rpc order, then local GPUs); "
                        "default: by free memory, as llama.cpp does")
    g.add_argument("--local-output", action="store_true",
                   help="with --rpc: keep the output layer on this machine, so that a pass brings back a hidden "
                        "state per token instead of n_vocab logits (less traffic, more work here)")


def _rpc_workers(text: str):
    from edgespec.llama.rpc import parse_endpoints

    try:
        return parse_endpoints(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 3,1 (got {text!r})") from None
    if any(not 0 <= w < math.inf for w in weights) or not sum(weights) > 0:  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"the weights must be finite numbers, 0 or more, and not all 0 (got {text!r})")
    return weights


def rpc_split(args: argparse.Namespace):
    """--rpc/--tensor-split as a Split for the target (None without --rpc)."""
    from edgespec.llama.rpc import Split

    if (args.tensor_split or args.local_output) and not args.rpc:
        option = "--tensor-split" if args.tensor_split else "--local-output"
        raise ValueError(f"{option} is about the devices of --rpc: pass --rpc HOST:PORT too")
    return Split(args.rpc, args.tensor_split or (), local_output=args.local_output) if args.rpc else None


def _add_model_names(g) -> None:
    g.add_argument("--pair", metavar="NAME", help="a target + draft pair from the registry (default: the bundled pair)")
    g.add_argument("--target", metavar="PATH_OR_NAME", help=f"target model: {MODEL_NAMES}")
    g.add_argument("--draft", metavar="PATH_OR_NAME", help=f"draft model: {MODEL_NAMES}")


def _add_no_draft(g) -> None:
    g.add_argument("--no-draft", action="store_true", help="load no draft model (plain or lookup only)")


def _context_size(text: str) -> int:
    n = int(text)  # argparse reports a ValueError as an invalid value
    if n < MIN_CTX:
        raise argparse.ArgumentTypeError(f"the context must hold at least {MIN_CTX} tokens (got {n}): "
                                         f"a speculative pass must fit in one llama.cpp batch, which is "
                                         f"never larger than the context")
    return n


def add_template_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--template", metavar="FORMAT", help="chat format for a model whose GGUF has no template "
                   "(chatml, llama3, gemma, plain)")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--mode", choices=MODES, default="auto",
                   help="plain: no speculation; draft: the draft model; lookup: prompt lookup; "
                        "auto: whichever pays on this machine (default)")
    g.add_argument("--k", type=int, default=8, metavar="N",
                   help="most tokens drafted per cycle; auto chooses up to this many (default 8)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-tokens", type=int, default=512)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    """The generation parameters, checked as the engine checks them (so that a bad
    value is refused before the models load). A k above what one verify pass
    holds is lowered to that, with a note."""
    from edgespec.engine.runtime import FAST_MAX_BATCH
    from edgespec.engine.sampling import check_params

    params = GenerationParams(
        mode=args.mode, k=args.k, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens, stop=tuple(args.stop),
    )
    check_params(params)
    if params.k > FAST_MAX_BATCH - 1:
        _note(f"--k {params.k}: one verify pass holds at most {FAST_MAX_BATCH - 1} drafted tokens; "
              f"using {FAST_MAX_BATCH - 1}")
        params.k = FAST_MAX_BATCH - 1
    return params


def check_model_options(args: argparse.Namespace) -> None:
    """Check how the models are to run before loading them: threads within the
    cores (more are lowered, with a note), and GPU layers on a build that has a
    GPU backend (else a note, once: everything runs on the CPU)."""
    import os

    from edgespec.llama import system_info

    cores = os.cpu_count() or 1
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1 (leave it out to use all {cores} cores), got {args.threads}")
    if args.threads is not None and args.threads > cores:
        _note(f"--threads {args.threads}: this machine has {cores} cores; using {cores}")
        args.threads = cores
    if args.exact and args.flash_attn == "off":
        raise ValueError("--exact needs flash attention (its Q8_0 KV cache): leave out --flash-attn off")
    if args.n_gpu_layers is None:
        args.n_gpu_layers = -1 if args.rpc else 0  # with workers, every layer goes to them (and local GPUs)
    if ((args.n_gpu_layers and not args.rpc) or args.n_gpu_layers_draft) and not system_info()["gpu_offload"]:
        _note("this llama.cpp build has no GPU backend, so --n-gpu-layers is ignored and the models run on "
              "the CPU. To use the GPU, rebuild llama-cpp-python for it (README, \"Installing for your "
              "hardware\"): CMAKE_ARGS=\"-DGGML_METAL=on\" (Apple Silicon) or CMAKE_ARGS=\"-DGGML_CUDA=on\" "
              "(NVIDIA) pip install --force-reinstall --no-cache-dir llama-cpp-python")


def _note(text: str) -> None:
    print(f"edgespec: note: {text}", file=sys.stderr)


def engine_from_args(args: argparse.Namespace, *, progress=None):
    """Load the models the options name (edgespec.load.load_engine), downloading what is missing."""
    from edgespec.load import load_engine
    from edgespec.models.fetch import resolve_model
    from edgespec.models.registry import DEFAULT_PAIR, load_registry

    def pair_models(name: str) -> tuple[str, str | None]:
        pair = load_registry().pair_or_model(name)
        return pair.target, pair.draft

    check_model_options(args)
    split = rpc_split(args)
    try:
        return load_engine(
            args.target, args.draft, pair=args.pair or DEFAULT_PAIR, no_draft=args.no_draft,
            resolve=lambda name: resolve_model(name, progress=progress), pair_models=pair_models,
            n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
            n_gpu_layers_draft=args.n_gpu_layers_draft, exact=args.exact, rpc=split,
            flash_attn=FLASH_ATTN[args.flash_attn], cache=cache_from_args(args))
    finally:
        if isinstance(progress, ProgressBars):
            progress.close()  # a failed download leaves its bar drawn, and the terminal usable


# -- generate ----------------------------------------------------------------

def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="one completion, streamed to stdout (headless; for scripts and benchmarks)",
                       description="Generate one reply. The prompt comes from the argument or stdin and is "
                                   "wrapped as one user message with the target's chat template unless --raw.")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    add_model_options(p)
    add_sampling_options(p)
    add_template_option(p)
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt is the model's input")
    p.add_argument("--system", metavar="TEXT", help="a system message (ignored with --raw)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, tokens, flags, statistics")
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else _read_stdin()
    if not prompt.strip():
        raise EdgespecError("the prompt is empty: pass it as an argument or on stdin")
    params = params_from_args(args)
    with engine_from_args(args, progress=_stderr_progress()) as engine:
        tokens, stops = _prompt_tokens(engine, prompt, raw=args.raw, system=args.system, template=args.template)
        params.stop += stops
        text, ids, flags, last = [], [], [], None
        chunks = engine.generate(tokens, params)
        try:
            for last in chunks:
                text.append(last.text)
                ids += last.tokens
                flags += last.from_draft
                if not args.json:
                    sys.stdout.write(last.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            chunks.close()
            if last is not None:
                print(f"\n[stopped] {format_stats(last.stats)}", file=sys.stderr)
            return EXIT_INTERRUPTED
    stats = last.stats
    if args.json:
        json.dump({"text": "".join(text), "tokens": ids, "from_draft": flags, "stats": stats.to_dict()},
                  sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(file=sys.stdout)
        print(format_stats(stats), file=sys.stderr)
    return 0


def _read_stdin() -> str:
    """stdin as UTF-8; bytes that are not UTF-8 become U+FFFD, with a note naming the first."""
    stdin = sys.stdin
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        _note(f"stdin is not valid UTF-8 (first bad byte at byte {e.start}); invalid bytes were replaced by U+FFFD")
        return data.decode("utf-8", errors="replace")


# -- bench -------------------------------------------------------------------

def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure speculation against plain decoding on a prompt suite",
                       description="Runs a prompt suite in several modes, interleaved, and prints tokens/s, "
                                   "acceptance and the speedup over plain decoding; writes JSON and a PNG chart.")
    add_model_options(p)
    p.set_defaults(cache_disk=0)  # a benchmark keeps nothing for a later run
    p.add_argument("--prompts", metavar="FILE", help="a prompt suite YAML (default: the shipped one)")
    p.add_argument("--category", action="append", help="only these categories (repeatable)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated (default: all: {','.join(DEFAULT_MODES)}; {BASELINE} is plain llama.cpp "
                        "through llama-cpp-python's Llama, the baseline)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=8, help="most tokens drafted per cycle (default 8)")
    p.add_argument("--out", default="bench-out", metavar="DIR", help="where results.json and speedup.png go")
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec import bench

    prompts = bench.load_prompts(args.prompts, categories=args.category)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "plain" not in modes:
        modes.insert(0, "plain")  # speedups are ratios to plain, measured in the same run
    params = GenerationParams(max_tokens=args.max_tokens, k=args.k)
    with engine_from_args(args, progress=_stderr_progress()) as engine:
        info = engine.describe()
        print(f"backend {info['backend']}; {bench.machine()}; " + "; ".join(
            f"{role} {Path(m['path']).name} ({m['n_gpu_layers']}/{m['n_layer'] + 1} layers on GPU, "
            f"flash attention {m['flash_attn']})"
            for role, m in info["models"].items()))
        if args.rpc:
            from edgespec.engine.runtime import placement_line

            print(f"target {placement_line(info)}")
            if bench.BASELINE in modes:  # llama-cpp-python's Llama would load the whole target here
                _note(f"--rpc: no {bench.BASELINE} row (scripts/bench_rpc.py compares with llama.cpp over RPC)")
                modes.remove(bench.BASELINE)
        baseline = None
        if bench.BASELINE in modes:
            baseline = bench.LlamaCppBaseline(info["models"]["target"]["path"], n_ctx=args.ctx,
                                              n_threads=args.threads, is_eog=engine.is_eog)
        try:
            results = bench.run_suite(
                engine, prompts, modes=modes, repeats=args.repeats, params=params, baseline=baseline,
                encode=lambda text: _prompt_tokens(engine, text, raw=False, system=None, template=None)[0],
                on_result=lambda table: print(table, flush=True),
            )
        finally:
            if baseline is not None:
                baseline.close()
    print()
    print(bench.summarize(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"models": info, "machine": bench.machine(), "repeats": args.repeats, "max_tokens": args.max_tokens,
            "k": args.k}
    bench.write_json(results, out / "results.json", meta=meta)
    bench.write_chart(results, out / "speedup.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'speedup.png'}")
    return 0


def _prompt_tokens(engine, prompt: str, *, raw: bool, system: str | None,
                   template: str | None) -> tuple[list[int], tuple[str, ...]]:
    """The model's input for a one-message chat (or the raw prompt), and the template's stop strings.
    `template`: a built-in format's name instead of the GGUF's own."""
    if raw:
        return engine.tokenize(prompt, add_bos=True, special=False), ()
    from edgespec.chat.template import chat_template

    template = chat_template(engine, template=template)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = template.render(messages)
    return engine.tokenize(text, add_bos=template.needs_bos(text), special=True), template.stop


def format_stats(stats) -> str:
    """The statistics line `generate` prints to stderr: the reply's line, time to
    first token, and in auto mode what was chosen last and why."""
    parts = [stats_line(stats.to_dict())]
    if stats.ttft_s is not None:
        parts.append(f"first token {stats.ttft_s * 1000:.0f} ms")
    if stats.reason and stats.mode == "auto":
        parts.append(f"last choice: {stats.reason}")
    elif stats.reason and stats.mode != "plain" and stats.drafter == "none":
        parts.append(stats.reason)  # a speculative mode that did not speculate says why
    return "[" + " · ".join(parts) + "]"


def _stderr_progress() -> ProgressBars | None:
    """Download/assembly progress bars on stderr (only on a terminal)."""
    return ProgressBars(sys.stderr) if sys.stderr.isatty() else None


class ProgressBars:
    """Draws the `Progress` events of edgespec.models.progress with rich: a bar
    per file and stage (download, assemble, quantize, verify) with bytes, speed
    and time left. Off a terminal, one line when each file's work finishes."""

    def __init__(self, stream) -> None:
        from rich.console import Console

        self.console = Console(file=stream, highlight=False)
        self._bars = None
        self._key: tuple[str, str] | None = None

    def __call__(self, p) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        key = (p.file, p.stage)
        if key != self._key:
            self.close()
            self._key = key
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), TaskProgressColumn(),
                                  DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                  console=self.console)
            self._bars.add_task(f"{p.stage:8s} {p.file}", total=p.total, completed=p.done)
            self._bars.start()
        self._bars.update(self._bars.task_ids[0], completed=p.done, total=p.total)
        if p.finished:
            self.close()

    def close(self) -> None:
        """Leave the current bar drawn as it stands and stop redrawing it."""
        if self._bars is not None:
            self._bars.stop()
        self._bars, self._key = None, None


# -- models, pull, rm, path, check, paths ---------------------------------------

def _add_model_commands(sub) -> None:
    p = sub.add_parser("models", help="the model catalog: models and pairs, sizes, installed or not",
                       description="List the registry's models and pairs: size, where each comes from, "
                                   "whether it is here, and which can draft for which (same vocab).")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(handler=_cmd_models)

    p = sub.add_parser("pull", help="download (or assemble) a model or both models of a pair",
                       description="Get a model's file, or a pair's two files, with progress. "
                                   "Downloads resume; files are checked against their size and sha256.")
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="a model or pair name (see `edgespec models`), or hf:OWNER/REPO/FILE.gguf")
    p.set_defaults(handler=_cmd_pull)

    p = sub.add_parser("rm", help="delete a downloaded or assembled model file",
                       description="Delete the local file of a model (a pair name: both of its models).")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(handler=_cmd_rm)

    p = sub.add_parser("path", help="print the local file of a model (or a pair's two files)",
                       description="Print where a model's file is. Never downloads: a model not here yet "
                                   "is an error that says how to get it.")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(handler=_cmd_path)

    p = sub.add_parser("check", help="can these two models be paired? (reads only the GGUF headers)",
                       description="Read both files' GGUF headers (no weights are loaded) and say whether "
                                   "DRAFT can draft for TARGET, and if not why. Exit status 1 if not.")
    p.add_argument("target", metavar="TARGET", help="a .gguf path or a model name")
    p.add_argument("draft", metavar="DRAFT", help="a .gguf path or a model name")
    p.set_defaults(handler=_cmd_check)

    p = sub.add_parser("paths", help="print edgespec's directories",
                       description="Print where edgespec keeps settings, models, caches and your models.yaml. "
                                   "Set EDGESPEC_HOME to keep everything under one directory.")
    p.set_defaults(handler=_cmd_paths)


def _cmd_models(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from edgespec.models.catalog import model_rows, pair_rows, vocab_groups
    from edgespec.models.progress import human_bytes
    from edgespec.models.registry import load_registry

    registry = load_registry()
    models = model_rows(registry)
    pairs = pair_rows(registry, models)
    if args.json:
        json.dump({"models": [asdict(m) for m in models], "pairs": [asdict(p) for p in pairs],
                   "vocab_groups": vocab_groups(registry)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print("MODELS")
    _print_table(["name", "size", "vocab", "state", "from"],
                 [[m.name + (" (?)" if m.unverified else ""), human_bytes(m.size) if m.size else "?",
                   m.vocab or "-", m.state, m.origin] for m in models])
    print("\nPAIRS (target + draft)")
    _print_table(["name", "target", "draft", "mode/k", "state", "when"],
                 [[p.name + (" *" if p.default else ""), p.target, p.draft or "-", f"{p.mode}/{p.k}",
                   p.state, p.description] for p in pairs])
    print("\n* the default pair.  (?) file name not confirmed on the hub page.")
    print("Same vocab = can draft for each other: "
          + "; ".join(f"{v}: {len(names)} models" for v, names in vocab_groups(registry).items())
          + ". `edgespec check TARGET DRAFT` verifies any two files.")
    todo = sorted({m.hint for m in models if m.hint and m.state != "not downloaded"})
    if todo:
        print("To install: " + "; ".join(todo))
    return 0


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [[h.upper() for h in header], *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def _cmd_pull(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import pull

    bars = ProgressBars(sys.stderr)
    try:
        for name in args.names:
            for entry, path in pull(name, progress=bars):
                print(f"{entry.name}: {path}")
    finally:
        bars.close()
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import remove
    from edgespec.models.registry import load_registry

    registry = load_registry()
    for name in args.names:
        for entry in registry.members(name):
            removed = remove(entry)
            print(f"{entry.name}: removed {removed[0]}" if removed else f"{entry.name}: nothing to remove")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    from edgespec.models.fetch import fetch, is_path_like, resolve_model
    from edgespec.models.registry import load_registry

    if is_path_like(args.name):
        print(resolve_model(args.name, download=False))
        return 0
    registry = load_registry()
    for entry in registry.members(args.name):
        print(fetch(entry, download=False, registry=registry))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from edgespec.engine.compat import ensure_compatible
    from edgespec.models.fetch import resolve_model
    from edgespec.models.gguf_header import read_metadata, read_vocab_info

    infos = []
    for role, name in (("target", args.target), ("draft", args.draft)):
        path = resolve_model(name, download=False)
        meta, vocab = read_metadata(path), read_vocab_info(path)
        infos.append((name, vocab))
        print(f"{role}: {path}")
        print(f"  {meta.get('name') or '?'} | {meta.get('architecture')} | {meta.get('file_type') or '?'} | "
              f"context {meta.get('context_length') or '?'} | vocab {vocab.vocab_type}, {vocab.n_tokens} tokens, "
              f"BOS {vocab.bos}, EOS {vocab.eos}, add BOS {vocab.add_bos}")
    (target_name, target), (draft_name, draft) = infos
    ensure_compatible(target, draft, target_name=target_name, draft_name=draft_name)
    print(f"ok: {draft_name} can draft for {target_name}")
    return 0


def _cmd_paths(args: argparse.Namespace) -> int:
    import os

    from edgespec.config import HOME_ENV, dirs

    d = dirs()
    hub = d.hub_cache
    if hub is None:
        from huggingface_hub import constants

        hub = constants.HF_HUB_CACHE
    rows = [["config", d.config], ["user models.yaml", d.user_registry], ["data", d.data],
            ["models", d.models], ["cache", d.cache], ["HF cache (read)", hub]]
    for label, path in rows:
        print(f"{label + ':':20s} {path}")
    home = os.environ.get(HOME_ENV)
    print(f"({HOME_ENV}={home})" if home else f"(set {HOME_ENV} to keep all of these under one directory)")
    return 0


# -- chat, chats, export, import -------------------------------------------------

def _add_chat_commands(sub) -> None:
    p = sub.add_parser("chat", help="continue a stored conversation headlessly",
                       description="Send a message to a stored conversation (default: the latest) and stream "
                                   "the reply to stdout. Without --once, reads messages from stdin, one per line. "
                                   "The conversation's models are used again unless --pair/--target is given.")
    p.add_argument("--once", metavar="MESSAGE", help="send this one message, print the reply, exit")
    p.add_argument("--conversation", type=int, metavar="ID", help="conversation to continue (see `edgespec chats`)")
    p.add_argument("--new", action="store_true", help="start a new conversation")
    p.add_argument("--system", metavar="TEXT", help="system prompt of a new conversation")
    add_template_option(p)
    p.add_argument("--stats", action="store_true", help="print each reply's statistics to stderr")
    add_model_options(p)
    add_sampling_options(p)
    p.set_defaults(handler=_cmd_chat)

    p = sub.add_parser("chats", help="list stored conversations, most recent first")
    p.add_argument("--search", metavar="TEXT", help="only those whose title or messages contain TEXT")
    p.set_defaults(handler=_cmd_chats)

    p = sub.add_parser("export", help="print a stored conversation as Markdown or JSON")
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("--format", choices=("md", "json"), default="md")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(handler=_cmd_export)

    p = sub.add_parser("import", help="store a conversation exported as JSON (`edgespec export ID --format json`)")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(handler=_cmd_import)


def _cmd_chat(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec.chat import ChatSession

    params = params_from_args(args)
    store = _open_store()
    cid = None if args.new else (args.conversation or store.latest())
    stored = store.settings(cid) if cid is not None else {}
    if not (args.pair or args.target) and stored.get("target") and Path(stored["target"]).exists():
        args.target = stored["target"]  # the models the conversation was held with
        if not args.draft and stored.get("draft") and Path(stored["draft"]).exists():
            args.draft = stored["draft"]
    template = args.template or (stored.get("template") if stored.get("template") not in (None, "gguf") else None)
    with engine_from_args(args, progress=_stderr_progress()) as engine:
        name = Path(engine.describe()["models"]["target"]["path"]).name
        session = ChatSession(engine, store=store, conversation_id=cid, system_prompt=args.system,
                              params=params, template=template, model_name=name,
                              on_wait=lambda: _note("another edgespec is replying in this conversation; waiting for "
                                                    "its reply to finish (Ctrl+C gives up)"))
        for text in [args.once] if args.once is not None else _stdin_lines():
            last = None
            for last in session.send(text):
                sys.stdout.write(last.text)
                sys.stdout.flush()
            print()
            if last is not None and (args.stats or last.stats.dropped_messages):
                dropped = last.stats.dropped_messages
                note = f" (the {dropped} oldest messages were left out to fit the context)" if dropped else ""
                print(format_stats(last.stats) + note, file=sys.stderr)
    print(f"[conversation {session.conversation_id}]", file=sys.stderr)
    return 0


def _open_store():
    """The conversation store; what opening it needed telling (a damaged file moved aside) goes to stderr."""
    from edgespec.chat import ConversationStore

    store = ConversationStore()
    if store.notice:
        _note(store.notice)
    return store


def _stdin_lines():
    while True:
        if sys.stdin.isatty():
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")


def _cmd_chats(args: argparse.Namespace) -> int:
    rows = [[str(c.id), f"{c.updated:%Y-%m-%d %H:%M}", str(c.n_messages), c.title]
            for c in _open_store().list(search=args.search)]
    if rows:
        _print_table(["id", "updated", "messages", "title"], rows)
    else:
        print("no conversations" + (f" matching {args.search!r}" if args.search else ""), file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    store = _open_store()
    if args.format == "json":
        text = json.dumps(store.export_json(args.id), ensure_ascii=False, indent=2) + "\n"
    else:
        text = store.export_markdown(args.id)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise EdgespecError(f"cannot write {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edgespec.chat import StoreError

    try:
        data = json.loads(Path(args.file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot read {args.file}: {e}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise StoreError(f"cannot read {args.file}: its JSON is nested too deeply to be an edgespec export") from None
    print(f"imported as conversation {_open_store().import_json(data)}")
    return 0


# -- serve -----------------------------------------------------------------------

API_KEY_ENV = "EDGESPEC_API_KEY"


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP API for editors and scripts",
                       description="Load the models once and serve the OpenAI API (/v1/chat/completions, "
                                   "/v1/completions, /v1/models) with speculation underneath. The sampling options "
                                   "are the defaults for requests that leave them out. Ctrl+C stops it.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8080, help="default 8080")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; a key given here is "
                        "visible to other users in `ps`)")
    p.add_argument("--insecure-no-api-key", action="store_true",
                   help="allow a non-loopback --host with no API key: anyone who can reach the port can use it")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN call the API (repeatable; default: none)")
    add_template_option(p)
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    add_model_options(p)
    add_sampling_options(p)
    p.set_defaults(handler=_cmd_serve, max_tokens=None)  # no limit asked for: until the context is full


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    try:
        from edgespec import server
    except ImportError as e:
        raise EdgespecError(f"`edgespec serve` needs the serve extra ({e.name} is missing): "
                            "pip install 'edgespec[serve]', or run scripts/install.sh") from None

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    warning = server.check_exposure(args.host, api_key=api_key, allow_no_key=args.insecure_no_api_key)
    if warning:
        print(f"\n{'!' * 78}\n{warning}\n{'!' * 78}\n", file=sys.stderr)
    model_id = _served_model_id(args)
    settings = server.ServerSettings(
        model_id=model_id, api_key=api_key, defaults=params_from_args(args), max_tokens=args.max_tokens,
        template=args.template, cors_origins=tuple(args.cors_origin))
    sock = server.bind(args.host, args.port)
    base = server.url(sock) + "/v1"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log = logging.getLogger("edgespec.server")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    app = server.create_app(lambda: engine_from_args(args, progress=_stderr_progress()), settings)
    print(f"edgespec serve: loading {model_id} ...", file=sys.stderr)
    server.run(app, sock, verbose=args.verbose, on_ready=lambda: print(
        f"edgespec serve: ready at {base} (model \"{model_id}\"{', API key required' if api_key else ''}); "
        "Ctrl+C stops it", file=sys.stderr, flush=True))
    print("edgespec serve: stopped", file=sys.stderr)
    return 0


def _served_model_id(args: argparse.Namespace) -> str:
    """The name clients ask for: the pair's (or the target's) registry name, or a file's stem."""
    from pathlib import Path

    from edgespec.models.fetch import is_path_like
    from edgespec.models.registry import DEFAULT_PAIR, HUB_PREFIX

    if args.target:
        named = not (is_path_like(args.target) or args.target.startswith(HUB_PREFIX))
        return args.target if named else Path(args.target).stem
    return args.pair or DEFAULT_PAIR


# -- worker ------------------------------------------------------------------------

def _add_worker(sub) -> None:
    from edgespec.llama.rpc import DEFAULT_PORT

    p = sub.add_parser("worker", help="serve this machine's CPU or GPU to another edgespec (llama.cpp RPC)",
                       description="Run llama.cpp's RPC server: another machine's `edgespec --rpc HOST:PORT` then "
                                   "keeps some of its target's layers here. llama.cpp's RPC has no authentication "
                                   "and no encryption: anyone who reaches the port can use this machine's devices "
                                   "and memory. Ctrl+C stops it.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --allow-remote)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host: anyone who can reach the port can use the worker "
                        "(only on a network you trust)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    p.add_argument("--device", metavar="NAME[,NAME...]", default=None,
                   help="devices to serve (default: the GPUs, else the CPU); --list-devices names them")
    p.add_argument("--list-devices", action="store_true", help="list this machine's devices and exit")
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="keep the tensors clients send in DIR, so that a reload sends hashes instead of weights")
    p.set_defaults(handler=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    import os
    import socket
    import time

    from edgespec.llama import rpc
    from edgespec.models.progress import human_bytes

    if args.list_devices:
        for _, d in rpc.local_devices():
            print(f"{d.name}: {d.description} ({d.kind}, {human_bytes(d.free)} free of {human_bytes(d.total)})")
        return 0
    warning = check_worker_exposure(args.host, allow_remote=args.allow_remote)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be from 1 to 65535, got {args.port}")
    if not rpc.available():
        rpc.require()  # raises with how to get a build that has it
    devices = rpc.worker_devices(args.device.split(",") if args.device else None)
    threads = args.threads or os.cpu_count() or 1
    endpoint = rpc.Endpoint(args.host, args.port)
    try:  # ggml-rpc only says "Failed to create server socket": find out why first
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as e:
        raise EdgespecError(f"cannot listen on {endpoint}: {e.strerror or e}") from None
    if warning:
        print(f"\n{'!' * 78}\n{warning}\n{'!' * 78}\n", file=sys.stderr)
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    for _, d in devices:
        print(f"edgespec worker: serving {d.name} ({d.description}, {d.kind}): {human_bytes(d.free)} free of "
              f"{human_bytes(d.total)}", file=sys.stderr)
    thread = rpc.start_server(endpoint, devices, n_threads=threads, cache_dir=args.cache)
    cache = f", cache {args.cache}" if args.cache else ""
    print(f"edgespec worker: listening on {endpoint} ({threads} threads{cache}); use it with --rpc {endpoint}. "
          "Ctrl+C stops it", file=sys.stderr, flush=True)
    while thread.is_alive():
        thread.join(0.5)
    time.sleep(0.1)
    raise EdgespecError(f"the RPC server on {endpoint} stopped (see llama.cpp's message above)")


def check_worker_exposure(host: str, *, allow_remote: bool) -> str | None:
    """Refuse a non-loopback address without --allow-remote; with it, the warning to print."""
    from edgespec.llama.rpc import is_loopback

    if is_loopback(host):
        return None
    if not allow_remote:
        raise EdgespecError(f"refusing to listen on {host}: llama.cpp's RPC has no authentication and no "
                            "encryption, so anyone who can reach the port could use this machine's devices and "
                            "memory. Pass --allow-remote to do it anyway, on a network you trust")
    return (f"WARNING: the worker listens on {host}. llama.cpp's RPC has NO authentication and NO encryption:\n"
            "anyone who can reach this port can use this machine's devices and memory, and read what it computes.\n"
            "Only do this on a network you trust, or behind a firewall / SSH tunnel.")


if __name__ == "__main__":
    sys.exit(main())
