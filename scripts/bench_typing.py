#!/usr/bin/env python3
"""A chat played as a person plays it in the app: each message typed, then sent.

Three ways through the same 10-turn chat (scripts/bench_chat_turns.py's questions),
one after another in rotated order each repeat, each a new chat (caches emptied,
auto at its priors):

  typed      edgespec as the app plays it: while the message is written, a pause in
             the typing reads the conversation and the words but the last into the
             models (ChatSession.read_ahead, in the draft model too where auto can
             use it); sending reads the rest
  sent       edgespec with the message sent whole (a paste and Enter, or the server)
  Llama      plain llama.cpp through llama-cpp-python's `Llama`, greedy, on the
             prompts of a chat recorded once (edgespec plain, untimed), its cache
             kept from turn to turn as its generate() keeps it

Timed per turn from sending: the time to the first token, and the reply's
tokens/s after it; the wait is both. The reading ahead is timed apart (the user
is still typing then: a message of 10 words takes a few seconds to write).
Medians over the repeats of each chat's totals, and the ratios.

    .venv/bin/python scripts/bench_typing.py --repeats 3
    .venv/bin/python scripts/bench_typing.py --turns 4 --mode plain
    .venv/bin/python scripts/bench_typing.py --paste FILE --turns 2   # a file pasted into the first message

With --paste the first message is FILE's text pasted before its question (by
default the standard library's `colorsys.py`, 166 lines): typed, the paste is read
while the question is written; sent, it is read at sending.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import Recorder, load
from bench_chat_turns import QUESTIONS

from edgespec.bench import LlamaCppBaseline, machine, rotation
from edgespec.chat import ChatSession
from edgespec.engine.events import GenerationParams
from edgespec.errors import EdgespecError

SYSTEM = "You are a concise coding assistant."
WAYS = ("typed", "sent", "Llama")


@dataclass
class Totals:
    """One chat's turns, summed."""

    ttft_s: float = 0.0
    decode_s: float = 0.0
    tokens: int = 0
    read_ahead_s: float = 0.0
    prompt_evaluated: int = 0
    draft_ahead: int = 0
    """Turns whose reading ahead the draft model read too."""
    replies: list[str] = field(default_factory=list)

    def add(self, ttft_s: float, decode_s: float, tokens: int) -> None:
        self.ttft_s += ttft_s
        self.decode_s += decode_s
        self.tokens += tokens

    @property
    def wait_s(self) -> float:
        return self.ttft_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s else 0.0


