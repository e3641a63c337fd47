#!/usr/bin/env python3
"""`edgespec serve` against llama.cpp's `llama-server` on an editing session, interleaved.

The workload is scripts/bench_server.py's: a ~150-line file, then turns of
"change X and return the whole file", each request carrying the whole history,
sent through the OpenAI chat API with streaming. Here the history's assistant
turns are a FIXED reference text (the file with the earlier edits made by
hand), never what a server generated: every server is sent identical requests
whatever it replied, and each reply is timed, then dropped.

Three servers, each on a free loopback port, with the same target GGUF, the
same context size, threads, greedy decoding (temperature 0) and max_tokens:

  edgespec          `edgespec serve` with its defaults (auto speculation with
                    the draft of the bundled pair; llama.cpp's kernel choices)
  llama-server      plain
  llama-server -md  llama.cpp's own speculation with the same draft file.
                    This llama.cpp speculates only with `--spec-type
                    draft-simple` beside -md; by default it drafts up to
                    edgespec's k (8) tokens, stopping below edgespec's p_min
                    (0.3), where llama.cpp's own defaults are 3 and 0 (each
                    --md-args adds a configuration with other draft flags).

Both llama-server configurations serve one conversation at a time (-np 1, as
edgespec does), with -fa auto and -ngl 0; everything else is theirs.

Per turn it reports:
  TTFT   from sending the request to the first content text (client clock)
  tok/s  the reply's tokens (from the server's `usage`) after the first, over
         the time after it (client clock); each server's own figure
         (`timings.predicted_per_second`) is printed beside it

Interleaving: all servers stay loaded, and every turn of every repeat goes to
each server back to back in a rotating order; only one works at a time. The
CPU time idle servers take meanwhile is measured and printed (llama.cpp's
threads may spin after a request). --restart instead runs one server process
at a time: each repeat starts each server in turn (rotating order), runs the
whole session and stops it. Each repeat is a new session: its system message
names the repeat, so no server answers turn 1 from the previous repeat's cache.

The summary takes medians over repeats; a ratio is the median of the
per-repeat ratios (edgespec over each llama-server configuration), and the
geomean is over turns. Issue 16's goal: edgespec at least 1.2x the faster
llama-server configuration (by geomean tok/s) in tok/s, TTFT within 10% of it.

Build llama-server from the llama.cpp that llama-cpp-python vendors (as
scripts/bench_vs_llamacpp.py; add the CMAKE_ARGS scripts/install.sh's cpu_args
gives on this CPU, none without AMX):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sd
    tar xzf /tmp/sd/llama_cpp_python-0.3.36.tar.gz -C /tmp/sd
    cmake -S /tmp/sd/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/cppbuild \\
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF $CMAKE_ARGS
    cmake --build /tmp/cppbuild -j2 --target llama-server

Then, on an otherwise idle machine (45-75 minutes on 2 cores: 3 servers x 5
turns x 3 repeats, each reply ~1300 tokens):

    .venv/bin/python scripts/bench_server_vs_llamacpp.py --bin /tmp/cppbuild/bin/llama-server --json server-bench.json

Adding `--md-args "--spec-draft-n-max 8 --spec-draft-n-min 0 --spec-draft-p-min 0.3" --md-args ""` runs
llama-server -md with llama.cpp's own draft defaults as a fourth server (a
third longer). A quick smoke: --repeats 1 --turns 2 --max-tokens 64.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from _common import Server, ServerSpec
from bench_server import EDITS, SYSTEM, fixed_session, run_turn
from edgespec.bench import machine, rotation

OURS = "edgespec"
PLAIN = "llama-server"
MD = "llama-server -md"
MATCHED_MD_ARGS = "--spec-draft-n-max 8 --spec-draft-n-min 0 --spec-draft-p-min 0.3"
"""Drafting as edgespec's defaults do at most: k = 8 tokens, stopping below p_min 0.3."""
TPS_GOAL = 1.2
TTFT_GOAL = 1.1


# -- the servers ---------------------------------------------------------------------------------

