#!/usr/bin/env python3
"""Coming back to a conversation: edgespec against llama-server, and a chat reopened after a restart.

1. Two conversations A and B of ~1,500 tokens (a source file each and a short
   question), then A plus one turn, B plus one turn, A plus one turn, as a
   client switching between two chats sends them. `edgespec serve` and
   `llama-server` each run with their defaults (the bundled pair, the same
   threads and context), one after the other, rotated per repeat; each
   request's time to first token is measured at the client, and the table
   gives the medians and the ratio edgespec / llama-server.
2. A ~4,000-token conversation (imported into a fresh EDGESPEC_HOME), answered
   by `edgespec chat --once` in a new process twice: the first reads it, the
   second finds the KV snapshot the first left on disk. Time to first token
   from the reply's statistics, and the process's wall time to its first byte
   of output (model loading included).

    .venv/bin/python scripts/bench_switch.py --bin /tmp/cppbuild/bin/llama-server --repeats 2

llama-server is built as scripts/bench_server_vs_llamacpp.py says. Part 2
alone (no llama-server needed): --skip-server.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, Server, ServerSpec
from bench_server import run_turn
from edgespec.bench import rotation

OURS, THEIRS = "edgespec", "llama-server"
STEPS = ["A", "B", "A again", "B again", "A again"]
FILES = {"A": "edgespec/engine/auto.py", "B": "edgespec/chat/session.py"}
FOLLOW_UPS = ["Which function would you test first, and why?", "Name one edge case it misses.",
              "Say that again in one sentence."]


def source(path: str, chars: int) -> str:
    return (REPO / path).read_text()[:chars]


def conversations(chars: int) -> dict[str, list[dict]]:
    return {name: [{"role": "user", "content": f"Here is a file:\n\n```python\n{source(path, chars)}\n```\n\n"
                                               "What does it do? Answer in two sentences."}]
            for name, path in FILES.items()}


def specs(args, target: Path, draft: Path, home: str) -> list[ServerSpec]:
    """The two servers; edgespec's keeps its files (KV snapshots included) in `home`."""
    env = {**os.environ, "EDGESPEC_HOME": home}
    n = str(args.threads)
    ours = ServerSpec(OURS, lambda port: [
        sys.executable, "-m", "edgespec", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--target", str(target), "--draft", str(draft), "--ctx", str(args.ctx), "--threads", n,
        *shlex.split(args.edgespec_args)], env)
    theirs = ServerSpec(THEIRS, lambda port: [
        args.bin, "-m", str(target), "-c", str(args.ctx), "-t", n, "-tb", n, "--host", "127.0.0.1",
        "--port", str(port)])
    return [ours, theirs]