def timed(chunks) -> tuple[float, float, int, object]:
    """(seconds to the first token, seconds after it, tokens after it, the last chunk's stats)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    last = None
    for chunk in chunks:
        last = chunk
        if chunk.tokens:
            if first is None:
                first = time.perf_counter()
                tokens += len(chunk.tokens) - 1
            else:
                tokens += len(chunk.tokens)
    end = time.perf_counter()
    first = end if first is None else first
    return first - start, end - first, tokens, last.stats if last is not None else None


def llama_turn(base: LlamaCppBaseline, prompt: list[int], params: GenerationParams) -> tuple[float, float, int]:
    """A turn through `Llama.generate`, which keeps what its cache shares with the prompt."""
    start = time.perf_counter()
    first = None
    n = 0
    for token in base.llm.generate(prompt, temp=0.0, top_k=params.top_k, top_p=params.top_p, min_p=0.0):
        if base.is_eog(token):
            break
        n += 1
        if first is None:
            first = time.perf_counter()
        if n >= params.max_tokens:
            break
    end = time.perf_counter()
    first = end if first is None else first
    return first - start, end - first, max(n - 1, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="auto", help="edgespec's mode: plain | lookup | draft | auto (default auto)")
    ap.add_argument("--turns", type=int, default=len(QUESTIONS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--paste", nargs="?", const=str(Path(sysconfig.get_paths()["stdlib"]) / "colorsys.py"),
                    metavar="FILE", help="paste FILE's text into the first message (default: colorsys.py)")
    args = ap.parse_args(argv)
    try:
        engine = load(None, n_ctx=args.ctx, n_threads=args.threads)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    params = GenerationParams(mode=args.mode, max_tokens=args.max_tokens, temperature=0.0)
    questions = list(QUESTIONS[: args.turns])
    if args.paste:
        questions[0] = f"Here is a file:\n\n{Path(args.paste).read_text()}\n\nWhat does it do? Answer in two sentences."
    with engine:
        info = engine.describe()
        print(f"{machine()}; " + " + ".join(m.path.rsplit('/', 1)[-1] for m in info.models.values())
              + f"; edgespec mode {args.mode}; {args.turns} turns of up to {args.max_tokens} tokens; "
              f"{args.repeats} repeats")
        recorder = Recorder(engine)  # a chat recorded once, untimed: Llama's prompts, and a warm-up
        chat = ChatSession(recorder, params=GenerationParams(mode="plain", max_tokens=args.max_tokens,
                                                             temperature=0.0), system_prompt=SYSTEM)
        for q in questions:
            for _ in chat.send(q):
                pass
        llama_prompts = recorder.prompts
        base = LlamaCppBaseline(info.target.path, n_ctx=args.ctx, n_threads=args.threads, is_eog=engine.is_eog)
        runs: dict[str, list[Totals]] = {w: [] for w in WAYS}
        try:
            for repeat in range(args.repeats):
                totals = {w: Totals() for w in WAYS}
                for way in rotation(WAYS, repeat):
                    t = totals[way]
                    if way == "Llama":
                        base.llm.reset()
                        for prompt in llama_prompts:
                            t.add(*llama_turn(base, prompt, params))
                        continue
                    engine.reset(learnt=True)  # a new chat: nothing cached, auto at its priors
                    session = ChatSession(engine, params=params, system_prompt=SYSTEM)
                    for q in questions:
                        if way == "typed":
                            start = time.perf_counter()
                            session.read_ahead(words=q)
                            t.read_ahead_s += time.perf_counter() - start
                            draft = engine.draft_seq
                            t.draft_ahead += bool(draft and draft.tokens and draft.tokens == engine.target_seq.tokens)
                        ttft, decode, tokens, stats = timed(session.send(q))
                        t.add(ttft, decode, tokens)
                        t.prompt_evaluated += stats.prompt_evaluated if stats else 0
                        t.replies.append(session.messages[-1].content)
                for way in WAYS:
                    runs[way].append(totals[way])
                print(f"repeat {repeat + 1}: wait " + ", ".join(f"{w} {totals[w].wait_s:.1f} s" for w in WAYS),
                      flush=True)
        finally:
            base.close()

    def med(way, key):
        return statistics.median(getattr(t, key) for t in runs[way])

    print(f"\n{'way':<6} {'wait s':>7} {'TTFT s':>7} {'tok/s':>6} {'read at send':>12} {'read ahead':>16}")
    for way in WAYS:
        ahead = (f"{med(way, 'read_ahead_s'):.1f} s, "
                 f"draft model in {med(way, 'draft_ahead'):.0f} of {args.turns} turns" if way == "typed" else "-")
        sent = f"{med(way, 'prompt_evaluated'):.0f} tok" if way != "Llama" else "-"
        print(f"{way:<6} {med(way, 'wait_s'):>7.2f} {med(way, 'ttft_s'):>7.2f} {med(way, 'tokens_per_s'):>6.1f} "
              f"{sent:>12} {ahead:>16}")
    same = sum(x == y for t, u in zip(runs["typed"], runs["sent"]) for x, y in zip(t.replies, u.replies))
    print(f"typed and sent replied the same on {same} of {sum(len(t.replies) for t in runs['typed'])} turns "
          "(greedy: a prompt read in other batches rounds otherwise, and a near-tie can flip)")
    for a, b in (("typed", "Llama"), ("sent", "Llama"), ("typed", "sent")):
        wait = statistics.median(y.wait_s / x.wait_s for x, y in zip(runs[a], runs[b]))
        ttft = statistics.median(y.ttft_s / x.ttft_s for x, y in zip(runs[a], runs[b]))
        tps = statistics.median(x.tokens_per_s / y.tokens_per_s for x, y in zip(runs[a], runs[b]))
        print(f"{a} over {b}: wait {wait:.2f}x faster, time to first token {ttft:.2f}x, decode {tps:.2f}x "
              f"(medians of the {len(runs[a])} repeats' ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
