#!/usr/bin/env python3
"""The editing-session workload against a running OpenAI-compatible server.

A ~150-line Python file, then turns of "change X and return the whole file",
each request carrying the whole conversation so far (as editors and chat UIs
send it). Prints, per turn, the prompt size, how much of it the server had
cached (when it says: edgespec's and llama-server's `timings.cache_n`), the
time to first token and the decode speed.

    edgespec serve --pair NAME &            # or: llama-server -m target.gguf -md draft.gguf --port 8080
    python scripts/bench_server.py --url http://127.0.0.1:8080/v1

By default the assistant turns sent back are the server's own replies; with
--fixed they are a fixed reference text instead (the file with the edits made
by hand), so that every server is sent the same requests whatever it
generated. scripts/bench_server_vs_llamacpp.py runs edgespec and llama-server
side by side on that fixed session.

Any OpenAI-compatible server works; compare two by running this against each
(one at a time, on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

SYSTEM = ("You are a careful programmer. When asked for a change, reply with the whole updated file in one "
          "```python block and nothing else.")

EDITS = [
    "Rename the function `parse_line` to `parse_record` everywhere.",
    "Change the default tax rate from 0.2 to 0.25.",
    "Make `format_report` list the items sorted by name.",
    "Add a docstring to `Inventory.total_value`.",
    "Make `load_items` skip lines that start with '#'.",
]

EDITED = [
    [("parse_line", "parse_record")],
    [("DEFAULT_TAX_RATE = 0.2\n", "DEFAULT_TAX_RATE = 0.25\n")],
    [("    for item in inventory.items:\n        lines.append",
      "    for item in sorted(inventory.items, key=lambda i: i.name):\n        lines.append")],
    [("    def total_value(self, tax_rate: float = DEFAULT_TAX_RATE) -> float:\n",
      ("    def total_value(self, tax_rate: float = DEFAULT_TAX_RATE) -> float:\n"
       '        """The value of all items with tax, rounded to cents."""\n'))],
    [("csv.reader(f) if row]", "csv.reader(line for line in f if not line.startswith(\"#\")) if row]")],
]
"""Each edit of EDITS made by hand: (old, new) replacements, every old text present."""


def source_file() -> str:
    """A plausible 150-line module to edit."""
    head = '''"""Inventory tools: read items from CSV, price them, print a report."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TAX_RATE = 0.2


@dataclass
class Item:
    name: str
    quantity: int
    unit_price: float
    tags: list[str] = field(default_factory=list)

    def price(self, tax_rate: float = DEFAULT_TAX_RATE) -> float:
        return round(self.quantity * self.unit_price * (1 + tax_rate), 2)


def parse_line(row: list[str]) -> Item:
    name, quantity, unit_price, *tags = row
    return Item(name.strip(), int(quantity), float(unit_price), [t.strip() for t in tags if t.strip()])


def load_items(path: Path) -> list[Item]:
    with open(path, newline="") as f:
        return [parse_line(row) for row in csv.reader(f) if row]


class Inventory:
    def __init__(self, items: list[Item] | None = None):
        self.items = list(items or [])

    def add(self, item: Item) -> None:
        self.items.append(item)

    def remove(self, name: str) -> None:
        self.items = [i for i in self.items if i.name != name]

    def find(self, name: str) -> Item | None:
        return next((i for i in self.items if i.name == name), None)

    def total_value(self, tax_rate: float = DEFAULT_TAX_RATE) -> float:
        return round(sum(i.price(tax_rate) for i in self.items), 2)

    def tagged(self, tag: str) -> list[Item]:
        return [i for i in self.items if tag in i.tags]

    def low_stock(self, threshold: int = 5) -> list[Item]:
        return [i for i in self.items if i.quantity < threshold]


def format_report(inventory: Inventory) -> str:
    lines = [f"{'name':20} {'qty':>5} {'price':>10}"]
    for item in inventory.items:
        lines.append(f"{item.name:20} {item.quantity:>5} {item.price():>10.2f}")
    lines.append(f"{'total':20} {'':>5} {inventory.total_value():>10.2f}")
    return "\\n".join(lines)
'''
    helpers = []
    for n, (verb, what) in enumerate([("count", "quantity"), ("cheapest", "unit_price"), ("dearest", "unit_price"),
                                      ("biggest", "quantity"), ("median", "quantity")]):
        helpers.append(f'''

