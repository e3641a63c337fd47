#!/usr/bin/env python3
"""The chat list's search, typed key by key, on a store of synthetic conversations.

Builds a conversation store (N chats of M messages of made-up words, the same for a
seed) in a temporary folder, then times ConversationStore.list(search=...) for each
prefix of each query, as the sidebar asks while a user types; prints the time per
query, in total and per key (median of the repeats), and how long opening the store
took (the first open of a store written by an older edgespec includes building what
search reads).

    .venv/bin/python scripts/bench_search.py
    .venv/bin/python scripts/bench_search.py --chats 3000 --messages 10 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from edgespec.machine import cpu_name
from edgespec.chat.store import ConversationStore, Message

WORDS = ("model draft token cache context layer batch thread python server request reply accept "
         "verify sample window prompt lookup suffix index memory kernel quantize tensor weight "
         "speculative decoding latency throughput benchmark attention softmax gradient vector "
         "function class module import return value error message string number list object").split()
SYLLABLES = "ka lo mi ne ru sa te vo ba di fe gu ho ji ku".split()


def vocabulary(rng: random.Random, size: int = 5000) -> tuple[list[str], list[float]]:
    """WORDS, then made-up words, with Zipf's weights (1/rank): a few words are in most
    messages and most words in few, as in people's text."""
    words = list(WORDS)
    while len(words) < size:
        words.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return words, [1 / rank for rank in range(1, len(words) + 1)]


QUERIES = ("speculat", "zzq", "Ker", "thread pool")
"""Typed one key at a time: a word most chats hold, one no chat holds, a word's middle in
another case, and two words."""


def build(path: Path, *, chats: int, messages: int, words: int, seed: int) -> None:
    rng = random.Random(seed)
    vocab, weights = vocabulary(rng)
    with ConversationStore(path) as store:
        for i in range(chats):
            turns = [Message("user" if j % 2 == 0 else "assistant",
                             " ".join(rng.choices(vocab, weights, k=rng.randint(words // 2, words * 3 // 2))))
                     for j in range(messages)]
            store.create(title=f"Chat {i}: {' '.join(rng.choices(vocab, weights, k=2))}", messages=turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=10, help="messages per chat")
    parser.add_argument("--words", type=int, default=100, help="words per message, on average")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", type=Path, help="an existing store to search (not written)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store
        if path is None:
            path = Path(tmp) / "conversations.db"
            start = time.perf_counter()
            build(path, chats=args.chats, messages=args.messages, words=args.words, seed=args.seed)
            print(f"built {args.chats} chats x {args.messages} messages in {time.perf_counter() - start:.1f} s, "
                  f"{path.stat().st_size / 2**20:.0f} MiB")
        start = time.perf_counter()
        store = ConversationStore(path)
        print(f"opened in {time.perf_counter() - start:.2f} s (schema version {store.schema_version}); {cpu_name()}, "
              f"{os.cpu_count()} cores")
        with store:
            for query in QUERIES:
                keys = [query[:n] for n in range(1, len(query) + 1)]
                times: dict[str, list[float]] = {key: [] for key in keys}
                found: dict[str, int] = {}
                for _ in range(args.repeats):
                    for key in keys:
                        start = time.perf_counter()
                        found[key] = len(store.list(search=key))
                        times[key].append(time.perf_counter() - start)
                medians = {key: statistics.median(t) for key, t in times.items()}
                per_key = "  ".join(f"{key!r}:{medians[key] * 1000:.0f}ms/{found[key]}" for key in keys)
                print(f"{query!r}: {sum(medians.values()):.2f} s for {len(keys)} keys  ({per_key})")


if __name__ == "__main__":
    main()
