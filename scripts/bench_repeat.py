#!/usr/bin/env python3
"""Repeated work played as its users play it (issue 32, "a drafter that remembers"):
does the lookup pool, which remembers earlier conversations, make the next ones faster?

Three scenarios, run in this order by every system, so that the pool fills from
one to the next as it would for a user:

  coding   6 requests, each a new conversation (as an editor integration sends
           them), for similar small Python parsers and their pytest tests
  agent    10 requests, each a new conversation whose system message restates the
           same JSON tool schema, each answered with one JSON tool call
  chat     4 free-chat questions on unrelated topics in one conversation: the
           control, where remembering should cost nothing

Systems, interleaved per repeat (edgespec.bench.rotation), medians over repeats:

  edgespec pool  the chat layer (a ChatSession per conversation, stored in a
                 temporary ConversationStore, so each turn is remembered as the app
                 remembers it), the lookup pool on in a new, empty folder per
                 repeat (a freshly loaded engine: load time untimed)
  edgespec       the same models and settings, the pool off: edgespec before it
                 (both edgespec systems load a new engine per repeat: neither
                 starts with what auto learnt or the cache kept in an earlier run)
  Llama          plain llama.cpp through llama-cpp-python's `Llama`, greedy, fed the
                 prompt tokens edgespec sent; it keeps what its cache shares with the
                 next prompt, as `Llama` does by itself (--llama-reset conversation:
                 read every conversation from the start)
  llama-server   (with --llama-server BIN) llama.cpp's server, one per
                 --server-modes entry (--spec-type ngram-mod, ngram-cache), `-np 1`,
                 fed the same tokens on /completion with its prompt cache, started
                 anew for each repeat (load untimed): a server kept running would
                 start a repeat with the last one's identical prompts in its RAM
                 cache and, with ngram-mod, its identical replies in its n-gram pool

edgespec (pool off) first plays every scenario once, untimed: the prompts it sends
(holding its own replies) are what the baselines are fed, so that every system reads
the same text. Timed per scenario: seconds from sending each request to its last
token (the prompt read included), summed; tokens generated; decode tokens/s; for
edgespec the accepted draft tokens by source ("pool", "lookup", "draft").

With --ceiling it also prints, per scenario, how fast decoding could be at best on
this machine drafting from the reply's context and the pool: the fastest schedule of
plain passes and verified proposals of prompt lookup and the pool (filled as the app
fills it) that knows in advance which proposals the target accepts, and the speed of
one where every token is drafted right (passes of 17). No policy over these drafters
beats the first; no drafter at all the second.

About 25 minutes on a 2-core CPU with the bundled pair and 5 systems x 3 repeats:

    .venv/bin/python scripts/bench_repeat.py
    .venv/bin/python scripts/bench_repeat.py --llama-server /tmp/cppbuild/bin/llama-server --json repeat.json
    .venv/bin/python scripts/bench_repeat.py --target SMALL.gguf --repeats 1 --max-tokens-scale 0.1
    .venv/bin/python scripts/bench_repeat.py --ceiling --repeats 1 --scenarios coding,agent

A --target given without --draft loads no draft model. The goals of issue 32 are
printed under the table with whether these figures meet them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from _common import Recorder, Server, ServerSpec, load
from bench_edit import keeping_cache, server_generate

from edgespec.bench import LlamaCppBaseline, machine, rotation
from edgespec.chat import ChatSession
from edgespec.chat.store import ConversationStore
from edgespec.engine.costs import Costs, measure_pass
from edgespec.engine.drafters import PoolLookup, PromptLookup
from edgespec.engine.events import GenerationParams
from edgespec.engine.replay import proposal_ceiling
from edgespec.engine.suffix import SuffixIndex
from edgespec.load import kv_cache

POOL, OFF, LLAMA = "edgespec pool", "edgespec", "Llama"
POOL_MIB = 64

# -- the scenarios --------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    system: str | None
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    conversations: tuple[Conversation, ...]
    max_tokens: int
    """Per reply, before --max-tokens-scale."""


PARSERS = [  # (function, return type, what the list holds): alike, as one afternoon's requests are
    ("parse_int_list", "list[int]", "integers such as `1, 2, -3`"),
    ("parse_float_list", "list[float]", "decimal numbers such as `1.5, -2, 3e4`"),
    ("parse_bool_list", "list[bool]", "booleans written true/false, yes/no or 1/0, in any case"),
    ("parse_date_list", "list[datetime.date]", "ISO dates such as `2024-01-31, 2024-02-29`"),
    ("parse_time_list", "list[datetime.time]", "times of day such as `09:30, 17:05`"),
    ("parse_version_list", "list[tuple[int, int, int]]", "versions such as `1.2.3, 0.10.0`"),
]

CODING_REQUEST = ("Write a Python function `{name}(text: str) -> {returns}` that parses a comma-separated list "
                  "of {what}. Ignore spaces around items and empty items, and raise ValueError naming the first "
                  "bad item. Then write pytest tests for it: a normal case, an empty string and a bad item. "
                  "Reply with the code only.")

TOOLS = [
    {"name": "search_files", "description": "Find files in the project whose text matches a regular expression.",
     "parameters": {"type": "object", "properties": {
         "pattern": {"type": "string", "description": "a Python regular expression"},
         "glob": {"type": "string", "description": "which files, e.g. \"src/**/*.py\""}},
         "required": ["pattern"]}},
    {"name": "read_file", "description": "Read a text file of the project.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string", "description": "relative to the project root"},
         "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
         "required": ["path"]}},
    {"name": "run_command", "description": "Run a shell command in the project root and return its output.",
     "parameters": {"type": "object", "properties": {
         "command": {"type": "string"}, "timeout_s": {"type": "integer", "description": "default 60"}},
         "required": ["command"]}},
    {"name": "write_file", "description": "Create or replace a text file of the project.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "content": {"type": "string"}},
         "required": ["path", "content"]}},
]

AGENT_SYSTEM = ("You are a coding agent working in a Python project. You act only through these tools:\n"
                + json.dumps(TOOLS, indent=1) +
                "\nAnswer every request with exactly one tool call and nothing else, as one JSON object: "
                "{\"tool\": \"<name>\", \"arguments\": {...}}")

AGENT_TASKS = [
    "Find where the function load_config is defined.",
    "Show me the first 40 lines of src/app/main.py.",
    "Run the test suite with pytest, quietly.",
    "Find every TODO comment in the Python files under src.",
    "Read lines 100 to 160 of src/app/store.py.",
    "Create the file docs/CHANGES.md with a heading \"Changes\" and one line \"- first release\".",
    "Check which version of Python the project runs with.",
    "Find the tests that mention the word timeout.",
    "Read the file pyproject.toml.",
    "Run ruff check on the src folder with a timeout of 120 seconds.",
]

CHAT_QUESTIONS = (
    "Why is the sky blue during the day but red at sunset?",
    "Give me three tips for keeping basil alive on a windowsill.",
    "What was the Hanseatic League, in a few sentences?",
    "How does a bicycle stay upright when it moves?",
)


def scenarios() -> dict[str, Scenario]:
    """The scenarios by name, in the order each system plays them."""
    coding = tuple(Conversation(None, (CODING_REQUEST.format(name=n, returns=r, what=w),)) for n, r, w in PARSERS)
    agent = tuple(Conversation(AGENT_SYSTEM, (task,)) for task in AGENT_TASKS)
    chat = (Conversation(None, CHAT_QUESTIONS),)
    return {"coding": Scenario("coding", coding, 192), "agent": Scenario("agent", agent, 96),
            "chat": Scenario("chat", chat, 96)}


def params_for(scenario: Scenario, scale: float) -> GenerationParams:
    return GenerationParams(max_tokens=max(1, round(scenario.max_tokens * scale)), temperature=0.0)


# -- the systems --------------------------------------------------------------------------


def load_edgespec(args, pool: Path | None):
    """An engine as the CLI loads it; the lookup pool in `pool` (None: off). Both
    edgespec systems get the same cache settings but the pool: one sequence, no
    snapshots (each request starts a conversation; none is switched back to)."""
    cache = kv_cache(parallel=1, ram_mib=0, disk_mib=0, pool_mib=POOL_MIB if pool else 0)
    return load(args.target, args.draft, n_ctx=args.ctx, n_threads=args.threads, cache=replace(cache, pool=pool))


def pool_tokens(engine) -> int:
    """Tokens the engine's lookup pool holds (0: none, or no pool)."""
    pool = getattr(engine, "_pool", None)
    return pool.index.n_tokens if pool is not None else 0