def {verb}_{what}(inventory: Inventory) -> float:
    """The {verb} {what.replace('_', ' ')} over the inventory (0 when it is empty)."""
    values = sorted(getattr(i, "{what}") for i in inventory.items)
    if not values:
        return 0.0
    if "{verb}" in ("cheapest", "smallest"):
        return float(values[0])
    if "{verb}" in ("dearest", "biggest"):
        return float(values[-1])
    if "{verb}" == "median":
        return float(values[len(values) // 2])
    return sum(values) / len(values)
''')
    tail = '''

def main(argv: list[str] | None = None) -> int:
    import sys

    args = argv if argv is not None else sys.argv[1:]
    if not args:
        print("usage: inventory.py FILE.csv", file=sys.stderr)
        return 2
    inventory = Inventory(load_items(Path(args[0])))
    print(format_report(inventory))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''
    return head + "".join(helpers) + tail


def edited_files(code: str | None = None) -> list[str]:
    """The file after each edit of EDITS, made by hand (each builds on the one before)."""
    versions = []
    code = source_file() if code is None else code
    for edit in EDITED:
        for old, new in edit:
            if old not in code:
                raise ValueError(f"the reference edit expects {old!r} in the file")
            code = code.replace(old, new)
        versions.append(code)
    return versions


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def first_request(code: str, system: str = SYSTEM) -> list[dict]:
    """The conversation's first request: the file and the first edit."""
    ask = f"Here is inventory.py:\n\n{fenced(code)}\n\n{EDITS[0]} Return the whole file."
    return [{"role": "system", "content": system}, {"role": "user", "content": ask}]


def edit_request(turn: int) -> dict:
    return {"role": "user", "content": f"{EDITS[turn]} Return the whole file."}


def fixed_session(turn: int, *, system: str = SYSTEM) -> list[dict]:
    """The request of turn `turn` (0-based) of the fixed session: the history's
    assistant turns are the reference replies (the edited files), never what a
    server generated, so every server is sent exactly these messages."""
    if not 0 <= turn < len(EDITS):
        raise ValueError(f"the session has turns 0 to {len(EDITS) - 1} (got {turn})")
    messages = first_request(source_file(), system)
    for t, code in enumerate(edited_files()[:turn]):
        messages += [{"role": "assistant", "content": fenced(code)}, edit_request(t + 1)]
    return messages


def run_turn(client, model: str, messages: list[dict], max_tokens: int, *, clock=time.perf_counter) -> dict:
    """Stream one reply. TTFT: from sending the request to the first content
    text. tokens_per_s: the reply's tokens after the first (the count from the
    server's `usage`, else the content chunks) over the time after it."""
    start = clock()
    first = None
    parts, usage, timings = [], None, None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = clock()
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
        extra = chunk.model_extra or {}
        timings = extra.get("timings") or timings
    end = clock()
    n = usage.completion_tokens if usage else len(parts)
    decode_s = end - first if first is not None else 0.0
    return {
        "text": "".join(parts),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": timings.get("cache_n") if timings else None,
        "completion_tokens": n,
        "counted_by": "usage" if usage else "chunks",
        "ttft_s": (first or end) - start,
        "total_s": end - start,
        "tokens_per_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
        "server_tokens_per_s": timings.get("predicted_per_second") if timings else None,
        "drafted": timings.get("draft_n") if timings else None,
        "accepted": timings.get("draft_n_accepted") if timings else None,
        "acceptance": (timings["draft_n_accepted"] / timings["draft_n"]
                       if timings and timings.get("draft_n") else None),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1", help="the server's OpenAI base URL")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", help="default: the first the server lists")
    ap.add_argument("--turns", type=int, default=len(EDITS), help=f"edit turns after the file (at most {len(EDITS)})")
    ap.add_argument("--max-tokens", type=int, default=2048, help="per reply (the whole file is ~1500 tokens)")
    ap.add_argument("--fixed", action="store_true",
                    help="send the reference replies as the assistant turns, not the server's own")
    ap.add_argument("--pause", type=float, default=0.0, metavar="S",
                    help="seconds between a reply and the next request (a person reading it, a tool "
                         "running), which a server may use to read ahead; not counted")
    ap.add_argument("--json", metavar="FILE", help="also write the per-turn results here")
    args = ap.parse_args(argv)

    import openai

    client = openai.OpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=3600)
    model = args.model or next(iter(client.models.list())).id
    code = source_file()
    messages = first_request(code)
    print(f"{args.url} · model {model} · file {code.count(chr(10))} lines", file=sys.stderr)
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'reply':>6} {'TTFT s':>7} {'tok/s':>7} {'accept':>7}")
    results = []
    for turn in range(min(args.turns, len(EDITS))):
        if turn and args.pause:
            time.sleep(args.pause)
        if args.fixed:
            messages = fixed_session(turn)
        elif turn:
            messages.append(edit_request(turn))
        r = run_turn(client, model, messages, args.max_tokens)
        messages.append({"role": "assistant", "content": r.pop("text")})
        results.append(r)
        cached = "?" if r["cached_tokens"] is None else r["cached_tokens"]
        accept = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        print(f"{turn + 1:>4} {r['prompt_tokens'] or '?':>7} {cached:>7} {r['completion_tokens']:>6} "
              f"{r['ttft_s']:>7.2f} {r['tokens_per_s']:>7.1f} {accept:>7}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "model": model, "turns": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
