#!/usr/bin/env python3
"""What does token-exact speculation cost on this machine, ingredient by ingredient?

For each combination of weight layout (llama.cpp's repacked CPU kernels or the
plain layout), KV cache type (F16, Q8_0) and flash attention (on, off), this
loads the target, reads a prompt, and measures:

- decode: a single-token pass (median of several, interleaved across configurations);
- exact sizes: the verify batch sizes n (2..8) whose logits equal, bit for bit
  (within engine/exact.py's tolerance), those of n single-token passes after
  the same context. Exactness is checked after a long context too, where
  llama.cpp splits single-token attention across threads.

    .venv/bin/python scripts/exact_kernels.py [--target PATH_OR_NAME] [--threads N] [--context 600]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgespec.bench import machine
from edgespec.engine.cache import KVSequence
from edgespec.engine.exact import TOLERANCE
from edgespec.errors import ModelLoadError
from edgespec.llama.context import LlamaContext
from edgespec.llama.model import LlamaModel
from edgespec.models.fetch import resolve_model, resolve_pair

SIZES = range(2, 9)


def exact_sizes(seq: KVSequence) -> list[int]:
    base = len(seq.tokens)
    probe = [(1000 + 7919 * i) % seq.ctx.n_vocab for i in range(max(SIZES))]
    reference = []
    for token in probe:
        seq.extend([token], all_logits=True)
        reference.append(seq.logits(0).copy())
    seq.truncate(base)
    sizes = []
    for n in SIZES:
        seq.extend(probe[:n], all_logits=True)
        if all(float(np.abs(seq.logits(i) - reference[i]).max()) <= TOLERANCE for i in range(n)):
            sizes.append(n)
        seq.truncate(base)
    return sizes


def single_pass_s(seq: KVSequence) -> float:
    base = len(seq.tokens)
    start = time.perf_counter()
    seq.extend([seq.tokens[-1]], all_logits=True)
    elapsed = time.perf_counter() - start
    seq.truncate(base)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="model (default: the bundled pair's target)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--context", type=int, default=600, help="tokens read before measuring")
    parser.add_argument("--rounds", type=int, default=15, help="single-token passes per configuration")
    args = parser.parse_args()
    path = resolve_model(args.target) if args.target else resolve_pair(None)[0]

    configs = {}
    for repack, kv, flash in itertools.product((True, False), ("f16", "q8_0"), (None, True, False)):
        name = f"{'repacked' if repack else 'plain   '} kv {kv:<4} flash {str(flash):<5}"
        try:
            model = LlamaModel(path, extra_bufts=repack)
            ctx = LlamaContext(model, n_ctx=2048, n_threads=args.threads, kv_type=kv, flash_attn=flash)
        except ModelLoadError as e:
            print(f"{name}: cannot load ({e})")
            continue
        seq = KVSequence(ctx)
        seq.sync([(17 + 31 * i) % 5000 + 100 for i in range(args.context)])
        configs[name] = (model, ctx, seq)

    times = {name: [] for name in configs}
    for _ in range(args.rounds):  # interleaved, so machine noise hits every configuration alike
        for name, (_, _, seq) in configs.items():
            times[name].append(single_pass_s(seq))
    print(f"{Path(path).name}; {machine()}; threads {args.threads or 'all'}; context {args.context} tokens")
    fastest = min(statistics.median(t) for t in times.values())
    print(f"{'configuration':<34} {'decode ms':>9} {'vs best':>8}  exact verify sizes")
    for name, (model, ctx, seq) in configs.items():
        ms = statistics.median(times[name]) * 1000
        print(f"{name:<34} {ms:>9.1f} {fastest * 1000 / ms:>7.2f}x  {exact_sizes(seq)}", flush=True)
        seq.close()
        ctx.close()
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
