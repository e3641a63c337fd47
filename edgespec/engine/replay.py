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
model could be if it knew in advance which guesses the target accepts;
`best_fixed` the fastest fixed mode and k for one reply, chosen in hindsight,
and `best_setting` the one setting fastest over a whole suite.
`replay_suite` sets the three beside auto for each trace of a suite, and
MACHINES holds the cost profiles of the machines the tests replay.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.engine.auto import AutoPolicy
from edgespec.engine.cache import common_prefix_length
from edgespec.engine.choice import ACCEPTANCE_PRIORS
from edgespec.engine.costs import Costs
from edgespec.engine.decoder import speculative_steps
from edgespec.engine.policy import FixedPolicy, Policy
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
    target_confidence: list[float] | None = None
    """The target's own top probability at each reply position (None: not recorded).
    Free to a policy, since the target computes it for every token it emits; over a
    reply it tracks how often the draft model agrees (0.68 on chat, 0.91 on code, 0.99
    on a reformat for the bundled pair)."""

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
    history it missed; with `charge_prefill`, for reading the prompt too (the
    engine reads it once the first token is out: part of the wait for the reply,
    which fixed draft modes pay on every prompt and auto where it warms the model)."""

    name = "draft"

    def __init__(self, costs: Costs, *, charge_prefill: bool = False, read_ahead_but: int | None = None):
        self.costs = costs
        self.charge_prefill = charge_prefill
        self.read_ahead_but = read_ahead_but
        """The chat's reading ahead (Engine.read): each prompt is read into the policy's
        drafters before its reply, on no reply's clock, all but its last `read_ahead_but`
        tokens (the word being written and the template's tail). None: no reading
        ahead (a prompt sent whole, as to the server)."""
        self.trace: Trace | None = None
        self.clock = SimulatedClock()
        self.tokens: list[int] = []
        """What its KV cache holds."""

    def start(self, trace: Trace, clock: SimulatedClock) -> None:
        self.trace, self.clock, self.tokens = trace, clock, []

    def prefill(self, prompt):
        if self.charge_prefill:
            self.clock.advance(self.costs.catch_up(self.name, self.behind(prompt)))
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
    (the prompt's own processing not counted; the draft's reading of it only where
    `draft` charges its prefill).
    Greedy: the trace is the target's greedy reply. Prompt lookup costs nothing."""
    clock = SimulatedClock()
    draft.start(trace, clock)
    if draft.read_ahead_but is not None:  # while the prompt was written: no reply waits for it
        draft.clock = SimulatedClock()
        policy.read_ahead(trace.prompt[: max(len(trace.prompt) - draft.read_ahead_but, 0)])
        draft.clock = clock
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

    def draft_runs(i: int):
        run = trace.draft_run(i)
        return [(costs.draft("draft", k), min(run, k)) for k in range(1, k_max + 1)]

    return proposal_ceiling(trace.prompt, trace.reply, costs, k_max,
                            [lambda history: lookup.match(history, k_max, skip=True)[0]], draft_runs)


def proposal_ceiling(prompt: Sequence[int], reply: Sequence[int], costs: Costs, k_max: int,
                     proposers: Sequence, runs=None) -> float:
    """Seconds of the fastest schedule of plain passes and verified drafts that knows
    which guesses will be accepted: at each position of `reply`, plain, or any
    length up to k_max of what each of `proposers` (history -> tokens, free to make)
    proposes there, or of `runs(i)`'s drafts ((drafting seconds, tokens right) for
    each length, from 1). A bound no policy over these drafters can beat."""
    n_reply = len(reply)
    best = [0.0] * (n_reply + 1)
    history, proposals = list(prompt), []  # one list, grown as a decode loop grows it (lookup follows it)
    for token in reply:
        proposals.append([list(propose(history))[:k_max] for propose in proposers])
        history.append(token)
    for i in range(n_reply - 1, -1, -1):
        options = [costs.target_pass(1) + best[i + 1]]
        for proposal in proposals[i]:
            agreed = 0
            for k in range(1, len(proposal) + 1):
                if agreed == k - 1 and i + agreed < n_reply and proposal[k - 1] == reply[i + agreed]:
                    agreed += 1
                options.append(costs.target_pass(k + 1) + best[min(i + agreed + 1, n_reply)])
        for k, (draft_s, right) in enumerate(runs(i) if runs else [], start=1):
            options.append(costs.target_pass(k + 1) + draft_s + best[min(i + right + 1, n_reply)])
        best[i] = min(options)
    return best[1] if n_reply else 0.0  # the first token comes with the prompt's pass


def fixed_settings(trace: Trace, costs: Costs, k_max: int, draft: ReplayedDraft,
                   lookup: PromptLookup | None = None) -> dict[tuple[str, int], float]:
    """Seconds of every fixed setting for this reply, by (mode, k): plain (k 0), and
    draft or lookup with a k of 1 to k_max, each as `--mode M --k K` decodes it."""
    lookup = lookup or PromptLookup()
    seconds = {("plain", 0): plain_seconds(trace, costs)}
    for mode, drafter in (("draft", draft), ("lookup", lookup)):
        for k in range(1, k_max + 1):
            seconds[(mode, k)] = replay(FixedPolicy(drafter, k), trace, costs, draft)
    return seconds


def best_fixed(trace: Trace, costs: Costs, k_max: int, draft: ReplayedDraft,
               lookup: PromptLookup | None = None) -> tuple[str, int, float]:
    """(mode, k, seconds) of the fastest fixed setting for this reply, chosen in
    hindsight (of equal ones, plain, then the draft model, then the shorter k)."""
    (mode, k), seconds = _fastest(fixed_settings(trace, costs, k_max, draft, lookup))
    return mode, k, seconds


def steady_best_fixed(settings: dict[tuple[str, int], float]) -> tuple[tuple[str, int], float]:
    """The fastest fixed setting for a reply with the luck of one k taken out, and its
    seconds: each drafting setting counts the mean of its k and the k on either side
    (itself where there is none). On a short reply one k can end its drafts just where
    the edits are (lookup k=5 on fix-typo: 1.63x where k=4 and k=6 give 1.44x and
    1.51x); the best fixed mode in hindsight takes that luck, which no policy choosing
    before it has seen the reply can count on."""
    def steady(mode: str, k: int) -> float:
        own = settings[(mode, k)]
        if mode == "plain":
            return own
        return (settings.get((mode, k - 1), own) + own + settings.get((mode, k + 1), own)) / 3
    return _fastest({setting: steady(*setting) for setting in settings})


def _fastest(seconds: dict[tuple[str, int], float]) -> tuple[tuple[str, int], float]:
    """The setting of least seconds, and those seconds (of equal ones, the first)."""
    return min(seconds.items(), key=lambda item: item[1])


@dataclass
class SuiteRow:
    """One reply of a suite replayed on one machine."""

    name: str
    plain_s: float
    auto_s: float
    fixed_mode: str
    """The fastest fixed mode for this reply in hindsight, with fixed_k."""
    fixed_k: int
    fixed_s: float
    ceiling_s: float
    settings: dict[tuple[str, int], float] = field(default_factory=dict)
    """Seconds of every fixed setting for this reply, by (mode, k) (fixed_settings)."""

    @property
    def auto(self) -> float:
        """Speedup over plain decoding (also `fixed`, `ceiling`)."""
        return self.plain_s / self.auto_s

    @property
    def fixed(self) -> float:
        return self.plain_s / self.fixed_s

    @property
    def ceiling(self) -> float:
        return self.plain_s / self.ceiling_s

    @property
    def steady_s(self) -> float:
        """Seconds of the best fixed mode with the luck of one k taken out (steady_best_fixed)."""
        return steady_best_fixed(self.settings)[1]

    @property
    def steady(self) -> float:
        return self.plain_s / self.steady_s


def replay_suite(traces: Sequence[Trace], costs: Costs, k: int, *, charge_warming: bool = False,
                 read_ahead_but: int | None = None) -> list[SuiteRow]:
    """Each trace replayed under `costs`: auto (one AutoPolicy for the suite, as in
    the app, starting from a copy of the costs as calibrated), the best fixed mode
    and the ceiling, all drafting at most k tokens a cycle (within the largest
    pass the costs know). `charge_warming`: the draft model's reading of each prompt
    is paid for (ReplayedDraft.charge_prefill), by auto and the fixed modes alike;
    the ceiling keeps it warm for free. `read_ahead_but`: the chat's reading ahead
    (ReplayedDraft.read_ahead_but), for auto and the fixed modes alike."""
    k = min(k, max(costs.target) - 1)
    draft = ReplayedDraft(costs, charge_prefill=charge_warming, read_ahead_but=read_ahead_but)
    lookup = PromptLookup()
    rows = []
    for trace, auto_s in zip(traces, replay_auto(traces, costs, k, charge_warming=charge_warming,
                                                 read_ahead_but=read_ahead_but)):
        settings = fixed_settings(trace, costs, k, draft, lookup)
        (mode, fixed_k), fixed_s = _fastest(settings)
        rows.append(SuiteRow(trace.name, plain_seconds(trace, costs), auto_s, mode, fixed_k, fixed_s,
                             ceiling(trace, costs, k, lookup), settings))
    return rows


def best_setting(rows: Sequence[SuiteRow]) -> tuple[tuple[str, int], float]:
    """The one fixed setting fastest over the whole suite, chosen in hindsight, and its
    seconds: what a user who types the best `--mode M --k K` for every reply gets."""
    totals: dict[tuple[str, int], float] = {}
    for row in rows:
        for setting, seconds in row.settings.items():
            totals[setting] = totals.get(setting, 0.0) + seconds
    return _fastest(totals)


def replay_auto(traces: Sequence[Trace], costs: Costs, k: int, *, charge_warming: bool = False,
                read_ahead_but: int | None = None, policy: type[AutoPolicy] = AutoPolicy) -> list[float]:
    """Auto's seconds for each trace, in order: one AutoPolicy for them all (as in the
    app, starting from a copy of the costs as calibrated), drafting at most k tokens
    (`policy`: AutoPolicy or a variant of it, to replay what a change would do)."""
    draft = ReplayedDraft(costs, charge_prefill=charge_warming, read_ahead_but=read_ahead_but)
    auto = policy(costs.fresh(), [PromptLookup(), draft], k_max=min(k, max(costs.target) - 1),
                  priors=ACCEPTANCE_PRIORS)
    return [replay(auto, trace, costs, draft) for trace in traces]


def _linear(single: float, column: float, sizes=(1, 2, 3, 4, 5, 9, 17)) -> dict[int, float]:
    return {n: single + column * (n - 1) for n in sizes}


MACHINES = {
    # name: (target pass by size, draft token, draft catch-up per token), in seconds
    "cpu 2 threads": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .010, .0035),
    "cpu 1 thread": ({1: .065, 2: .100, 3: .120, 5: .160, 9: .270, 17: .490}, .019, .0065),
    "cpu exact kernels": ({1: .045, 2: .075, 3: .090, 4: .110, 5: .125, 7: .170}, .010, .0035),
    "dear draft": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .025, .008),
    "cheap draft": ({1: .035, 2: .052, 3: .062, 4: .072, 5: .085, 9: .140, 17: .250}, .004, .0012),
    "no batching gain": (_linear(.035, .035), .010, .0035),
    "cpu kernel blocks": ({1: .106, 2: .164, 3: .219, 4: .194, 5: .237, 8: .358, 9: .386, 16: .450, 17: .536},
                          .0315, .0093),
    "gpu": (_linear(.010, .0002), .002, .0002),
    "slow link": (_linear(.040, .0008), .010, .0035),
}
"""Cost profiles of the machines auto mode is replayed on (tests/test_replay.py,
scripts/speculation_ceiling.py --machine): CPUs whose verify column costs
a third to a half of a pass, a CPU with exact kernels (short passes only), draft
models dear and cheap, a machine where batching gains nothing, a slow CPU whose
kernels work in blocks of 4 columns (a 4-token pass cheaper than a 3-token one, as
calibrated on a 2-core Xeon: only 3-token drafts pay there), a GPU, and RPC over a
slow link."""


def machine_costs(name: str) -> Costs:
    """The Costs of one of MACHINES."""
    target, draft, catch_up = MACHINES[name]
    return Costs(target, {"draft": draft, "lookup": 0.0}, {"draft": catch_up})
