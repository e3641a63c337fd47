"""The `edgespec` command: argparse entry and subcommands.

The one place that turns errors into messages and exit codes: everything
below raises EdgespecError (or ValueError for bad settings) with a message
written for the user.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from edgespec import __version__
from edgespec.engine.events import MODES, GenerationParams
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Chat with local GGUF models, made faster by lossless speculative decoding. "
        "With no command, opens the chat app.",
    )
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_generate(sub)
    return parser


def _version_text() -> str:
    return f"edgespec {__version__}"


def _cmd_app(args: argparse.Namespace) -> int:
    raise EdgespecError("the chat app is not installed in this build; try `edgespec generate PROMPT`")


# -- shared options --------------------------------------------------------

def add_model_options(p: argparse.ArgumentParser) -> None:
    """--target/--draft/--pair and how to run them (GPU layers, threads, context)."""
    g = p.add_argument_group("models")
    g.add_argument("--pair", metavar="NAME", help="a target + draft pair from the registry (default: the bundled pair)")
    g.add_argument("--target", metavar="PATH_OR_NAME", help="target model: a .gguf path or a registry name")
    g.add_argument("--draft", metavar="PATH_OR_NAME", help="draft model: a .gguf path or a registry name")
    g.add_argument("--no-draft", action="store_true", help="load no draft model (plain or lookup only)")
    g.add_argument("--n-gpu-layers", type=int, default=0, metavar="N", help="target layers on the GPU (-1: all)")
    g.add_argument("--n-gpu-layers-draft", type=int, default=0, metavar="N", help="draft layers on the GPU (-1: all)")
    g.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    g.add_argument("--ctx", type=int, default=4096, metavar="N", help="context size in tokens (default 4096)")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--mode", choices=MODES, default="auto",
                   help="plain: no speculation; draft: the draft model; lookup: prompt lookup; "
                        "auto: whichever pays on this machine (default)")
    g.add_argument("--k", type=int, default=4, metavar="N", help="most tokens drafted per cycle (default 4)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-tokens", type=int, default=512)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        mode=args.mode, k=args.k, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens, stop=tuple(args.stop),
    )


def load_engine(args: argparse.Namespace, *, progress=None):
    """Resolve --pair/--target/--draft to files and load them."""
    from edgespec.engine.runtime import Engine, ModelSettings
    from edgespec.models.fetch import resolve_model, resolve_pair

    if args.target:
        target = resolve_model(args.target, progress=progress)
        draft = resolve_model(args.draft, progress=progress) if args.draft else None
    else:
        target, draft, _ = resolve_pair(args.pair, progress=progress)
        if args.draft:
            draft = resolve_model(args.draft, progress=progress)
    if args.no_draft:
        draft = None
    common = dict(n_ctx=args.ctx, n_threads=args.threads)
    return Engine.load(
        ModelSettings(target, n_gpu_layers=args.n_gpu_layers, **common),
        ModelSettings(draft, n_gpu_layers=args.n_gpu_layers_draft, **common) if draft else None,
    )


# -- generate ----------------------------------------------------------------

def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="one completion, streamed to stdout (headless; for scripts and benchmarks)",
                       description="Generate one reply. The prompt comes from the argument or stdin and is "
                                   "wrapped as one user message with the target's chat template unless --raw.")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt is the model's input")
    p.add_argument("--system", metavar="TEXT", help="a system message (ignored with --raw)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, tokens, flags, statistics")
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        raise EdgespecError("the prompt is empty: pass it as an argument or on stdin")
    params = params_from_args(args)
    with load_engine(args, progress=_stderr_progress()) as engine:
        tokens, stops = _prompt_tokens(engine, prompt, raw=args.raw, system=args.system)
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


def _prompt_tokens(engine, prompt: str, *, raw: bool, system: str | None) -> tuple[list[int], tuple[str, ...]]:
    """The model's input for a one-message chat (or the raw prompt), and the template's stop strings."""
    if raw:
        return engine.tokenize(prompt, add_bos=True, special=False), ()
    from edgespec.chat.template import chat_template

    template = chat_template(engine)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = template.render(messages)
    add_bos = not (template.bos_token and text.startswith(template.bos_token))
    return engine.tokenize(text, add_bos=add_bos, special=True), template.stop


def format_stats(stats) -> str:
    """One line of statistics, as `generate` prints to stderr."""
    parts = [f"{stats.generated_tokens} tokens", f"{stats.tokens_per_s:.1f} tok/s"]
    if stats.drafted:
        parts += [f"acceptance {stats.acceptance_rate:.0%}", f"{stats.tokens_per_pass:.2f} tokens/pass"]
    if stats.ttft_s is not None:
        parts.append(f"first token {stats.ttft_s * 1000:.0f} ms")
    parts.append(f"mode {stats.mode}")
    if stats.reason and stats.mode == "auto":
        parts.append(f"({stats.drafter}: {stats.reason})")
    parts.append(f"stop: {stats.stop_reason}")
    return "[" + ", ".join(parts) + "]"


def _stderr_progress():
    """A download progress callback drawing one line on stderr (only on a terminal)."""
    if not sys.stderr.isatty():
        return None

    def show(p) -> None:
        done, total = getattr(p, "bytes_done", 0), getattr(p, "bytes_total", 0) or 0
        pct = f"{done / total:5.1%}" if total else ""
        sys.stderr.write(f"\r{getattr(p, 'file_name', '')} {pct} {done / 1e6:,.0f}/{total / 1e6:,.0f} MB ")
        if total and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


if __name__ == "__main__":
    sys.exit(main())
