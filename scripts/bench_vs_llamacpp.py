#!/usr/bin/env python3
"""edgespec's draft-model loop against llama.cpp's own C++ loop, side by side.

Runs `llama-speculative-simple` (llama.cpp's example of the same algorithm:
draft k tokens with the draft model, verify them in one target batch, keep the
agreeing prefix) and `edgespec --mode draft` on the same prompts, the same
GGUF pair, k, p_min, threads and kernels, alternating which goes first, and
prints tokens/s for both and their ratio per prompt.

Both count decode speed the same way: every generated token over the time
after the prompt (all but its last token) is in the caches. edgespec runs a
warm-up first so that its draft model's cache holds the prompt too, as the C++
example's does before its clock starts.

Build the C++ example from the llama.cpp that llama-cpp-python vendors (same
version as edgespec's bindings), with the CMAKE_ARGS scripts/install.sh uses:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sd
    tar xzf /tmp/sd/llama_cpp_python-0.3.36.tar.gz -C /tmp/sd
    cmake -S /tmp/sd/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/cppbuild \\
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF $CMAKE_ARGS
    cmake --build /tmp/cppbuild -j2 --target llama-speculative-simple
    .venv/bin/python scripts/bench_vs_llamacpp.py --bin /tmp/cppbuild/bin/llama-speculative-simple

Kernels: by default both run llama.cpp's default kernels; --exact runs both
with edgespec's exact settings (no weight repacking, Q8_0 KV caches, flash
attention) for target and draft.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from edgespec.bench import load_prompts
from edgespec.chat.template import chat_template
from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import Engine, ModelSettings
from edgespec.models.fetch import resolve_model, resolve_pair

PROMPT_IDS = ("chat", "explain", "write-function", "add-docstrings", "reformat-json", "rename-variable")


def cpp_command(args, target: Path, draft: Path, prompt: str) -> list[str]:
    # -p, not -f: llama.cpp drops a prompt file's last newline, and a chat
    # template's prompt ends with one.
    cmd = [
        args.bin, "-m", str(target), "-md", str(draft), "-p", prompt,
        "-n", str(args.max_tokens), "--temp", "0", "--top-k", "1", "-c", str(args.ctx),
        "-t", str(args.threads), "-tb", str(args.threads), "-td", str(args.threads),
        "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.k), "--spec-draft-n-min", "0",
        "--spec-draft-p-min", str(args.p_min),
        "-ngl", "0", "-ngld", "0",
    ]
    if args.exact:
        cmd += ["--no-repack", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-ctkd", "q8_0", "-ctvd", "q8_0"]
    return cmd


def run_cpp(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = proc.stdout + proc.stderr
    found = {
        "encoded": re.search(r"encoded\s+(\d+) tokens", log),
        "tps": re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log),
        "drafted": re.search(r"n_drafted\s*=\s*(\d+)", log),
        "accepted": re.search(r"n_accept\s*=\s*(\d+)", log),
    }
    if proc.returncode != 0 or not all(found.values()):
        sys.exit(f"llama-speculative-simple failed (exit {proc.returncode}):\n{log[-3000:]}")
    return {
        "prompt_tokens": int(found["encoded"].group(1)),
        "tokens": int(found["tps"].group(1)),
        "tokens_per_s": float(found["tps"].group(3)),
        "drafted": int(found["drafted"].group(1)),
        "accepted": int(found["accepted"].group(1)),
    }


def run_edgespec(engine: Engine, tokens: list[int], params: GenerationParams) -> dict:
    last = None
    for last in engine.generate(tokens, params):
        pass
    s = last.stats
    return {"tokens": s.generated_tokens, "tokens_per_s": s.tokens_per_s, "drafted": s.drafted, "accepted": s.accepted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="path to llama.cpp's llama-speculative-simple")
    parser.add_argument("--target", help="target GGUF (default: the bundled pair)")
    parser.add_argument("--draft", help="draft GGUF (default: the bundled pair)")
    parser.add_argument("--prompts", default=",".join(PROMPT_IDS), help="ids from the shipped suite")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--p-min", type=float, default=GenerationParams.p_min)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--exact", action="store_true", help="edgespec's exact kernels for both")
    args = parser.parse_args()

    if args.target:
        target, draft = Path(resolve_model(args.target)), Path(resolve_model(args.draft))
    else:
        target, draft, _ = resolve_pair(None)
        target, draft = Path(target), Path(draft)
    common = dict(n_ctx=args.ctx, n_threads=args.threads, exact=args.exact)
    wanted = args.prompts.split(",")
    prompts = [p for p in load_prompts() if p.id in wanted]
    params = GenerationParams(mode="draft", k=args.k, p_min=args.p_min, max_tokens=args.max_tokens)
    kernels = "exact (no repack, Q8_0 KV, flash attention)" if args.exact else "llama.cpp defaults"
    print(f"{target.name} / {draft.name}; k={args.k}, p_min={args.p_min}, {args.threads} threads, "
          f"{args.max_tokens} tokens, greedy; kernels: {kernels}")
    print(f"{'prompt':<16} {'C++ tok/s':>9} {'ours tok/s':>10} {'ratio':>6}   {'C++ accept':>10} {'ours accept':>11}")
    ratios = []
    # Engine.load, not load_engine: the draft takes exact kernels too (as the C++ side's -ctkd/-ctvd q8_0),
    # and nothing is offloaded (as its -ngl 0 -ngld 0).
    with Engine.load(ModelSettings(target, **common), ModelSettings(draft, **common)) as engine:
        template = chat_template(engine)
        for prompt in prompts:
            text = template.render([{"role": "user", "content": prompt.prompt}])
            tokens = engine.tokenize(text, special=True)
            cmd = cpp_command(args, target, draft, text)
            run_edgespec(engine, tokens, params)  # warm-up: both caches hold the prompt
            cpp, ours = [], []
            for r in range(args.repeats):
                if r % 2 == 0:
                    cpp.append(run_cpp(cmd))
                    ours.append(run_edgespec(engine, tokens, params))
                else:
                    ours.append(run_edgespec(engine, tokens, params))
                    cpp.append(run_cpp(cmd))
            if cpp[0]["prompt_tokens"] != len(tokens):
                sys.exit(f"{prompt.id}: C++ tokenized the prompt to {cpp[0]['prompt_tokens']} tokens, "
                         f"edgespec to {len(tokens)}")
            ratio = statistics.median(o["tokens_per_s"] / c["tokens_per_s"] for o, c in zip(ours, cpp))
            ratios.append(ratio)

            def accept(runs):
                return f"{sum(r['accepted'] for r in runs) / max(1, sum(r['drafted'] for r in runs)):.0%}"

            print(f"{prompt.id:<16} {statistics.median(c['tokens_per_s'] for c in cpp):>9.2f} "
                  f"{statistics.median(o['tokens_per_s'] for o in ours):>10.2f} {ratio:>5.2f}x   "
                  f"{accept(cpp):>10} {accept(ours):>11}", flush=True)
    print(f"geomean ratio (edgespec / llama.cpp): {statistics.geometric_mean(ratios):.3f}x "
          f"(median of {args.repeats} paired runs per prompt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
