"""Replaying a policy on a recorded reply, free of machine noise.

A `Trace` holds a prompt, the target's plain greedy reply to it, and what the
draft model guessed (and how sure it was) at every position of that reply.
Given the costs of a machine (`Costs`: target passes by size, a draft token,
a draft model's catch-up), `replay` tells how long a policy takes to produce
that reply there, so that one recorded suite tests auto mode against many
machines: cheap or dear drafts, flat (GPU) or steep (CPU) verify curves.

`replay` runs the decoder's own loop (decoder.speculative_steps), with the
trace standing in for the models (`RecordedTarget`, `ReplayedDraft`) and a
`SimulatedClock` that they advance by what each pass would cost: what is
replayed is what the engine does, cycle for cycle.

`ceiling` is the fastest any per-cycle choice of plain, lookup or the draft
model could be if it knew in advance which guesses the target accepts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.engine.cache import common_prefix_length
from edgespec.engine.costs import Costs
from edgespec.engine.decoder import speculative_steps
from edgespec.engine.policy import Policy
from edgespec.engine.drafters import Draft, Drafter, PromptLookup, too_unsure
from edgespec.engine.events import GenerationParams


@dataclass
class Trace:
    """One prompt's plain greedy reply and the draft model's guesses along it."""

    name: str
    prompt: list[int]
    reply: list[int]
    guess: list[int]
    """The draft model's greedy guess for each reply position, having read all before it."""
    confidence: list[float]
    """Its top probability there."""

    def draft_run(self, i: int) -> int:
        """How many draft guesses from reply position i on are right in a row."""
        n = 0
        while i + n < len(self.reply) and self.guess[i + n] == self.reply[i + n]:
            n += 1
        return n


def save_traces(traces: Sequence[Trace], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(t) for t in traces], separators=(",", ":")))


def load_traces(path: str | Path) -> list[Trace]:
    return [Trace(**t) for t in json.loads(Path(path).read_text())]


class SimulatedClock:
    """Seconds on the replayed machine: the decoder reads it as its clock, the
    replayed models advance it by what they would have taken."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


class RecordedTarget:
    """The target's KV sequence as the decoder uses it (tokens, room, extend,
    logits, truncate), replaying a trace: each row of logits has the reply's
    token at that position as its argmax, and each pass costs what `costs` says."""

    def __init__(self, trace: Trace, costs: Costs, clock: SimulatedClock):
        self.costs, self.clock = costs, clock
        self.text = [*trace.prompt, *trace.reply]
        """What the target says: the prompt, then its greedy reply."""
        self.tokens = list(trace.prompt)
        self.room = len(trace.reply) + 1  # the reply fits (the decoder stops it at max_tokens)
        self._ramp = np.arange(max(self.text, default=0) + 1, dtype=np.float32)
        self._batch = 1  # the prompt's last token was read last

    def extend(self, tokens: Sequence[int], *, all_logits: bool = False) -> None:
        self.tokens += tokens
        self._batch = len(tokens)
        self.clock.advance(self.costs.target_pass(len(tokens)))

    def logits(self, i: int) -> np.ndarray:
        """Row i of the last batch: the target's next token after it (rows past
        a wrong draft token, or past the reply, are never read for their argmax
        but must exist)."""
        at = len(self.tokens) - self._batch + (i % self._batch) + 1
        token = self.text[at] if at < len(self.text) else 0
        return self._ramp[: token + 1]  # an increasing row: its argmax is its last entry

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


class ReplayedDraft(Drafter):
    """The draft model, replayed from a trace: greedy, stopping as the real one
    does (p_min, p_draft), and paying on the clock for its steps and to read the
    history it missed."""

    name = "draft"

    def __init__(self, costs: Costs):
        self.costs = costs
        self.trace: Trace | None = None
        self.clock = SimulatedClock()
        self.tokens: list[int] = []
        """What its KV cache holds."""

    def start(self, trace: Trace, clock: SimulatedClock) -> None:
        self.trace, self.clock, self.tokens = trace, clock, []

    def prefill(self, prompt):
        self.tokens = list(prompt)

    def behind(self, history):
        return len(history) - common_prefix_length(self.tokens, history)

    def rewind(self, history):
        del self.tokens[common_prefix_length(self.tokens, history):]

    def propose(self, history, k, params, rng):
        trace = self.trace
        caught_up = self.behind(history)
        self.tokens = list(history)
        i = len(history) - len(trace.prompt)
        out: list[int] = []
        whole = 1.0
        for j in range(i, min(i + k, len(trace.reply))):
            whole *= trace.confidence[j]
            if too_unsure(trace.confidence[j], whole, params):
                break
            out.append(trace.guess[j])
            if trace.guess[j] != trace.reply[j]:
                out += [-1] * (k - len(out))  # what it guesses after a miss is unknown; it is rejected anyway
                break
        self.tokens += out[:-1]  # it reads each guess but the last to make the next
        catch_up_s = self.costs.catch_up(self.name, caught_up)  # a steady cycle's reading is in its step cost
        steps = len(out) + (len(out) < k)  # a draft that stopped itself paid for the step that stopped it
        self.clock.advance(self.costs.draft(self.name, steps) + catch_up_s)
        return Draft(out, caught_up=caught_up, catch_up_s=catch_up_s)


def replay(policy: Policy, trace: Trace, costs: Costs, draft: ReplayedDraft,
           params: GenerationParams | None = None) -> float:
    """Decode seconds the policy takes to produce trace.reply under `costs`
    (the prompt's own processing, and the draft's reading of it, not counted).
    Greedy: the trace is the target's greedy reply. Prompt lookup costs nothing."""
    clock = SimulatedClock()
    draft.start(trace, clock)
    params = replace(params or GenerationParams(), temperature=0.0, max_tokens=len(trace.reply))
    steps = speculative_steps(RecordedTarget(trace, costs, clock), list(trace.prompt), params, policy,
                              is_eog=lambda token: False, rng=np.random.default_rng(0), clock=clock)
    for _ in steps:
        pass
    return clock.seconds


def plain_seconds(trace: Trace, costs: Costs) -> float:
    return max(len(trace.reply) - 1, 0) * costs.target_pass(1)  # the first token comes with the prompt's pass


def ceiling(trace: Trace, costs: Costs, k_max: int, lookup: PromptLookup | None = None) -> float:
    """Seconds of the fastest schedule that knows which guesses will be accepted
    (the draft model always warm: its catch-up is not charged)."""
    lookup = lookup or PromptLookup()
    reply, n_reply = trace.reply, len(trace.reply)
    best = [0.0] * (n_reply + 1)
    for i in range(n_reply - 1, -1, -1):
        options = [costs.target_pass(1) + best[i + 1]]
        proposal, _ = lookup.match(trace.prompt + reply[:i], k_max, skip=True)
        agreed = 0
        for k in range(1, len(proposal) + 1):
            if agreed == k - 1 and i + agreed < n_reply and proposal[k - 1] == reply[i + agreed]:
                agreed += 1
            options.append(costs.target_pass(k + 1) + best[min(i + agreed + 1, n_reply)])
        run = trace.draft_run(i)
        for k in range(1, k_max + 1):
            options.append(costs.target_pass(k + 1) + costs.draft("draft", k)
                           + best[min(i + min(run, k) + 1, n_reply)])
        best[i] = min(options)
    return best[1] if n_reply else 0.0  # the first token comes with the prompt's pass