def play_chat(engine, scenario: Scenario, params: GenerationParams, store: ConversationStore) -> dict:
    """The scenario through the chat layer: a new stored ChatSession per conversation
    (an unstored one is not remembered), each turn timed from sending to its last chunk."""
    turns = []
    for conversation in scenario.conversations:
        session = ChatSession(engine, store=store, params=params, system_prompt=conversation.system)
        for text in conversation.turns:
            start = time.perf_counter()
            last = None
            for last in session.send(text):
                pass
            stats = last.stats
            turns.append({"s": time.perf_counter() - start, "tokens": stats.generated_tokens,
                          "decode_s": stats.decode_s, "drafted": stats.drafted, "accepted": stats.accepted,
                          "accepted_by": dict(stats.accepted_by or {})})
    return summed(turns)


def play_tokens(generate, conversations: list[list[list[int]]], start_conversation) -> dict:
    """A baseline fed the recorded prompts, conversation by conversation; its replies are not fed back."""
    turns = []
    for prompts in conversations:
        start_conversation()
        for prompt in prompts:
            start = time.perf_counter()
            tokens, decode_s = generate(prompt)
            turns.append({"s": time.perf_counter() - start, "tokens": len(tokens), "decode_s": decode_s})
    return summed(turns)


def summed(turns: list[dict]) -> dict:
    """A scenario's figures: its turns' seconds, tokens and decode seconds summed, accepted tokens by source."""
    by_source = collections.Counter()
    for t in turns:
        for source, n in t.get("accepted_by", {}).items():
            by_source[source.split("/")[0]] += n  # "pool/conversation" -> "pool": the drafter, not the region
    out = {"s": sum(t["s"] for t in turns), "tokens": sum(t["tokens"] for t in turns),
           "decode_s": sum(t["decode_s"] for t in turns), "turn_s": [round(t["s"], 3) for t in turns]}
    if turns and "drafted" in turns[0]:
        out.update(drafted=sum(t["drafted"] for t in turns), accepted=sum(t["accepted"] for t in turns),
                   accepted_by=dict(by_source))
    return out


