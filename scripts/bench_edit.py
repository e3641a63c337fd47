#!/usr/bin/env python3
"""An edit session played as a user plays it: attach a file, ask for a rename,
apply the reply; ask for a second rename, apply again. Interleaved, medians.

Each repeat runs every system on the same conversation, in rotated order, each
reading turn 1's prompt afresh and keeping its cache into turn 2 (llama-server's
one slot is given another prompt first, and its RAM prompt cache is off, as
edgespec's reset drops its RAM snapshots; `Llama` keeps what its cache shares
with the next prompt, as generate() does for its users):

  edgespec   the chat layer with its defaults (ChatSession with the file attached,
             the reply's edit applied by edgespec's own apply, auto speculation)
  Llama      plain llama.cpp through llama-cpp-python's `Llama`, greedy, on the
             same prompt tokens, its cache kept between the two turns
  edgespec, typing S s   (with --typing-s S) edgespec as the app plays turn 1:
             the file read ahead while the request is written for S seconds
  server     (with --llama-server BIN) llama.cpp's llama-server with its
             defaults, and with --spec-type ngram-mod, fed the same tokens on
             /completion with its prompt cache

Timed per turn: from sending to the edit applied (the prompt read, the reply, the
parse and the write), and the reply's tokens/s. The file written by each system
is compared with plain greedy decoding's (`same`). The file to edit is not from
this repository: by default the standard library's `colorsys.py` (--file to
choose another 150-300 line Python file).

    .venv/bin/python scripts/bench_edit.py --repeats 3
    .venv/bin/python scripts/bench_edit.py --llama-server /tmp/cppbuild/bin/llama-server
    .venv/bin/python scripts/bench_edit.py --exact --repeats 1
    .venv/bin/python scripts/bench_edit.py --typing-s 20

With --exact edgespec loads its exact kernels, and its applied files are also
compared with those of plain greedy decoding on the same kernels (edgespec's
plain mode, run once, untimed): under --exact they must be identical.
"""

from __future__ import annotations

import argparse
import ast
import collections
import io
import json
import os
import statistics
import sysconfig
import tempfile
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from _common import Recorder, Server, ServerSpec, load

from edgespec.bench import LlamaCppBaseline, machine, rotation
from edgespec.chat import ChatSession
from edgespec.chat.attachments import pending_edits
from edgespec.cli.files import apply_edits
from edgespec.engine.events import GenerationParams
from edgespec.workspace.apply import apply_edit
from edgespec.workspace.root import Workspace