def server_specs(args, target: Path, draft: Path) -> list[ServerSpec]:
    n = str(args.threads)
    specs = [ServerSpec(OURS, lambda port: [
        sys.executable, "-m", "edgespec", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--target", str(target), "--draft", str(draft), "--ctx", str(args.ctx), "--threads", n])]

    def llama(port: int) -> list[str]:
        return [args.bin, "-m", str(target), "-c", str(args.ctx), "-t", n, "-tb", n, "-ngl", "0", "-fa", "auto",
                "-np", "1", "--host", "127.0.0.1", "--port", str(port)]

    specs.append(ServerSpec(PLAIN, llama))
    md_variants = args.md_args or [MATCHED_MD_ARGS]
    for i, extra in enumerate(md_variants):
        name = MD if len(md_variants) == 1 else f"{MD} #{i + 1}"
        specs.append(ServerSpec(name, lambda port, extra=extra: llama(port) + [
            "-md", str(draft), "-ngld", "0", "-td", n, "-tbd", n, "--spec-type", "draft-simple", *shlex.split(extra)]))
    return specs


class Client:
    """A server's OpenAI client and the model name it answers to."""

    def __init__(self, server: Server, timeout_s: float):
        import openai

        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=timeout_s)
        self.model = next(iter(self.client.models.list())).id

    def turn(self, messages: list[dict], max_tokens: int) -> dict:
        r = run_turn(self.client, self.model, messages, max_tokens)
        r.pop("text")
        return r

    def warm_up(self) -> None:
        run_turn(self.client, self.model, [{"role": "user", "content": "Say hello."}], 8)


# -- the pure parts: order, ratios, tables ---------------------------------------------------------

def session_system(repeat: int) -> str:
    """Repeat r's system message: a new session, so no server has its start cached."""
    return f"Session {repeat + 1}. {SYSTEM}"


def median_of(runs: Sequence[dict], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def paired_ratio(ours: Sequence[dict], theirs: Sequence[dict], key: str) -> float:
    """The median over repeats of ours[key] / theirs[key] (runs of the same repeat)."""
    ratios = [o[key] / t[key] for o, t in zip(ours, theirs) if o.get(key) and t.get(key)]
    return statistics.median(ratios) if ratios else float("nan")


def geomean(values: Sequence[float]) -> float:
    ok = [v for v in values if v > 0]
    return statistics.geometric_mean(ok) if len(ok) == len(values) and ok else float("nan")


@dataclass
class Comparison:
    """edgespec over one llama-server configuration."""

    other: str
    tps: list[float]
    """Per turn: tok/s ratio (above 1: edgespec faster)."""
    ttft: list[float]
    """Per turn: TTFT ratio (below 1: edgespec answers sooner)."""

    @property
    def tps_geomean(self) -> float:
        return geomean(self.tps)

    @property
    def ttft_geomean(self) -> float:
        return geomean(self.ttft)


def compare(results: dict[str, list[list[dict]]], ours: str, other: str) -> Comparison:
    """results[name][turn] holds the runs of each repeat, in repeat order."""
    turns = range(len(results[ours]))
    return Comparison(other, [paired_ratio(results[ours][t], results[other][t], "tokens_per_s") for t in turns],
                      [paired_ratio(results[ours][t], results[other][t], "ttft_s") for t in turns])


def fastest(results: dict[str, list[list[dict]]], names: Sequence[str]) -> str:
    """The one of `names` with the highest geomean over turns of its median tok/s."""
    return max(names, key=lambda n: geomean([median_of(runs, "tokens_per_s") for runs in results[n]]))


def goal(c: Comparison) -> dict:
    """Issue 16's goal against one configuration, as values."""
    return {"tps_ratio": c.tps_geomean, "tps_met": c.tps_geomean >= TPS_GOAL,
            "ttft_ratio": c.ttft_geomean, "ttft_met": c.ttft_geomean <= TTFT_GOAL}


def _num(value, fmt: str) -> str:
    return "?" if value is None or math.isnan(value) else format(value, fmt)


def format_turns(results: dict[str, list[list[dict]]], names: Sequence[str]) -> str:
    """One row per turn and server: medians over repeats."""
    width = max(len(n) for n in names)
    lines = [(f"{'turn':>4}  {'server':<{width}} {'prompt':>6} {'cached':>6} {'reply':>5} {'TTFT s':>7} "
              f"{'tok/s':>6} {'srv tok/s':>9} {'accept':>6}")]
    for t in range(len(results[names[0]])):
        for name in names:
            runs = results[name][t]
            drafted = sum(r.get("drafted") or 0 for r in runs)
            accept = f"{sum(r.get('accepted') or 0 for r in runs) / drafted:.0%}" if drafted else "-"
            def m(key, fmt, runs=runs):
                return _num(median_of(runs, key), fmt)

            lines.append(f"{t + 1:>4}  {name:<{width}} {m('prompt_tokens', '.0f'):>6} {m('cached_tokens', '.0f'):>6} "
                         f"{m('completion_tokens', '.0f'):>5} {m('ttft_s', '.2f'):>7} {m('tokens_per_s', '.1f'):>6} "
                         f"{m('server_tokens_per_s', '.1f'):>9} {accept:>6}")
    return "\n".join(lines)


def format_ratios(comparisons: Sequence[Comparison], ours: str = OURS) -> str:
    """Per turn and geomean: edgespec's tok/s and TTFT over each configuration's."""
    head = [f"tok/s {ours}/{c.other}" for c in comparisons] + [f"TTFT {ours}/{c.other}" for c in comparisons]
    widths = [max(len(h), 8) for h in head]
    lines = ["turn  " + "  ".join(f"{h:>{w}}" for h, w in zip(head, widths))]

    def row(label: str, values: list[float]) -> str:
        return f"{label:<4}  " + "  ".join(f"{_num(v, '.2f') + 'x':>{w}}" for v, w in zip(values, widths))

    for t in range(len(comparisons[0].tps)):
        lines.append(row(str(t + 1), [c.tps[t] for c in comparisons] + [c.ttft[t] for c in comparisons]))
    lines.append(row("geo", [c.tps_geomean for c in comparisons] + [c.ttft_geomean for c in comparisons]))
    return "\n".join(lines)


def prompt_mismatches(results: dict[str, list[list[dict]]]) -> list[str]:
    """Turns whose prompt the servers tokenized to different lengths (their chat templates differ)."""
    notes = []
    names = list(results)
    for t in range(len(results[names[0]])):
        sizes = {n: results[n][t][0].get("prompt_tokens") for n in names if results[n][t]}
        if len(set(sizes.values())) > 1:
            notes.append(f"turn {t + 1}: prompt tokens differ: {sizes}")
    return notes


# -- the run ---------------------------------------------------------------------------------------

def run_loaded(specs, args, log_dir, record) -> dict:
    """All servers loaded; each turn goes to every server back to back, in rotating order."""
    servers = [Server(s, log_dir) for s in specs]
    idle = {"cpu_s": 0.0, "wall_s": 0.0}
    try:
        clients = {}
        for server in servers:
            server.start(args.start_timeout)
            clients[server.spec.name] = Client(server, args.request_timeout)
            clients[server.spec.name].warm_up()
        names = [s.spec.name for s in servers]
        for r in range(args.repeats):
            for t in range(args.turns):
                messages = fixed_session(t, system=session_system(r))
                for name in rotation(names, r * args.turns + t):
                    others = [s for s in servers if s.spec.name != name]
                    before, start = sum(s.cpu_s() for s in others), time.monotonic()
                    result = clients[name].turn(messages, args.max_tokens)
                    idle["cpu_s"] += sum(s.cpu_s() for s in others) - before
                    idle["wall_s"] += time.monotonic() - start
                    record(name, r, t, result)
    finally:
        for server in servers:
            server.stop()
    return idle


def run_restarting(specs, args, log_dir, record) -> None:
    """One server process at a time: each repeat starts each in turn and runs the whole session."""
    for r in range(args.repeats):
        for spec in rotation(specs, r):
            server = Server(spec, log_dir)
            try:
                server.start(args.start_timeout)
                client = Client(server, args.request_timeout)
                client.warm_up()
                for t in range(args.turns):
                    record(spec.name, r, t, client.turn(fixed_session(t, system=session_system(r)), args.max_tokens))
            finally:
                server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="llama.cpp's llama-server")
    ap.add_argument("--target", help="target GGUF (default: the bundled pair's)")
    ap.add_argument("--draft", help="draft GGUF (default: the bundled pair's, the file edgespec uses)")
    ap.add_argument("--turns", type=int, default=len(EDITS), help=f"edit turns (at most {len(EDITS)})")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2048, help="per reply (the whole file is ~1300 tokens)")
    ap.add_argument("--ctx", type=int, default=12288, help="context size of every server (turn 5 needs ~9000)")
    ap.add_argument("--threads", type=int, default=2, help="of every server, target and draft (default 2)")
    ap.add_argument("--md-args", action="append", metavar="FLAGS",
                    help=f"llama-server -md's draft flags (default: '{MATCHED_MD_ARGS}'; "
                         "'' for llama.cpp's own); repeat for more configurations")
    ap.add_argument("--restart", action="store_true", help="one server process at a time (see above)")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds a server may take to load")
    ap.add_argument("--request-timeout", type=float, default=900, help="seconds any one read of a reply may wait")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    args = ap.parse_args(argv)
    if not 1 <= args.turns <= len(EDITS):
        ap.error(f"--turns must be 1 to {len(EDITS)}")
    if bool(args.target) != bool(args.draft):
        ap.error("--target and --draft go together (neither: the bundled pair)")
    if not os.access(args.bin, os.X_OK):
        ap.error(f"--bin {args.bin}: not an executable (build llama-server as the help says)")

    from edgespec.models.fetch import resolve_model, resolve_pair

    if args.target:
        target, draft = Path(resolve_model(args.target)), Path(resolve_model(args.draft))
    else:
        target, draft, _ = resolve_pair(None)
        target, draft = Path(target), Path(draft)
    specs = server_specs(args, target, draft)
    results: dict[str, list[list[dict]]] = {s.name: [[] for _ in range(args.turns)] for s in specs}

    def record(name, r, t, result):
        results[name][t].append(result)
        print(f"  repeat {r + 1} turn {t + 1} {name:<18} TTFT {result['ttft_s']:6.2f} s  "
              f"{result['tokens_per_s']:6.1f} tok/s  ({result['completion_tokens']} tokens)",
              file=sys.stderr, flush=True)

    print(f"machine: {machine()}; {args.threads} threads; context {args.ctx}; max_tokens {args.max_tokens}; greedy")
    print(f"target {target.name}, draft {draft.name}; {args.turns} turns x {args.repeats} repeats; "
          f"{'one server at a time (--restart)' if args.restart else 'all servers loaded, turns interleaved'}")
    for spec in specs:
        print(f"  {spec.name}: {shlex.join(spec.argv(0)).replace('--port 0', '--port PORT')}")
    started = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-server-"))
    idle = None
    if args.restart:
        run_restarting(specs, args, log_dir, record)
    else:
        idle = run_loaded(specs, args, log_dir, record)

    names = [s.name for s in specs]
    print("\nmedians over repeats; tok/s and TTFT on the client's clock, tok/s counting the server's usage; "
          "srv tok/s is the server's own timings.predicted_per_second")
    print(format_turns(results, names))
    for note in prompt_mismatches(results):
        print(f"note: {note}")
    comparisons = [compare(results, OURS, other) for other in names[1:]]
    print("\nedgespec over each (median of per-repeat ratios; geo: geomean over turns)")
    print(format_ratios(comparisons))
    best = fastest(results, names[1:])
    g = goal(next(c for c in comparisons if c.other == best))
    print(f"\nfaster llama-server configuration (geomean tok/s): {best}. edgespec over it: "
          f"tok/s {_num(g['tps_ratio'], '.2f')}x (goal >= {TPS_GOAL}x: {'met' if g['tps_met'] else 'not met'}), "
          f"TTFT {_num(g['ttft_ratio'], '.2f')}x (goal <= {TTFT_GOAL}x: {'met' if g['ttft_met'] else 'not met'})")
    if idle is not None and idle["wall_s"] > 0:
        print(f"idle servers used {idle['cpu_s']:.1f} CPU-s during {idle['wall_s']:.0f} s of the others' turns "
              f"({idle['cpu_s'] / idle['wall_s']:.1%} of one core)")
    print(f"took {(time.monotonic() - started) / 60:.1f} min; server logs in {log_dir}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "target": str(target), "draft": str(draft), "args": vars(args),
                       "servers": {s.name: s.argv(0) for s in specs}, "results": results,
                       "ratios": {c.other: {"tps": c.tps, "ttft": c.ttft} for c in comparisons},
                       "faster": best, "goal": g, "idle": idle}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
