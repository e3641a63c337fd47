#!/usr/bin/env python3
"""Does the chat app's screen cost decode speed? The same reply, in the app and headless.

Loads the models once and alternates: a one-message chat through ChatSession
alone (what `edgespec chat --once` and `generate` do), and the same message
sent in the Textual app (headless, its screen drawn as usual), on the same
engine, mode and settings. Both report the engine's own decode speed (every
token over decode time); the ratio app / headless should be about 1.

    .venv/bin/python scripts/bench_app.py [--mode plain] [--max-tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edgespec.bench import machine, rotation
from edgespec.chat.session import ChatSession
from edgespec.chat.store import ConversationStore
from edgespec.cli.options import add_model_options, engine_from_args
from edgespec.engine.events import GenerationParams
from edgespec.tui.app import EdgespecApp
from edgespec.tui.library import ModelChoice
from edgespec.tui.chat_settings import ChatSettings
from edgespec.tui.widgets.prompt_input import PromptInput

MESSAGE = ("Write a Python module with a dataclass for a bank account (deposit, withdraw, history) "
           "and explain each method in a short paragraph with Markdown headings.")


def headless(engine, params: GenerationParams) -> float:
    """Decoded on a thread of its own, as the app's worker does: llama.cpp's
    OpenMP threads belong to the thread that first decodes, and decoding on the
    main thread first slowed every later decode on another thread (~0.75x)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_headless, engine, params).result()


def _headless(engine, params: GenerationParams) -> float:
    engine.reset()
    chat = ChatSession(engine, system_prompt=ChatSettings().system_prompt, params=params)
    last = None
    for last in chat.send(MESSAGE):
        pass
    return last.stats.tokens_per_s


async def in_app(engine, settings: ChatSettings, folder: Path) -> float:
    engine.reset()
    with ConversationStore(folder / "chats.db") as store:
        app = EdgespecApp(ModelChoice(target="loaded"), store=store, load=lambda choice, s, progress: engine,
                          defaults=settings, defaults_path=folder / "settings.yaml", export_dir=folder)
        async with app.run_test(size=(120, 40)):
            while app.model_state != "ready":
                await asyncio.sleep(0.05)
            prompt = app.query_one(PromptInput)
            prompt.load_text(MESSAGE)
            prompt.post_message(PromptInput.Submitted(MESSAGE))
            await asyncio.sleep(0.5)
            while app.chat.generating:
                await asyncio.sleep(0.05)
            stats = store.messages(app.chat.conversation_id)[-1].stats
            await asyncio.sleep(0.5)  # the reply's end starts a reading ahead (the next turn's head): let it end
            while any(w.group == "read-ahead" and not w.is_finished for w in app.workers):
                await asyncio.sleep(0.05)
            app.engine = None  # the engine is ours: the app must not close it, nor use it after this
    return stats.tokens_per_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--mode", default="plain")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = ChatSettings(mode=args.mode, max_tokens=args.max_tokens)
    with engine_from_args(args) as engine, tempfile.TemporaryDirectory() as tmp:
        print(f"{machine()}; mode {args.mode}, {args.max_tokens} tokens")
        ratios = []
        for r in range(args.repeats):
            tps = {}
            for face in rotation(("headless", "app"), r):
                tps[face] = (headless(engine, settings.params()) if face == "headless"
                             else asyncio.run(in_app(engine, settings, Path(tmp))))
            ratios.append(tps["app"] / tps["headless"])
            print(f"repeat {r + 1}: headless {tps['headless']:.1f} tok/s, app {tps['app']:.1f} tok/s, "
                  f"app/headless {ratios[-1]:.3f}", flush=True)
        print(f"median app/headless: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
