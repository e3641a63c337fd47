"""`edgespec generate` (one completion) and `edgespec bench` (a prompt suite, mode against mode)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path

from edgespec.bench import BASELINE, DEFAULT_MODES, REPEATS
from edgespec.config import expand_home
from edgespec.cli.bars import stderr_progress
from edgespec.cli.options import (add_limited, add_model_options, add_sampling_options, add_template_option, decoded,
                                  engine_from_args, model_text, params_from_args, positive)
from edgespec.cli.files import add_file_options, apply_edits, home_path, workspace_from_args
from edgespec.cli.output import stderr_stats, note
from edgespec.cli.signals import unwinding
from edgespec.engine.events import GenerationParams
from edgespec.limits import BENCH_MAX_TOKENS
from edgespec.errors import EXIT_INTERRUPTED, ContextFullError, EdgespecError


def add_parsers(sub) -> None:
    """`generate` and `bench`, on the subparsers of the `edgespec` parser."""
    _add_generate(sub)
    _add_bench(sub)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="one completion, streamed to stdout (headless; for scripts and benchmarks)",
                       description="Generate one reply. The prompt comes from the argument or stdin and is "
                                   "wrapped as one user message with the target's chat template unless --raw.")
    p.add_argument("prompt", nargs="?", type=model_text("the prompt"), help="the prompt (default: read stdin)")
    add_model_options(p)
    add_sampling_options(p)
    add_template_option(p)
    p.add_argument("--raw", action="store_true",
                   help="no chat template: the prompt is the model's input, special texts (<|im_end|>) its markers")
    p.add_argument("--system", metavar="TEXT", type=model_text("--system"), help="a system message (ignored with --raw)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: text, tokens, flags, the context size (n_ctx), statistics")
    add_file_options(p)
    p.add_argument("--apply", action="store_true",
                   help="show the reply's changes to the attached files as a diff and write them (asks first)")
    p.add_argument("--yes", action="store_true", help="with --apply: write without asking (for scripts)")
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from edgespec.chat import attachments as files
    from edgespec.chat.prompt import PromptEncoder, encode_prompt
    from edgespec.chat.session import reply_room

    prompt = args.prompt if args.prompt is not None else _read_stdin()
    if not prompt.strip():
        raise EdgespecError("the prompt is empty: pass it as an argument or on stdin")
    if (args.file or args.apply) and args.raw:
        raise EdgespecError("--file and --apply need the chat template: leave out --raw")
    if args.apply and not args.file:
        raise EdgespecError("--apply writes changes to attached files: attach them with --file")
    workspace = workspace_from_args(args) if args.file else None
    messages = _messages(prompt, args.system, files.read_files(workspace, args.file)) if workspace else None
    params = params_from_args(args)
    with engine_from_args(args, progress=stderr_progress()) as engine, unwinding():
        n_ctx = engine.n_ctx
        model = Path(engine.describe().target.path).name  # as a template's errors name it
        for text in (prompt, args.system or ""):
            _refuse_past_context(engine, text)
        if messages is not None:
            files.check_fit(messages[-1].attachments, engine, reply_room(params.max_tokens, n_ctx))
            encoded = PromptEncoder(engine, template=args.template, model=model).encode(files.model_messages(messages))
        else:
            encoded = encode_prompt(engine, prompt, raw=args.raw, system=args.system, template=args.template,
                                    model=model)
        params.stop += encoded.stop
        text, ids, flags, last = [], [], [], None
        chunks = engine.generate(encoded.tokens, params, regions=encoded.regions)
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
                print(f"\n[stopped] {stderr_stats(last.stats)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            chunks.close()  # before the engine closes, whatever ended the loop (a reader gone from stdout)
    stats = last.stats
    if args.json:
        json.dump({"text": "".join(text), "tokens": ids, "from_draft": flags, "n_ctx": n_ctx, "stats": stats.to_dict()},
                  sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(file=sys.stdout)
        print(stderr_stats(stats), file=sys.stderr)
    if args.apply:
        edits = files.pending_edits("".join(text), messages, workspace=workspace)
        if not edits:
            raise EdgespecError("the reply changes none of the attached files; nothing was applied")
        apply_edits(edits, workspace, yes=args.yes, out=sys.stderr if args.json else None)
    return 0


def _refuse_past_context(engine, text: str) -> None:
    """Raise ContextFullError when `text` is so long that it cannot fit whatever its tokens
    (session.TOKEN_CHARS_MAX): all of a prompt of hundreds of megabytes (`cat big.log |
    edgespec generate`) took minutes and gigabytes to tokenize, with Ctrl+C waiting on
    llama.cpp's tokenizer, only to be refused."""
    from edgespec.chat.session import TOKEN_CHARS_MAX

    at_least = len(text) // TOKEN_CHARS_MAX
    if at_least >= engine.n_ctx:
        raise ContextFullError(f"the prompt is at least {at_least} tokens ({len(text)} characters) but the "
                               f"context holds {engine.n_ctx}: shorten it or raise the context size")