def rename_requests(source: str) -> list[str]:
    """Two renames of the file's most used function names: edits that copy the file."""
    tree = ast.parse(source)
    defined = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    uses = collections.Counter(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    names = sorted(defined, key=lambda n: (-uses[n], defined.index(n)))[:2]
    if len(names) < 2:
        raise SystemExit("the file needs at least two public functions to rename")
    return [f"Rename the function `{name}` to `{name}_v2` everywhere in {{path}}, calls included. Change nothing else."
            for name in names]


def run_edgespec(engine, source: str, name: str, requests: list[str], params: GenerationParams,
                 typing_s: float | None = None):
    """Two turns through the chat layer; per turn: seconds to the applied edit, tokens, decode s; the files.

    With `typing_s`, turn 1 is played as the app plays it: the file is read ahead
    (ChatSession.read_ahead, in a thread) from the moment it is attached while the
    user writes for `typing_s` seconds; the turn is timed from sending, which waits
    for a reading still under way."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / name).write_text(source)
        workspace = Workspace(folder)
        session = ChatSession(engine, params=params, workspace=workspace)
        turns, files = [], []
        for i, request in enumerate(requests):
            reader = None
            if i == 0 and typing_s is not None:
                reader = threading.Thread(target=session.read_ahead, args=([name],))
                reader.start()
                time.sleep(typing_s)
            start = time.perf_counter()
            if reader is not None:
                reader.join()
            last = None
            for last in session.send(request.format(path=name), [name] if i == 0 else []):
                pass
            edits = session.pending_edits()
            if edits:
                session.record_applied(apply_edits(edits, workspace, yes=True, out=io.StringIO()))
            stats = last.stats
            turns.append({"s": time.perf_counter() - start, "tokens": stats.generated_tokens,
                          "decode_s": stats.decode_s, "applied": bool(edits), "ttft_s": stats.ttft_s,
                          "drafted": stats.drafted, "accepted": stats.accepted,
                          "accepted_by": dict(getattr(stats, "accepted_by", None) or {})})
            files.append((Path(folder) / name).read_text())
        return turns, files


def run_tokens(generate, prompts: list[list[int]], detokenize, source: str, name: str, turn_messages):
    """A baseline fed the prompts edgespec's session sent; its replies are parsed and applied the same way."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / name).write_text(source)
        workspace = Workspace(folder)
        turns, files = [], []
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            tokens, decode_s = generate(prompt)
            reply = detokenize(tokens)
            edits = pending_edits(reply, turn_messages(i, workspace))
            for e in edits:
                apply_edit(workspace, e.edit, base_sha256=workspace.sha256_of(e.path), backups=Path(folder) / ".undo")
            turns.append({"s": time.perf_counter() - start, "tokens": len(tokens), "decode_s": decode_s,
                          "applied": bool(edits)})
            files.append((Path(folder) / name).read_text())
        return turns, files


def keeping_cache(llama: LlamaCppBaseline, params: GenerationParams):
    """`Llama` as its users get it: each prompt reads only what its cache does not share."""
    def generate(prompt: list[int]):
        tokens, stats = llama.generate(prompt, params, keep_cache=True)
        return tokens, stats.decode_s
    return generate


def evict(server: Server) -> None:
    """Another prompt in the server's one slot: nothing of the edit's stays cached."""
    body = {"prompt": list(range(100, 108)), "n_predict": 1, "cache_prompt": True}
    request = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        r.read()


def server_generate(server: Server, params: GenerationParams, is_eog):
    def generate(prompt: list[int]):
        body = {"prompt": prompt, "n_predict": params.max_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": True, "return_tokens": True}
        request = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as r:
            reply = json.load(r)
        tokens = [t for t in reply.get("tokens", []) if not is_eog(t)]
        return tokens, reply.get("timings", {}).get("predicted_ms", 0.0) / 1000
    return generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=str(Path(sysconfig.get_path("stdlib")) / "colorsys.py"))
    ap.add_argument("--target", help="default: the bundled pair's target")
    ap.add_argument("--draft")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=3000)
    ap.add_argument("--llama-server", metavar="BIN", help="also time llama-server (see --server-modes)")
    ap.add_argument("--server-modes", default="default,ngram-mod",
                    help="llama-server configurations: default (plain) and/or any --spec-type (default: %(default)s)")
    ap.add_argument("--exact", action="store_true",
                    help="edgespec with exact kernels; its files compared with plain greedy decoding's on them")
    ap.add_argument("--typing-s", type=float, metavar="S",
                    help="also time edgespec reading the file ahead while the request is written for S seconds")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    source = Path(args.file).read_text()
    name = Path(args.file).name
    requests = rename_requests(source)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.0)
    engine = Recorder(load(args.target, args.draft, n_ctx=args.ctx, n_threads=args.threads, exact=args.exact))
    info = engine.describe()
    print(f"{machine()}; {Path(info.target.path).name} + {Path(info.models['draft'].path).name if 'draft' in info.models else 'no draft'}; "
          f"{name}: {len(source.splitlines())} lines; requests: {[r.format(path=name) for r in requests]}")

    # edgespec's session once, untimed, fixes the prompts every baseline is fed (greedy: the same text).
    engine.prompts.clear()
    run_edgespec(engine, source, name, requests, params)
    prompts = list(engine.prompts)
    exact_files = run_edgespec(engine, source, name, requests, replace(params, mode="plain"))[1] if args.exact else None

    def turn_messages(i, workspace):
        """What the conversation holds of the file at turn `i`: the file as this system left it."""
        from edgespec.chat.attachments import Attachment
        from edgespec.chat.store import Message

        return [Message("user", "", attachments=[Attachment.of(workspace.read(name))])]

    llama = LlamaCppBaseline(info.target.path, n_ctx=args.ctx, n_threads=args.threads, is_eog=engine.is_eog)

    typing = f"edgespec, typing {args.typing_s:g} s" if args.typing_s is not None else None
    systems = {"edgespec": None, **({typing: None} if args.typing_s is not None else {}),
               "Llama": keeping_cache(llama, params)}
    servers = []
    if args.llama_server:
        log_dir = Path(tempfile.mkdtemp(prefix="bench-edit-"))
        threads = str(args.threads or os.cpu_count())
        modes = [m.strip() for m in args.server_modes.split(",") if m.strip()]
        for label, extra in [("llama-server" if m == "default" else f"llama-server {m}",
                              [] if m == "default" else ["--spec-type", m]) for m in modes]:
            server = Server(ServerSpec(label, lambda port, extra=extra: [
                args.llama_server, "-m", info.target.path, "--port", str(port), "-c", str(args.ctx), "-t", threads,
                "-np", "1", "--cache-ram", "0", *extra]), log_dir)
            servers.append((label, server))
    results = {s: [] for s in [*systems, *(label for label, _ in servers)]}
    servers_by_label = dict(servers)
    try:
        for label, server in servers:
            server.start(timeout_s=600)
            systems[label] = server_generate(server, params, engine.is_eog)
        for r in range(args.repeats):
            for system in rotation(list(systems), r):
                # Every system reads turn 1's prompt afresh and keeps its cache into turn 2.
                if system in ("edgespec", typing):
                    engine.reset()
                    turns, files = run_edgespec(engine, source, name, requests, params,
                                                args.typing_s if system == typing else None)
                else:
                    if system == "Llama":
                        llama.llm.reset()
                    else:
                        evict(servers_by_label[system])
                    turns, files = run_tokens(systems[system], prompts, engine.detokenize, source, name,
                                              turn_messages)
                results[system].append({"turns": turns, "files": files})
                print(f"  repeat {r + 1} {system:24s} " + "  ".join(
                    f"turn {i + 1}: {t['s']:.1f} s, {t['tokens'] / max(t['decode_s'], 1e-9):.1f} tok/s"
                    + ("" if t["applied"] else " (no edit)")
                    + (f", accepted {t['accepted']}/{t['drafted']} {t['accepted_by']}" if "drafted" in t else "")
                    for i, t in enumerate(turns)), flush=True)
    finally:
        for _, server in servers:
            server.stop()
        llama.close()

    plain_files = results["Llama"][0]["files"]
    print(f"\nMedians over {args.repeats} repeats ({machine()}):")
    print(f"{'system':24s} {'turn 1 s':>9s} {'turn 2 s':>9s} {'total s':>8s} {'tok/s':>7s} {'vs Llama':>9s} same")
    base = statistics.median(sum(t["s"] for t in run["turns"]) for run in results["Llama"])
    for system, runs in results.items():
        total = statistics.median(sum(t["s"] for t in run["turns"]) for run in runs)
        t1 = statistics.median(run["turns"][0]["s"] for run in runs)
        t2 = statistics.median(run["turns"][1]["s"] for run in runs)
        tps = statistics.median(sum(t["tokens"] for t in run["turns"]) / max(sum(t["decode_s"] for t in run["turns"]), 1e-9)
                                for run in runs)
        same = all(run["files"] == plain_files for run in runs)
        print(f"{system:24s} {t1:9.1f} {t2:9.1f} {total:8.1f} {tps:7.1f} {base / total:8.2f}x {'yes' if same else 'no'}")
    if exact_files is not None:
        same = all(run["files"] == exact_files for run in results["edgespec"])
        print(f"edgespec --exact: applied files {'identical to' if same else 'DIFFERENT from'} "
              f"plain greedy decoding's with the same kernels")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "file": name, "results": results}, indent=1))


if __name__ == "__main__":
    main()