def llama_servers(args, target: str) -> list[tuple[str, Server]]:
    """One llama-server per --server-modes entry (not started), on the target alone, with
    edgespec's context and threads."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-repeat-"))
    threads = str(args.threads or os.cpu_count())
    servers = []
    for mode in (m.strip() for m in args.server_modes.split(",") if m.strip()):
        extra = [] if mode == "default" else ["--spec-type", mode]
        label = "llama-server" if mode == "default" else f"llama-server {mode}"
        server = Server(ServerSpec(label, lambda port, extra=extra: [
            args.llama_server, "-m", target, "--port", str(port), "-c", str(args.ctx), "-t", threads,
            "-np", "1", *extra]), log_dir)
        servers.append((label, server))
    return servers


# -- how fast it could be ------------------------------------------------------------------------

CEILING_K = 16


class ReplyRecorder(Recorder):
    """A Recorder that also keeps the tokens of each reply."""

    def __init__(self, engine):
        super().__init__(engine)
        self.replies: list[list[int]] = []

    def generate(self, tokens, params, **kwargs):
        reply: list[int] = []
        self.replies.append(reply)
        for chunk in super().generate(tokens, params, **kwargs):
            reply += chunk.tokens
            yield chunk


def pass_costs(engine) -> Costs:
    """This machine's target passes over 1 to CEILING_K + 1 tokens."""
    target = engine.target_seq
    target.sync(engine.prompts[0][:-1])
    return Costs({n: measure_pass(target, n, repeats=3) for n in range(1, CEILING_K + 2)}, {})