def _messages(prompt: str, system: str | None, attached: list) -> list:
    from edgespec.chat.store import Message

    return [*([Message("system", system)] if system else []), Message("user", prompt, attachments=attached)]


def _read_stdin() -> str:
    """stdin as UTF-8; bytes that are not UTF-8 become U+FFFD, with a note naming the first.
    A terminal is told how to end the prompt: a command waiting on it silently looks hung."""
    stdin = sys.stdin
    if stdin.isatty():
        note(f"reading the prompt from the terminal: end it with {'Ctrl+Z, Enter' if os.name == 'nt' else 'Ctrl+D'}"
             " on a line of its own, or pass it as an argument")
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "surrogateescape")
    return decoded(data, "stdin")


def models_line(info) -> str:
    """Where each model runs, for the top of a benchmark: the layers a GPU (or a worker)
    holds, as llama.cpp placed them, not as many as were asked for (a CPU build holds none),
    and how much of its memory is in huge pages (the system may have given none)."""

    def offloaded(m) -> int:
        if m.layers:
            return sum(run.layers for run in m.layers if run.device != "CPU")
        return m.n_gpu_layers if info.gpu_offload or info.workers else 0  # llama.cpp did not say where

    def huge(m) -> str:
        return f", {m.huge_pages_mib} MiB in huge pages" if m.huge_pages_mib else ""

    return "; ".join(f"{role} {Path(m.path).name} ({offloaded(m)}/{m.n_layer + 1} layers on GPU, "
                     f"flash attention {m.flash_attn}{huge(m)})" for role, m in info.models.items())


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure speculation against plain decoding on a prompt suite",
                       description="Runs a prompt suite in several modes, interleaved, and prints tokens/s, "
                                   "acceptance and the speedup over plain decoding; writes JSON and a PNG chart.")
    add_model_options(p)
    p.set_defaults(cache_disk=0, lookup_pool=0)  # a benchmark keeps nothing for a later run, nor drafts from earlier ones
    add_template_option(p)
    p.add_argument("--prompts", metavar="FILE", type=home_path("--prompts"), help="a prompt suite YAML (default: the shipped one)")
    p.add_argument("--category", action="append", help="only these categories (repeatable)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated (default: all: {','.join(DEFAULT_MODES)}; {BASELINE} is plain llama.cpp "
                        "through llama-cpp-python's Llama, the baseline); a drafting mode may carry its own "
                        "draft length, as draft:3 or lookup:8, to run beside auto at --k")
    p.add_argument("--repeats", type=positive, default=REPEATS, metavar="N",
                   help=f"runs of each prompt in each mode, interleaved; speedups are their medians "
                        f"(default {REPEATS})")
    p.add_argument("--max-tokens", type=int, default=BENCH_MAX_TOKENS, help=f"default {BENCH_MAX_TOKENS}")
    add_limited(p, "k", int, metavar="N")
    p.add_argument("--overhead", action="store_true",
                   help="also split each run's time into llama_decode's and the rest: edgespec's own work per "
                        "target pass (its Python loop)")
    p.add_argument("--first-replies", action="store_true",
                   help="time every edgespec run as a new chat's first reply: the draft model reads the prompt "
                        "afresh and auto starts from its priors (the calibration kept), where otherwise each "
                        "repeat finds them ready from the runs before")
    p.add_argument("--out", default="bench-out", metavar="DIR", help="where results.json and speedup.png go")
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from edgespec import bench
    from edgespec.chat.prompt import encode_prompt
    from edgespec.engine.sampling import check_params

    prompts = bench.load_prompts(args.prompts, categories=args.category)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "plain" not in modes:
        modes.insert(0, "plain")  # speedups are ratios to plain, measured in the same run
    params = GenerationParams(max_tokens=args.max_tokens, k=args.k)
    check_params(params)
    for mode in modes:  # a mode that is not one is said before the models load
        bench.mode_params(mode, params)
    out = _out_folder(args.out)  # a folder the results cannot go in is said now, not after the run
    with engine_from_args(args, progress=stderr_progress()) as engine:
        info = engine.describe()
        model = Path(info.target.path).name  # as a template's errors name it
        print(f"backend {info.backend}; {bench.machine()}; {models_line(info)}")
        if args.rpc:
            from edgespec.chat.words import placement_line

            print(f"target {placement_line(info)}")
            if bench.BASELINE in modes:  # llama-cpp-python's Llama would load the whole target here
                note(f"--rpc: no {bench.BASELINE} row (scripts/bench_rpc.py compares with llama.cpp over RPC)")
                modes.remove(bench.BASELINE)
        baseline = None
        if bench.BASELINE in modes:
            baseline = bench.LlamaCppBaseline(info.target.path, n_ctx=engine.n_ctx,
                                              n_threads=args.n_threads, is_eog=engine.is_eog)
        try:
            results = bench.run_suite(
                engine, prompts, modes=modes, repeats=args.repeats, params=params, baseline=baseline,
                encode=lambda text: encode_prompt(engine, text, template=args.template, model=model).tokens,
                overhead=args.overhead,
                first_replies=args.first_replies,
                on_result=lambda table: print(table, flush=True),
            )
        finally:
            if baseline is not None:
                baseline.close()
    print()
    print(bench.summarize(results))
    if note_text := bench.same_note(results, exact=args.exact):
        print(textwrap.fill(note_text, width=100))
    if args.overhead:
        print(bench.format_overhead(results))
    meta = {"models": dataclasses.asdict(info), "machine": bench.machine(), "repeats": args.repeats,
            "max_tokens": args.max_tokens, "k": args.k, "first_replies": args.first_replies}
    bench.write_json(results, _made(out) / "results.json", meta=meta)
    bench.write_chart(results, out / "speedup.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'speedup.png'}")
    return 0


def _out_folder(path: str) -> Path:
    """The folder --out names, checked but not made: a run that fails before its results are
    written leaves no folder the user did not have. EdgespecError where it is not a folder, or
    the nearest folder above it that exists is one it cannot be made in."""
    out = expand_home(path, what="--out")
    there = next(p for p in (out, *out.parents) if p.exists())
    if not there.is_dir():
        raise EdgespecError(f"--out {out}: cannot keep the results there "
                            f"({'it' if there == out else there} is not a folder)")
    if not os.access(there, os.W_OK | os.X_OK):
        raise EdgespecError(f"--out {out}: cannot keep the results there (no permission to write in {there})")
    return out


def _made(out: Path) -> Path:
    """`out` (checked by _out_folder) made, once there are results to keep in it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EdgespecError(f"--out {out}: cannot keep the results there ({e.strerror or e})") from None
    return out
