"""Time to first token over a 10-turn chat: KV-cache reuse versus evaluating from scratch.

    python scripts/bench_chat_turns.py                       # the bundled default pair's target
    python scripts/bench_chat_turns.py --model ~/m/x.gguf --template chatml
    python scripts/bench_chat_turns.py --mode draft          # with the pair's draft model

Pass 1 holds the conversation with a ChatSession (each turn reuses the caches);
pass 2 replays every turn's exact prompt after Engine.reset(), i.e. what a chat
without reuse would pay. With reuse, tokens evaluated per turn stay at the size
of the new message; from scratch they grow with the conversation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _common import Recorder, load
from edgespec.chat import ChatSession
from edgespec.engine.events import GenerationParams
from edgespec.errors import EdgespecError
from edgespec.models.fetch import is_path_like

QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Now make it ignore spaces and punctuation.",
    "Add type hints and a docstring.",
    "Write two pytest tests for it.",
    "How would I do the same in JavaScript?",
    "What is the time complexity?",
    "Can you make it recursive?",
    "What is the risk of recursion for very long strings?",
    "Rewrite it with two pointers instead.",
    "Summarise the versions we wrote, one line each.",
]


def first_token_from_scratch(engine, prompt: list[int], params: GenerationParams) -> tuple[int, float]:
    """(tokens evaluated, seconds to the first token) with empty caches."""
    engine.reset()
    t0 = time.perf_counter()
    stream = engine.generate(prompt, params)
    try:
        for chunk in stream:
            if chunk.tokens or chunk.finish_reason:
                return chunk.stats.prompt_evaluated, time.perf_counter() - t0
    finally:
        stream.close()
    raise RuntimeError("the engine produced nothing")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="pair or model name, or a GGUF path (default: the bundled pair)")
    ap.add_argument("--mode", default="plain", help="plain | lookup | draft | auto (default plain)")
    ap.add_argument("--template", help="built-in chat format, for a GGUF without a template")
    ap.add_argument("--turns", type=int, default=len(QUESTIONS))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--gpu-layers", type=int, default=0)
    args = ap.parse_args(argv)
    path = args.model and is_path_like(args.model)
    try:
        engine = load(args.model if path else None, pair=None if path else args.model,
                      no_draft=args.mode not in ("draft", "auto"), n_ctx=args.ctx,
                      n_gpu_layers=args.gpu_layers, n_gpu_layers_draft=args.gpu_layers)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    params = GenerationParams(mode=args.mode, max_tokens=args.max_tokens, temperature=0.0)
    with engine:
        info = engine.describe()
        target = Path(info.target.path)
        print(" + ".join(Path(m.path).name for m in info.models.values())
              + f", mode {args.mode}, {info.backend}, n_ctx {engine.n_ctx}")
        recorder = Recorder(engine)
        chat = ChatSession(recorder, template=args.template, params=params, model_name=target.name,
                           system_prompt="You are a concise coding assistant.")
        list(engine.generate(engine.tokenize("warm up", add_bos=True),
                             GenerationParams(mode="plain", max_tokens=2)))
        reuse = []
        for question in QUESTIONS[:args.turns]:
            for _ in chat.send(question):
                pass
            s = chat.messages[-1].stats
            reuse.append((s.prompt_tokens, s.prompt_evaluated, s.ttft_s, s.generated_tokens, s.dropped_messages))
        scratch = [first_token_from_scratch(engine, p, params) for p in recorder.prompts]

    print(f"{'turn':>4} {'prompt':>7} {'reply':>6} | {'evaluated':>9} {'TTFT ms':>8} | "
          f"{'scratch eval':>12} {'TTFT ms':>8} | {'ratio':>6}")
    for turn, ((n, ev, ttft, out, dropped), (ev0, ttft0)) in enumerate(zip(reuse, scratch), 1):
        note = f"  ({dropped} messages left out)" if dropped else ""
        print(f"{turn:>4} {n:>7} {out:>6} | {ev:>9} {1000 * ttft:>8.1f} | {ev0:>12} {1000 * ttft0:>8.1f} | "
              f"{ttft0 / ttft:>5.1f}x{note}")
    later = slice(1, None)
    print(f"turns 2..{len(reuse)}: median TTFT {1000 * statistics.median(r[2] for r in reuse[later]):.1f} ms "
          f"with reuse, {1000 * statistics.median(s[1] for s in scratch[later]):.1f} ms from scratch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