def ceilings(conversations: list[list[tuple[list[int], list[int]]]], costs: Costs) -> dict[str, float]:
    """Decode speedups over plain of the fastest schedule drafting from the context and
    the pool (which holds each conversation once a turn of it is over, as the app's
    does), knowing which proposals are accepted; and of drafting every token right.
    `conversations`: each one's turns, (prompt, reply) tokens."""
    index, lookup = SuffixIndex(), PromptLookup()
    pool = PoolLookup(index)
    proposers = [lambda h: lookup.match(h, CEILING_K, skip=True)[0],
                 lambda h: pool.offer(h, CEILING_K).proposal or []]
    plain = best = perfect = 0.0
    for c, turns in enumerate(conversations):
        for prompt, reply in turns:
            plain += max(len(reply) - 1, 0) * costs.target_pass(1)
            best += proposal_ceiling(prompt, reply, costs, CEILING_K, proposers)
            perfect += sum(costs.target_pass(min(CEILING_K, len(reply) - 1 - at) + 1)
                           for at in range(1, len(reply), CEILING_K + 1))
            index.add(f"conversation:{c}", [*prompt, *reply])
    return {"context_and_pool": plain / best, "every_token_right": plain / perfect}


# -- the run ----------------------------------------------------------------------------------


def record(engine: Recorder, chosen: list[Scenario], scale: float) -> dict[str, list[list[list[int]]]]:
    """edgespec (pool off) plays every scenario once, untimed: per scenario, per
    conversation, the prompt tokens of its turns (what the baselines are fed)."""
    prompts = {}
    with tempfile.TemporaryDirectory(prefix="bench-repeat-record-") as folder:
        store = ConversationStore(Path(folder) / "chats.db")
        try:
            for scenario in chosen:
                engine.prompts.clear()
                play_chat(engine, scenario, params_for(scenario, scale), store)
                flat = iter(engine.prompts)
                if len(engine.prompts) != sum(len(c.turns) for c in scenario.conversations):
                    raise RuntimeError(f"{scenario.name}: one generate per turn expected, got {len(engine.prompts)}")
                prompts[scenario.name] = [[next(flat) for _ in c.turns] for c in scenario.conversations]
        finally:
            store.close()
    return prompts


def run_edgespec(engine, chosen: list[Scenario], scale: float) -> dict[str, dict]:
    """Every scenario in order through the chat layer, with its own store (the pool, if on, fills as it goes)."""
    with tempfile.TemporaryDirectory(prefix="bench-repeat-store-") as folder:
        store = ConversationStore(Path(folder) / "chats.db")
        try:
            return {s.name: play_chat(engine, s, params_for(s, scale), store) for s in chosen}
        finally:
            store.close()


def run_fresh(args, chosen: list[Scenario], *, pool: bool) -> dict[str, dict]:
    """An edgespec system's repeat on a newly loaded engine (load untimed), so that both
    start alike: nothing learnt by auto or held in the KV cache from an earlier run; with
    `pool`, a new, empty pool (else it would hold the previous repeat's replies,
    identical under greedy decoding: a win no user gets)."""
    with tempfile.TemporaryDirectory(prefix="bench-repeat-pool-") as folder:
        engine = load_edgespec(args, Path(folder) if pool else None)
        try:
            if pool_tokens(engine):
                raise RuntimeError("the lookup pool is not empty at the start of a repeat")
            out = run_edgespec(engine, chosen, args.max_tokens_scale)
            if pool:
                out["pool_tokens"] = pool_tokens(engine)
            return out
        finally:
            engine.close()