def alternate(server: Server, chats: dict[str, list[dict]], max_tokens: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    chats = {k: list(v) for k, v in chats.items()}
    follow = iter(FOLLOW_UPS)
    rows = []
    for step in STEPS:
        name = step[0]
        if step.endswith("again"):
            chats[name].append({"role": "user", "content": next(follow)})
        row = run_turn(client, model, chats[name], max_tokens)
        chats[name].append({"role": "assistant", "content": row["text"]})
        rows.append(row)
        print(f"  {server.spec.name:13s} {step:8s} prompt {row['prompt_tokens']:5d}  cached {row['cached_tokens']}"
              f"  TTFT {row['ttft_s']:6.2f} s", flush=True)
    return rows


def part_server(args, target: Path, draft: Path) -> None:
    chats = conversations(args.chars)
    results: dict[str, list[list[dict]]] = {OURS: [], THEIRS: []}
    with tempfile.TemporaryDirectory() as logs:
        for r in range(args.repeats):
            # a fresh home each run: the snapshots the last run left on disk would spare the first reads
            all_specs = specs(args, target, draft, tempfile.mkdtemp(prefix="bench-switch-home-", dir=logs))
            for spec in rotation(all_specs, r):
                server = Server(spec, Path(logs))
                try:
                    server.start(600)
                    results[spec.name].append(alternate(server, chats, args.max_tokens))
                finally:
                    server.stop()
    print(f"\ntime to first token (s), medians of {args.repeats}; "
          f"{args.threads} threads, context {args.ctx}, replies of up to {args.max_tokens} tokens")
    print(f"{'':22s}" + "".join(f"{s:>10s}" for s in STEPS))
    med = {name: [statistics.median(run[i]["ttft_s"] for run in runs) for i in range(len(STEPS))]
           for name, runs in results.items()}
    for name in (OURS, THEIRS):
        print(f"{name + ' serve' if name == OURS else name:22s}" + "".join(f"{v:10.2f}" for v in med[name]))
    print(f"{'edgespec / llama-server':22s}" + "".join(f"{a / b:9.2f}x" for a, b in zip(med[OURS], med[THEIRS])))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def long_export(words: int) -> dict:
    """A conversation of ~`words` * 1.3 tokens: turns about the files of this repository."""
    messages, total = [], 0
    paths = sorted(p for p in (REPO / "edgespec").rglob("*.py") if p.stat().st_size > 3000)
    for path in paths:
        text = path.read_text()[:2500]
        messages += [{"role": "user", "content": f"Review {path.name}:\n\n{text}"},
                     {"role": "assistant", "content": f"{path.name} reads well; its names say what they hold."}]
        total += len(text.split()) + 20
        if total >= words:
            break
    return {"format": "edgespec.conversation", "version": 1, "title": "A long review", "settings": {},
            "messages": messages}


def chat_once(home: str, target: Path, draft: Path, args) -> dict:
    env = {**os.environ, "EDGESPEC_HOME": home}
    argv = [sys.executable, "-m", "edgespec", "chat", "--conversation", "1", "--once",
            "Which file should be reviewed next? One sentence.", "--target", str(target), "--draft", str(draft),
            "--ctx", str(args.ctx), "--threads", str(args.threads), "--max-tokens", "24", "--stats"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.read(1)
    first_byte_s = time.perf_counter() - start
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(err.decode(errors="replace"))
    line = next((ln for ln in err.decode().splitlines() if "first token" in ln), "")
    ttft = float(line.split("first token ")[1].split(" ms")[0]) / 1000 if line else float("nan")
    prompt = int(line.split("prompt ")[1].split("/")[1].split(" ")[0].replace(",", "")) if "prompt " in line else 0
    return {"wall_to_first_byte_s": first_byte_s, "ttft_s": ttft, "stats": line, "prompt_tokens": prompt,
            "text": (first + out).decode()}


def part_reopen(args, target: Path, draft: Path) -> None:
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-reopen-") as home:
            export = Path(home) / "chat.json"
            export.write_text(json.dumps(long_export(args.reopen_words)))
            env = {**os.environ, "EDGESPEC_HOME": home}
            subprocess.run([sys.executable, "-m", "edgespec", "import", str(export)], env=env, check=True,
                           capture_output=True)
            first, again = chat_once(home, target, draft, args), chat_once(home, target, draft, args)
            runs.append((first, again))
            for label, r in (("first run", first), ("after restart", again)):
                print(f"  {label:14s} TTFT {r['ttft_s']:6.2f} s   first byte {r['wall_to_first_byte_s']:6.2f} s   "
                      f"{r['stats']}", flush=True)
    print(f"\na {max(r[1]['prompt_tokens'] for r in runs):,}-token chat, `edgespec chat --once` in a new process "
          f"(medians of {args.repeats})")
    for i, label in enumerate(("first run (reads it)", "after a restart")):
        ttft = statistics.median(r[i]["ttft_s"] for r in runs)
        wall = statistics.median(r[i]["wall_to_first_byte_s"] for r in runs)
        print(f"  {label:22s} time to first token {ttft:6.2f} s   process start to first output {wall:6.2f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", help="llama-server (needed unless --skip-server)")
    ap.add_argument("--target", help="default: the bundled target")
    ap.add_argument("--draft", help="default: the bundled draft")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32, help="per reply in part 1")
    ap.add_argument("--chars", type=int, default=6000, help="of each source file in part 1 (~1,500 tokens)")
    ap.add_argument("--reopen-words", type=int, default=3000, help="size of part 2's chat, in words")
    ap.add_argument("--edgespec-args", default="", help="more options for `edgespec serve` (e.g. '--parallel 4')")
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-reopen", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="part 1's per-request results")
    args = ap.parse_args(argv)
    from edgespec.models.fetch import resolve_model
    from edgespec.models.registry import DEFAULT_PAIR, load_registry

    pair = load_registry().pair(DEFAULT_PAIR)
    target = Path(args.target or resolve_model(pair.target))
    draft = Path(args.draft or resolve_model(pair.draft))
    if not args.skip_server:
        if not args.bin:
            ap.error("--bin PATH_TO_LLAMA_SERVER is needed (or --skip-server)")
        part_server(args, target, draft)
    if not args.skip_reopen:
        part_reopen(args, target, draft)
    return 0


if __name__ == "__main__":
    sys.exit(main())
