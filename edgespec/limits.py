"""The ranges and defaults of the generation parameters, written once.

GenerationParams takes its defaults from `LIMITS`; the engine's check
(sampling.check_params), the CLI's options, the app's settings and the
server's request schemas read their bounds from it, so that all of them
refuse and accept the same values.

Pure (the standard library only), so every layer may read it: models.yaml's
schema checks a pair's k against it too.

Where a face's default legitimately differs, it is stated here, beside the
table: the server's reply limit (SERVER_MAX_TOKENS) and the benchmark's
(BENCH_MAX_TOKENS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

MAX_DRAFT = 64
"""The most tokens one cycle drafts: a verify pass holds the last token and the
draft, and 65 tokens is the longest pass the engine runs (choice.FAST_MAX_BATCH;
with exact kernels the engine lowers k further, to the batches measured exact).
An edit that copies a file is accepted in runs of 64 and more; on a 2-core CPU a
65-token pass costs 1.2 s at 3,000 tokens of context, 19 ms a token, against 25
for a 17-token pass and 52 for one token (bundled 1.5B, Zen 4), so auto, which
prices every length, takes long drafts where the runs are long."""

MAX_CTX = 2**24
"""The largest context: llama.cpp's n_ctx is 32 bits (a larger one wrapped around to
a small context, or asked for terabytes), and no model is trained past millions. No
reply is longer than its context, so this is the most max tokens allows too."""

MAX_TOP_K = 1_000_000
"""The largest top-k: above the largest vocabularies (Gemma's 262,144 tokens),
where top-k keeps every token, as 0 does; a larger one is a typo."""

MAX_SEED = 2**32 - 2
"""The largest seed: llama.cpp's sampler (the benchmark's llama.cpp baseline) takes a
32-bit seed, wrapping a larger one around (2^32 is 0), and reads 2^32 - 1
(LLAMA_DEFAULT_SEED) as a new random seed each time, which breaks a seed's promise.
numpy's Generator, which samples the engine's replies, takes any seed from 0."""


def ascii_number(text: str, *, what: str = "") -> str:
    """`text`, where it is written in ASCII; ValueError (naming `what`, where given) where it
    is not: int() and float() read '٤٠' and '４０' as 40, digits a keyboard layout or a pasted
    text put there rather than a number meant. The CLI and the app read the numbers people
    type through it."""
    if not text.isascii():
        named = f"{what}: " if what else ""
        raise ValueError(f"{named}expected a number written with the digits 0-9, got {text!r}")
    return text


def _number(value: float) -> str:
    """2, 0.5, 16,777,216: whole numbers in full, with thousands separated."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Limit:
    """The range and default of one generation parameter."""

    label: str
    """How messages name it ("top-p")."""
    low: float | None
    high: float | None
    default: float | int | None
    help: str
    """What its values mean, for people ("0 = greedy")."""
    above_low: bool = False
    """The low end itself is refused (top-p: above 0)."""

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # NaN fails every comparison anyway
            return False
        if self.low is not None and (value <= self.low if self.above_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def range(self) -> str:
        """'from 0 to 2', 'at least 1', 'above 0 and at most 1'."""
        low = f"{'above' if self.above_low else 'at least'} {_number(self.low)}" if self.low is not None else ""
        if self.high is None:
            return low
        if self.low is not None and not self.above_low:
            return f"from {_number(self.low)} to {_number(self.high)}"
        return f"{low} and at most {_number(self.high)}" if low else f"at most {_number(self.high)}"

    def check(self, value: float | None) -> None:
        """Raise ValueError naming the parameter, its range and the value (None: not set, allowed)."""
        if value is not None and not self.allows(value):
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"  # a seed in full, not 4.29497e+09
            raise ValueError(f"{self.label} must be {self.range()} ({self.help}), got {shown}")


LIMITS = MappingProxyType({
    "k": Limit("k", 0, MAX_DRAFT, MAX_DRAFT, "most tokens drafted per cycle; auto chooses up to this many; 0 = none"),
    "temperature": Limit("temperature", 0.0, 2.0, 0.0, "0 = greedy"),  # OpenAI's range
    "top_k": Limit("top-k", 0, MAX_TOP_K, 0, "0 = off"),
    "top_p": Limit("top-p", 0.0, 1.0, 1.0, "1 = off", above_low=True),
    "seed": Limit("seed", 0, MAX_SEED, None, "the same seed gives the same reply; none = a new one each time"),
    "max_tokens": Limit("max tokens", 1, MAX_CTX, 512, "the longest reply, in tokens"),
})
"""Per GenerationParams field: its range and default."""

SERVER_MAX_TOKENS = None
"""The server's reply limit for a request that sets none: until the context is full,
as OpenAI's API (a client that wants less says so); the CLI's other commands and the
app stop at LIMITS["max_tokens"].default."""

BENCH_MAX_TOKENS = 128
"""`edgespec bench`'s reply length: enough tokens to measure speed, few enough to run
a prompt suite in every mode, several times."""
