#!/usr/bin/env python3
"""Flash attention on or off, on this machine: prompt reading and verify passes
at several depths of the KV cache, side by side.

Two contexts of the same model, one with llama.cpp's flash attention and one
without, read the same tokens to each depth; at each depth both time the
reading that got there and passes of 1..33 tokens (what decoding and verifying
a draft cost), interleaved, medians. It prints off/on ratios of time: below
1.00x, off is faster. Where every layer runs on the CPU, edgespec chooses by a
one-layer probe of the model's attention (engine/attention.py): at the first
depth past 0 this prints what a turn costs the whole model each way beside what
the probe measures, so that a machine shows whether the probe picks as the
model would.

Figures that show why it is measured per machine (bundled 1.5B target, 2 threads):
- 2-core AVX-512 AMD EPYC: off faster everywhere; 6,600 tokens deep a 17-token
  pass 569 ms off against 994 on, 2,600 tokens read 29 s against 37; alike at
  an empty cache.
- 2-core Xeon (Sapphire Rapids): reading 1,529 tokens ~7% faster on (20.8 s
  against 22.4 s).
- 2-core AVX2 AMD EPYC (Zen 1): reading 1,536 tokens 11% faster on (91.8 s
  against 101.9 s), a 9-token pass at that depth 19% faster off; the probe read
  1.6x faster on, so on.
- one conversation per context without flash attention (slots.default_slots):
  2-core Xeon, a 1,300-token prompt read beside a 1,600-token conversation took
  22-24 s, against 17-19 s alone.

    .venv/bin/python scripts/bench_flash_attn.py [--target PATH_OR_NAME] [--threads N] [--depths 0,1500,4000,6500]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

from edgespec.bench import machine
from edgespec.engine.attention import TURN_PASSES, AttentionTimes, FlashAttnTimes, measure
from edgespec.engine.cache import KVSequence
from edgespec.llama.context import LlamaContext
from edgespec.llama.model import LlamaModel
from edgespec.models.fetch import resolve_model, resolve_pair

SIZES = tuple(sorted({1, 2, 5, 9, 17, 33} | set(TURN_PASSES)))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="model (default: the bundled pair's target)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--depths", default="0,1500,4000,6500", help="KV cache depths to measure at")
    parser.add_argument("--rounds", type=int, default=5, help="passes of each size per configuration and depth")
    args = parser.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    path = resolve_model(args.target) if args.target else resolve_pair(None)[0]
    print(f"{Path(path).name}; {machine()}; threads {args.threads or 'all'}")

    model = LlamaModel(path)
    rng = random.Random(0)
    tokens = [rng.randrange(100, min(model.n_vocab, 30000)) for _ in range(depths[-1] + max(SIZES))]
    n_ctx = depths[-1] + max(SIZES) + 64
    seqs = {fa: KVSequence(LlamaContext(model, n_ctx=n_ctx, n_threads=args.threads, flash_attn=fa))
            for fa in (True, False)}
    print(f"{'depth':>6} {'read (off/on)':>22}  " + "  ".join(f"{f'pass {n}':>20}" for n in SIZES))
    first = next((d for d in depths if d > 0), None)
    for depth in depths:
        read = {fa: timed(lambda: seq.sync(tokens[:depth])) for fa, seq in seqs.items()}
        passes: dict[bool, dict[int, list[float]]] = {True: {}, False: {}}
        for n in SIZES:
            for _ in range(args.rounds):
                for fa, seq in seqs.items():
                    passes[fa].setdefault(n, []).append(
                        timed(lambda: seq.extend(tokens[depth:depth + n], all_logits=True)))
                    seq.truncate(depth)
        cells = []
        for n in SIZES:
            on, off = (statistics.median(passes[fa][n]) * 1e3 for fa in (True, False))
            cells.append(f"{off:5.0f}/{on:5.0f} ms {off / on:4.2f}x")
        grown = read[True] > 0.05
        read_cell = f"{read[False]:5.1f}/{read[True]:5.1f} s {read[False] / read[True]:4.2f}x" if grown else "-"
        print(f"{depth:>6} {read_cell:>22}  " + "  ".join(f"{c:>20}" for c in cells), flush=True)
        if depth == first:
            real = {fa: AttentionTimes(read[fa], {n: statistics.median(passes[fa][n]) for n in TURN_PASSES})
                    for fa in (True, False)}
    for seq in seqs.values():
        seq.close()
        seq.ctx.close()
    shape = model.attention_shape()
    model.close()
    if first is not None:
        compare_with_probe(FlashAttnTimes(real[True], real[False]), shape, first, args.threads)
    return 0


def compare_with_probe(real: FlashAttnTimes, shape, depth: int, threads: int | None) -> None:
    """Whether the one-layer probe edgespec decides by (engine/attention.py) picks
    what this model's own turn at `depth` favours."""
    probe = measure(shape, depth=depth, n_batch=512, n_threads=threads or os.cpu_count() or 1)
    print(f"\na turn at {depth} tokens (the read and {TURN_PASSES} passes by size), off/on:")
    for name, t in (("this model", real), ("the probe (one layer)", probe)):
        print(f"  {name:22s} {t.off.turn():8.3f}/{t.on.turn():8.3f} s {t.off.turn() / t.on.turn():4.2f}x"
              f"  -> flash attention {'on' if t.prefer_on() else 'off'}")


if __name__ == "__main__":
    sys.exit(main())