def line(system: str, r: int, runs: dict[str, dict]) -> str:
    parts = []
    for name, run in runs.items():
        if name == "pool_tokens":
            continue
        text = f"{name}: {run['s']:.1f} s, {run['tokens'] / max(run['decode_s'], 1e-9):.1f} tok/s"
        if "drafted" in run:
            text += f", accepted {run['accepted']}/{run['drafted']} {run['accepted_by']}"
        parts.append(text)
    pool = f"  (pool: {runs['pool_tokens']} tokens)" if "pool_tokens" in runs else ""
    return f"  repeat {r + 1} {system:24s} " + "  ".join(parts) + pool


def medians(runs: list[dict]) -> dict:
    by_source = collections.defaultdict(list)
    for run in runs:
        for source in run.get("accepted_by", {}):
            by_source[source].append(run["accepted_by"][source])
    return {"s": statistics.median(r["s"] for r in runs),
            "tps": statistics.median(r["tokens"] / max(r["decode_s"], 1e-9) for r in runs),
            "tokens": statistics.median(r["tokens"] for r in runs),
            "accepted_by": {k: statistics.median(v + [0] * (len(runs) - len(v))) for k, v in by_source.items()}}


GOALS = {"coding": (1.5, 1.25), "agent": (1.5, 1.25), "chat": (0.97, None)}
"""Issue 32's goals for edgespec pool, per scenario: at least this times Llama's time to the
last token, and at least this times edgespec's with the pool off (None: no goal); coding and
agent also ahead of llama-server's n-gram modes."""


def report(results: dict[str, dict[str, list[dict]]], chosen: list[Scenario], repeats: int) -> None:
    print(f"\nMedians over {repeats} repeats ({machine()}); time to the last token, prompt read included:")
    for scenario in chosen:
        table = {system: medians([run[scenario.name] for run in runs]) for system, runs in results.items()}
        print(f"\n{scenario.name}: {sum(len(c.turns) for c in scenario.conversations)} requests")
        print(f"{'system':26s} {'total s':>8s} {'tokens':>7s} {'tok/s':>7s} {'vs Llama':>9s} {'vs pool off':>11s}"
              "  accepted by source")
        for system, m in table.items():
            vs_off = f"{table[OFF]['s'] / m['s']:10.2f}x" if system == POOL else " " * 11
            print(f"{system:26s} {m['s']:8.1f} {m['tokens']:7.0f} {m['tps']:7.1f} "
                  f"{table[LLAMA]['s'] / m['s']:8.2f}x {vs_off}  {m['accepted_by'] or ''}")
        print("  goal: " + goal(scenario.name, table))


