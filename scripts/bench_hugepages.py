#!/usr/bin/env python3
"""The weights in huge pages or not (edgespec/llama/hugepages.py), side by side.

Each run is a fresh process that loads the model once, as a user's would:
edgespec's way (the weights llama.cpp repacks given huge pages before they are
written), the same without the advice, and llama-cpp-python's `Llama`. Each
times the load, a prompt's reading (512-token batches) and one-token decoding
after it, on a context of the same settings (flash attention on, 2 threads
unless told). The three alternate, --pairs times; medians, and ratios to
`Llama`. Processes, not three loads in one: on a VM a process's second load of
a model decoded 7% faster than its first with nothing else changed (where the
memory came from), which would decide such a comparison.

2-core Xeon VM (Sapphire Rapids), the bundled 1.5B, 4 pairs, 200 tokens read,
64 decoded: 62 ms a token with huge pages against 70 without (1.13x), the load
2.3 s against 0.7 (the kernel finding and clearing 2 MiB pages).

    .venv/bin/python scripts/bench_hugepages.py [--model PATH_OR_NAME] [--pairs 4] [--prompt 200] [--decode 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

WAYS = ("edgespec", "no advice", "Llama")


def child(way: str, path: str, threads: int, n_prompt: int, n_decode: int) -> dict:
    """One process's figures: load seconds, prompt tokens/s, decode ms a token, MiB in huge pages."""
    import llama_cpp

    from edgespec.llama import hugepages
    from edgespec.llama.batch import LlamaBatch
    from edgespec.llama.model import LlamaModel

    if way == "no advice":
        hugepages._MADVISE = None  # pylint: disable=protected-access
    start = time.perf_counter()
    if way == "Llama":
        from llama_cpp import Llama

        llm = Llama(model_path=path, n_ctx=64, n_threads=threads, verbose=False)  # only its model is used
        model_ptr, huge = llm._model.model, 0  # pylint: disable=protected-access
    else:
        model = LlamaModel(path)
        model_ptr, huge = model.ptr, model.huge_pages
    load = time.perf_counter() - start
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_prompt + n_decode + 64, 512, 512
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = 1
    ctx = llama_cpp.llama_init_from_model(model_ptr, params)
    tokens = [1000 + (i * 7919) % 20000 for i in range(n_prompt + n_decode)]
    times = []
    with LlamaBatch(512) as batch:
        start = time.perf_counter()
        for at in range(0, n_prompt, 512):
            batch.set(tokens[at:min(at + 512, n_prompt)], at, all_logits=False)
            llama_cpp.llama_decode(ctx, batch.struct)
        llama_cpp.llama_synchronize(ctx)
        read = n_prompt / (time.perf_counter() - start)
        for i in range(n_decode):
            start = time.perf_counter()
            batch.set([tokens[n_prompt + i]], n_prompt + i, all_logits=True)
            llama_cpp.llama_decode(ctx, batch.struct)
            llama_cpp.llama_synchronize(ctx)
            times.append(time.perf_counter() - start)
    llama_cpp.llama_free(ctx)
    return {"load_s": load, "read_tps": read, "decode_ms": statistics.median(times) * 1e3, "huge_mib": huge >> 20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model (default: the bundled pair's target)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=200, help="tokens read before decoding")
    parser.add_argument("--decode", type=int, default=64, help="tokens decoded one at a time")
    parser.add_argument("--pairs", type=int, default=4, help="runs of each way, alternating")
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.path, args.threads, args.prompt, args.decode)))
        return 0
    from edgespec.bench import machine, rotation
    from edgespec.models.fetch import resolve_model, resolve_pair

    path = str(resolve_model(args.model) if args.model else resolve_pair(None)[0])
    print(f"{Path(path).name}; {machine()}; threads {args.threads}; {args.pairs} runs each, alternating")
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.pairs):
        for way in rotation(list(WAYS), r):
            out = subprocess.run([sys.executable, __file__, "--child", way, "--path", path, "--threads",
                                  str(args.threads), "--prompt", str(args.prompt), "--decode", str(args.decode)],
                                 capture_output=True, text=True, check=True).stdout
            runs[way].append(json.loads(out.strip().splitlines()[-1]))

    def med(way: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[way])

    print(f"{'':10s} {'load s':>7} {'read tok/s':>10} {'decode ms':>9} {'decode vs Llama':>15} {'huge MiB':>8}")
    for way in WAYS:
        print(f"{way:10s} {med(way, 'load_s'):7.2f} {med(way, 'read_tps'):10.1f} {med(way, 'decode_ms'):9.1f} "
              f"{med('Llama', 'decode_ms') / med(way, 'decode_ms'):14.2f}x {med(way, 'huge_mib'):8.0f}")
    print("decode ms, run by run (in the order run):")
    for way in WAYS:
        print(f"  {way:10s} " + " ".join(f"{run['decode_ms']:.1f}" for run in runs[way]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
