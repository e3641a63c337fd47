#!/usr/bin/env python3
"""Speculation hiding the network: plain and auto decoding with the target on
llama.cpp RPC workers, at several network delays.

Starts `edgespec worker`s on loopback ports and, between edgespec and each
worker, a TCP relay that holds every chunk for half the round-trip delay in
each direction (the kernel here has no netem qdisc). For each delay it loads
the target split over the workers (the draft stays local), runs each prompt in
plain and auto mode, greedy, and reports tok/s, their ratio, whether auto's
output equals plain's, round trips per generated token (a round trip: the
client sends, then the worker answers) and kB the workers sent per token (the
relays add latency, not a bandwidth limit: with the output layer on a worker,
every position a pass verifies brings back n_vocab logits, 4 bytes each). With --llama-server, llama.cpp's own
server over the same relays (plain) is the reference row.

    .venv/bin/python scripts/bench_rpc.py --delays 0,1,5
    .venv/bin/python scripts/bench_rpc.py --prompts-limit 1 --max-tokens 32 --delays 5   # a smoke test

Everything is bounded: relays and workers stop when the script ends, and the
relay thread stops by itself after --max-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import Server, ServerSpec, free_port, load
from edgespec.bench import load_prompts
from edgespec.chat.template import chat_template
from edgespec.engine.events import GenerationParams
from edgespec.chat.words import placement_line
from edgespec.engine.runtime import Engine
from edgespec.net import Endpoint, Split
from edgespec.models.fetch import resolve_model, resolve_pair

# -- the relay ---------------------------------------------------------------------

class Relay:
    """127.0.0.1:port -> a worker, every chunk held `delay_s` in each direction.
    Counts round trips: a worker's answer that follows something the client sent."""

    def __init__(self, worker: Endpoint, delay_s: float, loop: asyncio.AbstractEventLoop):
        self.worker, self.delay_s, self.loop = worker, delay_s, loop
        self.round_trips = 0
        self.received = 0
        """Bytes the worker sent (logits, when the output layer is there)."""
        self._client_spoke = False
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.worker.host, self.worker.port)
        except OSError:
            writer.close()
            return
        for sock in (writer, up_writer):
            sock.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pump(reader, up_writer, upstream=True),
                             self._pump(up_reader, writer, upstream=False), return_exceptions=True)

    async def _pump(self, reader, writer, *, upstream: bool) -> None:
        """Read chunks as they come; deliver each delay_s after it arrived, in order."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(1 << 16):
                if upstream:
                    self._client_spoke = True
                else:
                    self.received += len(data)
                    if self._client_spoke:
                        self.round_trips += 1
                        self._client_spoke = False
                queue.put_nowait((self.loop.time() + self.delay_s, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((0, None))
            try:
                await sender
            except (ConnectionError, OSError):
                pass
            writer.close()


class Relays:
    """One relay per worker on an event loop thread that ends by itself after max_s."""

    def __init__(self, workers: list[Endpoint], rtt_ms: float, *, max_s: float):
        self.loop = asyncio.new_event_loop()
        self.relays = [Relay(w, rtt_ms / 2000.0, self.loop) for w in workers]
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        for relay in self.relays:
            asyncio.run_coroutine_threadsafe(relay.start(), self.loop).result(10)
        self._timer = threading.Timer(max_s, self.close)
        self._timer.daemon = True
        self._timer.start()

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(Endpoint("127.0.0.1", r.port) for r in self.relays)

    def round_trips(self) -> int:
        return sum(r.round_trips for r in self.relays)

    def received(self) -> int:
        return sum(r.received for r in self.relays)

    def close(self) -> None:
        """Stop listening, drop the connections, end the loop thread."""
        self._timer.cancel()
        if not self.loop.is_running():
            return

        async def shutdown() -> None:
            asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)  # cancelled pumps
            for relay in self.relays:
                relay.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


# -- workers -------------------------------------------------------------------------

def start_workers(n: int, threads: int, *, rpc_server: str | None) -> list[tuple[subprocess.Popen, Endpoint]]:
    started = []
    for _ in range(n):
        port = free_port()
        if rpc_server:
            cmd = [rpc_server, "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)]
        else:
            cmd = [sys.executable, "-m", "edgespec", "worker", "--port", str(port), "--threads", str(threads)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append((proc, Endpoint("127.0.0.1", port)))
    for proc, endpoint in started:
        wait_for_port(endpoint, proc)
    return started


def wait_for_port(endpoint: Endpoint, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the worker on {endpoint} exited with {proc.returncode}")
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"the worker on {endpoint} did not listen within {timeout:.0f} s")


# -- runs ----------------------------------------------------------------------------

def run_edgespec(engine: Engine, tokens: list[int], mode: str, args, relays: Relays) -> dict:
    params = GenerationParams(mode=mode, k=args.k, max_tokens=args.max_tokens)
    engine.reset()
    out, last = [], None
    trips, received = relays.round_trips(), relays.received()
    for last in engine.generate(tokens, params):
        out += last.tokens
    trips, received = relays.round_trips() - trips, relays.received() - received
    s = last.stats
    return {"tokens": out, "tps": s.tokens_per_s, "trips_per_token": trips / max(1, len(out)),
            "kb_per_token": received / 1000 / max(1, len(out)),
            "acceptance": s.acceptance_rate, "tokens_per_pass": s.tokens_per_pass, "drafter": s.drafter,
            "k": s.k, "reason": s.reason}


def run_llama_server(args, target: Path, relays: Relays, prompts: list[str]) -> list[dict]:
    rpc = ",".join(str(e) for e in relays.endpoints)
    server = Server(ServerSpec("llama-server", lambda port: [
        args.llama_server, "-m", str(target), "--rpc", rpc, "-ngl",
        str(args.n_gpu_layers if args.n_gpu_layers >= 0 else 999), "--port", str(port), "--host", "127.0.0.1",
        "-c", str(args.ctx), "-t", str(args.threads), "--no-warmup", "-np", "1"]), Path(tempfile.mkdtemp()))
    rows = []
    try:
        try:
            server.start(120)
        except RuntimeError as e:
            print(f"  llama-server did not start; no reference row ({e})", file=sys.stderr)
            return []
        for prompt in prompts:
            body = json.dumps({"prompt": prompt, "n_predict": args.max_tokens, "temperature": 0, "top_k": 1,
                               "cache_prompt": False}).encode()
            trips = relays.round_trips()
            req = urllib.request.Request(f"{server.url}/completion", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                reply = json.load(r)
            n = reply["timings"]["predicted_n"]
            rows.append({"tps": reply["timings"]["predicted_per_second"],
                         "trips_per_token": (relays.round_trips() - trips) / max(1, n)})
    finally:
        server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None, help="registry pair (default: the bundled one)")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--delays", default="0,1,5", help="round-trip delays in ms (default 0,1,5)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="target layers on the workers (default all)")
    ap.add_argument("--local-output", action="store_true",
                    help="keep the target's output layer here (logits do not cross the relays)")
    ap.add_argument("--categories", default="grounded,free-form")
    ap.add_argument("--prompts-limit", type=int, default=0, help="at most this many prompts per category")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="threads per worker and for this process")
    ap.add_argument("--rpc-server", metavar="PATH", help="llama.cpp's rpc-server binary for the workers "
                    "(default: edgespec worker)")
    ap.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server for the reference row")
    ap.add_argument("--max-seconds", type=float, default=3600, help="relays stop by themselves after this")
    ap.add_argument("--json", metavar="FILE", help="write the results here")
    args = ap.parse_args()

    if args.target:
        target = resolve_model(args.target)
        draft = resolve_model(args.draft) if args.draft else None
    else:
        target, draft, _ = resolve_pair(args.pair)
    if args.llama_server and not Path(args.llama_server).exists():
        print(f"no {args.llama_server}: no llama.cpp reference row", file=sys.stderr)
        args.llama_server = None
    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    prompts = []
    for category in categories:
        found = load_prompts(categories=[category])
        prompts += found[:args.prompts_limit] if args.prompts_limit else found
    delays = [float(d) for d in args.delays.split(",")]

    workers = start_workers(args.workers, args.threads, rpc_server=args.rpc_server)
    results = []
    try:
        for delay in delays:
            relays = Relays([e for _, e in workers], delay, max_s=args.max_seconds)
            try:
                split = Split(relays.endpoints, local_output=args.local_output)
                with load(target, draft, n_ctx=args.ctx, n_threads=args.threads, rpc=split,
                          n_gpu_layers=args.n_gpu_layers) as engine:
                    info = engine.describe()
                    print(f"\n== {delay:g} ms round trip; target {placement_line(info)}", flush=True)
                    engine.auto(GenerationParams(mode="auto", k=args.k))  # auto calibrates once, before the clock
                    template = chat_template(engine)
                    texts = [template.render([{"role": "user", "content": p.prompt}]) for p in prompts]
                    rows = []
                    for prompt, text in zip(prompts, texts):
                        tokens = engine.tokenize(text, special=True)
                        plain = run_edgespec(engine, tokens, "plain", args, relays)
                        auto = run_edgespec(engine, tokens, "auto", args, relays)
                        row = {"delay_ms": delay, "prompt": prompt.id, "category": prompt.category,
                               "plain_tps": plain["tps"], "auto_tps": auto["tps"],
                               "ratio": auto["tps"] / plain["tps"] if plain["tps"] else float("nan"),
                               "plain_trips_per_token": plain["trips_per_token"],
                               "auto_trips_per_token": auto["trips_per_token"],
                               "plain_kb_per_token": plain["kb_per_token"], "auto_kb_per_token": auto["kb_per_token"],
                               "identical": auto["tokens"] == plain["tokens"],
                               "auto_chose": f"{auto['drafter'] or 'plain'} k={auto['k']}",
                               "auto_reason": auto["reason"],
                               "tokens_per_pass": auto["tokens_per_pass"]}
                        rows.append(row)
                        print(f"  {prompt.category:10s} {prompt.id:22s} plain {row['plain_tps']:6.1f} tok/s "
                              f"({row['plain_trips_per_token']:.1f} trips/tok, {row['plain_kb_per_token']:.0f} kB/tok)"
                              f"  auto {row['auto_tps']:6.1f} tok/s ({row['auto_trips_per_token']:.1f} trips/tok, "
                              f"{row['auto_kb_per_token']:.0f} kB/tok, {row['auto_chose']}, "
                              f"{row['tokens_per_pass']:.2f} tok/pass)  x{row['ratio']:.2f}  "
                              f"{'same output' if row['identical'] else 'OUTPUT DIFFERS'}", flush=True)
                if args.llama_server:
                    for row, ref in zip(rows, run_llama_server(args, target, relays, texts)):
                        row["llama_server_tps"] = ref["tps"]
                        row["llama_server_trips_per_token"] = ref["trips_per_token"]
                        print(f"  {row['category']:10s} {row['prompt']:22s} llama-server --rpc plain "
                              f"{ref['tps']:6.1f} tok/s ({ref['trips_per_token']:.1f} trips/tok)", flush=True)
                results += rows
            finally:
                relays.close()
    finally:
        for proc, _ in workers:
            proc.terminate()
        for proc, _ in workers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    print("\nsummary (medians)")
    for delay in delays:
        for category in categories:
            rows = [r for r in results if r["delay_ms"] == delay and r["category"] == category]
            if not rows:
                continue
            med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
            ref = (f"; llama-server plain {med('llama_server_tps'):.1f} tok/s"
                   if all("llama_server_tps" in r for r in rows) else "")
            print(f"  {delay:g} ms {category:10s} plain {med('plain_tps'):6.1f}  auto {med('auto_tps'):6.1f}  "
                  f"x{med('ratio'):.2f}  trips/tok plain {med('plain_trips_per_token'):.1f} auto "
                  f"{med('auto_trips_per_token'):.1f}  identical {sum(r['identical'] for r in rows)}/{len(rows)}"
                  f"{ref}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