def goal(name: str, table: dict[str, dict]) -> str:
    """Whether edgespec pool meets issue 32's goal for this scenario, in figures."""
    vs_llama, vs_off = GOALS[name]
    pool = table[POOL]["s"]
    checks = [(f">= {vs_llama}x Llama", table[LLAMA]["s"] / pool >= vs_llama)]
    if vs_off is not None:
        checks.append((f">= {vs_off}x pool off", table[OFF]["s"] / pool >= vs_off))
        checks += [(f"ahead of {s}", pool < m["s"]) for s, m in table.items() if s.startswith("llama-server")]
    return ", ".join(f"{text}: {'met' if ok else 'NOT met'}" for text, ok in checks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="default: the bundled pair's target (and its draft)")
    ap.add_argument("--draft", help="default: with --target none, else the bundled pair's")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--scenarios", default=",".join(scenarios()),
                    help="comma-separated, played in the order coding, agent, chat (default: %(default)s)")
    ap.add_argument("--max-tokens-scale", type=float, default=1.0,
                    help="times each reply's token limit (coding 192, agent 96, chat 96); e.g. 0.1 for a smoke run")
    ap.add_argument("--llama-reset", choices=["run", "conversation"], default="run",
                    help="when Llama's cache is emptied: at the start of each system's run (it keeps the prefix "
                         "one prompt shares with the next, as `Llama` does), or of each conversation")
    ap.add_argument("--llama-server", metavar="BIN", help="also time llama-server (see --server-modes)")
    ap.add_argument("--server-modes", default="ngram-mod,ngram-cache",
                    help="llama-server configurations: default (plain) and/or any --spec-type (default: %(default)s)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also print how fast decoding could be at best, drafting from the context and the pool")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(wanted) - set(scenarios())
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; choose from {list(scenarios())}")
    chosen = [s for name, s in scenarios().items() if name in wanted]

    engine = ReplyRecorder(load_edgespec(args, None))
    info = engine.describe()
    models = f"{Path(info.target.path).name} + " + (
        Path(info.models["draft"].path).name if "draft" in info.models else "no draft")
    print(f"{machine()}; {models}; scenarios: " + ", ".join(
        f"{s.name} ({len(s.conversations)} conversations, {params_for(s, args.max_tokens_scale).max_tokens} tokens)"
        for s in chosen), flush=True)

    prompts = record(engine, chosen, args.max_tokens_scale)
    bounds = {}
    if args.ceiling:
        costs, replies = pass_costs(engine), iter(engine.replies)
        for s in chosen:
            bounds[s.name] = ceilings([[(prompt, next(replies)) for prompt in conversation]
                                       for conversation in prompts[s.name]], costs)
            print(f"  {s.name}: decode at best {bounds[s.name]['context_and_pool']:.2f}x plain drafting from the "
                  f"context and the pool, knowing which proposals are accepted; "
                  f"{bounds[s.name]['every_token_right']:.2f}x with every token drafted right "
                  f"(pass of 1: {costs.target_pass(1) * 1e3:.0f} ms, of {CEILING_K + 1}: "
                  f"{costs.target_pass(CEILING_K + 1) * 1e3:.0f} ms)", flush=True)
    llama = LlamaCppBaseline(info.target.path, n_ctx=args.ctx, n_threads=args.threads, is_eog=engine.is_eog)
    servers = llama_servers(args, info.target.path) if args.llama_server else []
    try:
        for _, server in servers:  # inside the try: one that fails to start stops those started
            server.start(timeout_s=600)

        def baseline(system: str) -> dict[str, dict]:
            out = {}
            for s in chosen:
                params = params_for(s, args.max_tokens_scale)
                if system == LLAMA:
                    generate = keeping_cache(llama, params)
                    each = llama.llm.reset if args.llama_reset == "conversation" else (lambda: None)
                else:
                    generate, each = server_generate(dict(servers)[system], params, engine.is_eog), (lambda: None)
                out[s.name] = play_tokens(generate, prompts[s.name], each)
            return out

        systems = [POOL, OFF, LLAMA, *(label for label, _ in servers)]
        results = {s: [] for s in systems}
        for r in range(args.repeats):
            for system in rotation(systems, r):
                if system in (POOL, OFF):
                    runs = run_fresh(args, chosen, pool=system == POOL)
                else:
                    if system == LLAMA:
                        llama.llm.reset()  # repeats independent: nothing kept from the previous run
                    elif r > 0:  # a new server: nothing kept from the previous repeat (see the docstring)
                        server = dict(servers)[system]
                        server.stop()
                        server.start(timeout_s=600)
                    runs = baseline(system)
                results[system].append(runs)
                print(line(system, r, runs), flush=True)
    finally:
        for _, server in servers:
            server.stop()
        llama.close()
        engine.close()

    report(results, chosen, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "models": models, "args": vars(args),
                                               "results": results, "ceilings": bounds}, indent=1))


if __name__ == "__main__":
    main()
