"""Auto mode: before each cycle, the drafter and k that maximise expected tokens
per second from costs measured on this machine (engine/costs.py) and acceptance
measured online, plain decoding included; exploration paid from a ledger of
what drafting saved against plain decoding.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple, Sequence

from edgespec.engine.costs import Costs
from edgespec.engine.drafters import Drafter, Offer
from edgespec.engine.policy import Bucket, CycleReport, Plan, Policy


def expected_drafted(continuation: float, k: int) -> float:
    """Tokens a drafter that goes on with probability `continuation` at each
    step (a draft model stops when unsure of its next guess) drafts of k."""
    if continuation >= 1.0:
        return float(k)
    return continuation * (1.0 - continuation ** k) / (1.0 - continuation)


def expected_verify(costs: Costs, continuation: float, ks: Sequence[int]) -> list[float]:
    """Seconds of the target pass checking a draft of up to k tokens, for each k of
    `ks` (ascending, each once), from a drafter that goes on with probability
    `continuation` at each step: the pass over 1 + d tokens, averaged over the d it
    drafts (d < k with probability c^d (1 - c), k with c^k). A pass costs less a
    token the longer it is, so the pass over the mean length would overprice a draft
    model that stops itself when unsure."""
    if continuation >= 1.0:
        return [costs.target_pass(1 + k) for k in ks]
    by_k, partial, reach = [], 0.0, 1.0  # reach: the probability of drafting at least d tokens
    wanted = iter(ks)
    k = next(wanted, None)
    for d in range(ks[-1] + 1 if ks else 0):
        single = costs.target_pass(1 + d)
        if d == k:
            by_k.append(partial + reach * single)
            k = next(wanted, None)
        partial += reach * (1.0 - continuation) * single
        reach *= continuation
    return by_k


K_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""The draft lengths auto prices (and k_max itself, and those whose passes the
calibration measured): between them the expected rate changes by little, and
pricing every length to 64 for every drafter each cycle would cost plain
decoding's cycles a millisecond."""


def k_choices(k_max: int, measured: tuple[int, ...] = ()) -> list[int]:
    """The lengths of K_GRID up to k_max, k_max, and the drafts that `measured`
    passes verify (one token fewer): where a machine's kernels work in blocks, the
    pass that fills a block may cost less than a shorter one (costs.pass_sizes),
    and interpolating between sizes would not show it."""
    return list(_k_choices(k_max, measured))


@functools.lru_cache(maxsize=256)
def _k_choices(k_max: int, measured: tuple[int, ...]) -> tuple[int, ...]:
    """k_choices, made once for each k_max and calibration: auto asks every cycle."""
    if k_max <= 0:
        return ()
    return tuple(sorted({k for k in (*K_GRID, *(n - 1 for n in measured)) if 0 < k < k_max} | {k_max}))


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one cycle yields when each of k drafts is accepted with probability
    `acceptance` until the first rejection, plus the target's own token
    (Leviathan et al. 2023): (1 - a^(k+1)) / (1 - a)."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


class Acceptance:
    """One drafter's per-token rates over recent cycles, exponentially forgotten.

    `rate`: that the cycle's run of accepted tokens goes on at the next draft
    position (accepted tokens over accepted tokens plus runs ended early, by a
    rejection or by the drafter stopping itself). `continuation`: that the
    drafter guesses at the next position at all (drafted tokens over drafted
    tokens plus stops). A draft model that stops when unsure is right more
    often on what it does draft; both rates are needed to price it."""

    PRIOR_WEIGHT = 2.0

    def __init__(self, prior: float, *, weight: float = PRIOR_WEIGHT, decay: float = 0.9):
        self.accepted = prior * weight
        self.ended = (1.0 - prior) * weight
        self.drafted = weight
        self.stops = 0.0
        self.decay = decay

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.ended)

    @property
    def continuation(self) -> float:
        return self.drafted / (self.drafted + self.stops)

    QUANTILES = (-1.28, -0.52, 0.0, 0.52, 1.28)
    """Standard scores of five equally likely acceptances (a normal distribution's quintiles' middles)."""

    def spread(self) -> list[float]:
        """Acceptances this drafter may have on a new reply, equally likely: the rate
        give or take what the evidence behind it allows (wide after a `forget`)."""
        n = self.accepted + self.ended
        sd = (self.rate * (1.0 - self.rate) / (n + 1.0)) ** 0.5
        return [min(max(self.rate + z * sd, 0.0), 0.99) for z in self.QUANTILES]

    def forget(self, weight: float, prior: float | None = None) -> None:
        """Keep the rates but as the evidence of `weight` cycles at most, so that
        new cycles quickly outweigh them; with a prior, beside the prior's own
        weight again (as when the drafter was new)."""
        self.accepted, self.ended = _scaled_to(weight, self.accepted, self.ended)
        self.drafted, self.stops = _scaled_to(weight, self.drafted, self.stops)
        if prior is not None:
            self.accepted += prior * self.PRIOR_WEIGHT
            self.ended += (1.0 - prior) * self.PRIOR_WEIGHT
            self.drafted += self.PRIOR_WEIGHT

    def fade_toward(self, long_run: "Acceptance") -> None:
        """A cycle that did not use the drafter: its evidence ages as a new cycle would
        age it (by `decay`), and what it loses goes to the long-run rates."""
        d, weight = self.decay, self.accepted + self.ended
        self.accepted = d * self.accepted + (1 - d) * weight * long_run.rate
        self.ended = d * self.ended + (1 - d) * weight * (1 - long_run.rate)
        weight = self.drafted + self.stops
        self.drafted = d * self.drafted + (1 - d) * weight * long_run.continuation
        self.stops = d * self.stops + (1 - d) * weight * (1 - long_run.continuation)

    def observe(self, asked: int, drafted: int, accepted: int) -> None:
        if asked <= 0:
            return
        self.accepted = self.decay * self.accepted + accepted
        self.ended = self.decay * self.ended + (1.0 if accepted < asked else 0.0)
        self.drafted = self.decay * self.drafted + drafted
        self.stops = self.decay * self.stops + (1.0 if drafted < asked else 0.0)


class Option(NamedTuple):
    """One drafter's offer at one k, priced: what auto chooses among each cycle."""

    drafter: Drafter
    offer: Offer
    bucket: Bucket
    acceptance: float
    k: int
    rate: float
    """Expected tokens per second."""
    worst_loss: float
    """Seconds lost against plain decoding if every guess is rejected (AutoPolicy._worst_loss)."""
    p_draft: float | None
    """For a drafter drafting on demand (a draft model): how sure it must be of its draft to go on."""

    def plan(self, plain_rate: float) -> Plan:
        return Plan(self.drafter, self.k, bucket=self.bucket, proposal=self.offer.proposal, source=self.offer.source,
                    p_draft=self.p_draft, speedup=self.rate / plain_rate, acceptance=self.acceptance)


def _rate_of(option: Option) -> float:
    return option.rate


def _scaled_to(weight: float, hits: float, misses: float) -> tuple[float, float]:
    """The counts scaled down to `weight` in all (their ratio kept), if above it."""
    total = hits + misses
    return (hits, misses) if total <= weight else (hits * weight / total, misses * weight / total)


class Ledger:
    """One reply of auto mode against plain decoding, as measured: every drafting
    cycle's time against the single-token passes its tokens would have cost, and
    the plain decode time that all cycles stand for.

    No cycle may risk more, if every guess it drafts is rejected, than the
    credit: what drafting has saved in this reply plus ALLOWANCE of its plain
    decode time, half of it lent at the start (from the length of earlier
    replies) and half earned as the reply goes on. So a reply of the usual
    length never falls more than ALLOWANCE behind plain decoding, whatever the
    estimates said, and long drafts are paid from what shorter ones saved.
    A long draft must also leave, if lost, the credit for a 1-token one
    (AutoPolicy._affordable): else one lost bet early in a reply would leave it
    plain to its end, the credit coming back at ALLOWANCE of each plain pass.

    A drafter may also bet again what it saved in earlier replies and has not
    lost since (`carried`), and any drafter what the last reply left of its own
    allowance (`banked`: its ALLOWANCE of plain time, less what it lost), up to
    the allowance of a reply in all. A short reply (an agent's tool call, 40
    tokens) ends before its own savings pay for a draft longer than a token or
    two, however often the drafter was right before; and where the first draft
    that pays risks more than a reply's first credit (a 3-token draft on a slow
    CPU: 132 ms against 104), no reply would ever make it. So a reply of the
    usual length loses at most twice its allowance, and a session of replies at
    most its allowances."""

    ALLOWANCE = 0.02

    def __init__(self, expected_s: float = 0.0, carried: dict[str, float] | None = None,
                 banked: float = 0.0) -> None:
        self.expected_s = expected_s
        """Plain decode seconds a reply is expected to take (earlier replies' mean)."""
        self.saved = 0.0
        """Seconds drafting cycles took less (negative: more) than plain passes would have."""
        self.plain_s = 0.0
        """Seconds plain decoding would have taken for this reply's tokens so far."""
        self.saved_by: dict[str, float] = {}
        """`saved`, by drafter."""
        self.plain_by: dict[str, float] = {}
        """`plain_s` of the tokens each drafter's cycles produced."""
        self.carried: dict[str, float] = dict(carried or {})
        """What each drafter saved in earlier replies and may bet again in this one."""
        self.banked = banked
        """What the last reply left of its allowance, which any drafter may bet in this one."""

    @property
    def credit(self) -> float:
        """Seconds that exploration may still cost."""
        return self.saved + self.ALLOWANCE * (self.plain_s + self.expected_s) / 2

    def credit_for(self, drafter: str) -> float:
        """Seconds that one drafter's cycles may still cost: the credit, and what it carried
        in and the last reply banked, up to a reply's allowance."""
        return self.credit + min(self.carried.get(drafter, 0.0) + self.banked, self.ALLOWANCE * self.expected_s)

    def carry(self, expected_s: float) -> dict[str, float]:
        """What each drafter carries into the next reply (expected to take `expected_s`
        of plain decoding): what it carried in and saved here, up to that reply's allowance."""
        names = {*self.carried, *self.saved_by}
        return {name: min(max(self.carried.get(name, 0.0) + self.saved_by.get(name, 0.0), 0.0),
                          self.ALLOWANCE * expected_s) for name in names}

    def unspent(self, expected_s: float) -> float:
        """What this reply left of its allowance, for the next reply (expected to take
        `expected_s` of plain decoding) to bank, up to that reply's allowance."""
        return min(max(self.ALLOWANCE * self.plain_s + min(self.saved, 0.0), 0.0), self.ALLOWANCE * expected_s)

    def observe(self, report: CycleReport, single_s: float) -> None:
        """`single_s`: what a single-token pass costs now."""
        if report.plan.drafter is None:
            self.plain_s += report.verify_s
            return
        tokens = report.accepted + 1
        saved = tokens * single_s - report.draft_s - report.verify_s
        name = report.plan.drafter.name
        self.plain_s += tokens * single_s
        self.plain_by[name] = self.plain_by.get(name, 0.0) + tokens * single_s
        self.saved += saved
        self.saved_by[name] = self.saved_by.get(name, 0.0) + saved


class Probes:
    """When auto probes each drafter it has stopped using: after `every` idle
    cycles, each probe that does not win the drafter back doubling the wait (up
    to `most`); a cycle that uses it starts the count again at `every`."""

    def __init__(self, names: Sequence[str], *, every: int, most: int):
        self.every, self.most = every, most
        self.idle = {name: 0 for name in names}
        """Cycles since each drafter was last used or probed."""
        self.wait = {name: every for name in names}
        """Idle cycles before each drafter's next probe."""

    def cycle(self, *, used: str | None) -> None:
        """A cycle was planned, drafting with `used` (None: plain)."""
        for name in self.idle:
            if name == used:
                self.idle[name], self.wait[name] = 0, self.every
            else:
                self.idle[name] += 1

    def due(self, name: str) -> bool:
        return self.idle[name] >= self.wait[name]

    def probed(self, name: str) -> None:
        self.idle[name], self.wait[name] = 0, min(2 * self.wait[name], self.most)

    def soon(self, name: str, cycles: int) -> None:
        """Due within `cycles` cycles, if not sooner (the wait between later probes is kept)."""
        self.idle[name] = max(self.idle[name], self.wait[name] - cycles)


class AutoPolicy(Policy):
    """Before each cycle, the drafter and k that maximise expected tokens per
    second, plain decoding (k = 0) included.

    Each drafter says what it can offer the cycle (Drafter.offer: how long a
    draft, which of its acceptance rates predicts it, and the proposal when it
    costs nothing to make); auto prices every k of every offer. A free proposal
    (prompt lookup's) is scored even in cycles that do not use it ("shadow"
    proposals, checked against the tokens the cycle produced): its acceptance is
    always current, and auto switches to it as soon as the reply starts copying.
    A drafter that drafts on demand (a draft model) is probed now and then
    instead (`Probes`), so that a change in its acceptance is noticed.

    A plan is data (its kind, bucket, k, expected speedup, and for a plain one
    the drafting plan it declined); `describe` words it for the status line."""

    PROBE_EVERY = 24
    """Cycles before the first probe of a drafter that auto has stopped using;
    each probe that does not win it back doubles the wait (up to PROBE_MAX)."""
    PROBE_MAX = 384
    MARGIN = 0.03
    """How much faster than plain decoding a drafter must be expected to be. The
    estimates are noisy, and the best of several noisy estimates is too high on
    average (the winner's curse): without a margin, near-ties cost speed."""
    SWITCH_CYCLES = 4
    """Cycles a drafter switched to is expected to stay in use: the price of
    switching (a draft model reading what it missed) is spread over them. Charged
    to one cycle, it would keep an idle draft model idle however right it is: the
    longer it sits out, the more it has to read, the dearer the switch."""
    PROBE_FIRST = 2
    """The cycle of a reply that probes a warm draft model first."""
    PROBE_K = 2
    """Tokens a probe asks for."""
    WARM_MARGIN = 3.0
    """How many times its reading a draft model must be expected to save for a new
    prompt to be read into it before the reply shows anything. The reading is paid
    at once, the saving only as the reply goes on; and the expected saving is that
    of a reply of the usual length, which an edit or a tool call (20-80 tokens)
    falls far short of. Replayed on 40 replies, each as a session's first, under
    seven machines' costs: at 1, short replies on a CPU lost up to 18% to a reading
    they never used; at 2, up to 5%; from 3 on, none lost more than its ledger
    allows, and no machine's suite lost speed (docs/measurements.md)."""
    OPTIMISTIC = 0.9
    """The acceptance at which a draft model is worth warming for a reply: one
    that cannot pay even then (as slow as the target) is left cold."""

    TYPICAL_REPLY = 128
    """Tokens a first reply is expected to run, before any has been seen."""

    LONG_RUN_DECAY = 0.99
    """The weight a drafter's long-run rates keep at each cycle that uses it: about
    the last hundred cycles, across replies (its recent rates keep 0.9)."""

    FORGET_WEIGHT = 2.0
    """At a new reply, a drafter rated below its prior gets a fresh chance: what
    earlier replies taught counts as this many cycles, beside the prior's own
    weight again (how often it guesses at all, too), so that a draft model rated
    low on a chat reply is warmed for a code reply and wins back its place there
    in a probe or two. One
    rated high keeps its standing: a reply often starts unsure (a code fence, a
    name) before the stretch the draft model predicts well."""

    def __init__(self, costs: Costs, drafters: Sequence[Drafter], *, k_max: int,
                 priors: dict[str, float] | None = None):
        self.costs = costs
        self.drafters = list(drafters)
        self.k_max = k_max
        """The most tokens any cycle drafts, whichever drafter drafts them (--k)."""
        self._priors = priors or {}
        self.acceptance: dict[Bucket, Acceptance] = {}
        self.probes = Probes([d.name for d in self.drafters], every=self.PROBE_EVERY, most=self.PROBE_MAX)
        self._shadows: list[tuple[int, list[int], Bucket]] = []
        """Last cycle's unused free proposals: (where they started, the tokens, their bucket)."""
        self.long_run: dict[Bucket, Acceptance] = {}
        """The rates of drafters that draft on demand, over many cycles (LONG_RUN_DECAY)."""
        self._last_used: str | None = None
        """The drafter the last cycle used (None: plain)."""
        self._reply_s = self.TYPICAL_REPLY * costs.target_pass(1)
        """Plain decode seconds of a reply, averaged over the replies so far."""
        self.ledger = Ledger(self._reply_s)

    def prefill(self, prompt):
        """A new reply: warm the drafters that can pay on this machine, and
        probe the draft model early.

        Reading a whole prompt mid-reply costs more than one cycle can win back,
        so a cold draft model would hardly ever be chosen; and its acceptance
        depends on the prompt (high when the reply copies, lower in free text),
        so what the last reply taught is checked early in this one."""
        self.costs.restart()
        last = self.ledger if self.ledger.plain_s > 0 else None  # the reply that went before, if any
        if last is not None:
            self._reply_s += 0.5 * (last.plain_s - self._reply_s)
        self.ledger = Ledger(self._reply_s, carried=self.ledger.carry(self._reply_s),
                             banked=self.ledger.unspent(self._reply_s))
        for bucket, acceptance in self.acceptance.items():
            if acceptance.rate < self._prior(bucket):
                acceptance.forget(self.FORGET_WEIGHT, self._prior(bucket))
        for drafter in self.drafters:
            if self._could_pay(drafter) and self._worth_warming(drafter, prompt, last):
                drafter.prefill(prompt)
                self.probes.soon(drafter.name, self.PROBE_FIRST)

    def read_ahead(self, prompt):
        """Read into each drafter that can pay on this machine: a reading that no
        reply waits for costs it nothing, so the draft model is warm at the reply
        however its reading would be priced then (one that cannot pay stays out:
        the reading would only spend the user's battery)."""
        for drafter in self.drafters:
            if self._could_pay(drafter):
                drafter.prefill(prompt)

    def _worth_warming(self, drafter: Drafter, prompt: Sequence[int], last: Ledger | None) -> bool:
        """Whether reading the prompt into the drafter now is worth its time: after a
        reply whose savings from it would have paid for the reading, or when the
        reading costs no more than the ledger lends, or when the drafter is expected
        to save WARM_MARGIN times as much in this reply. In a
        session of edits that prompt lookup serves, an idle draft model would
        otherwise read each new prompt (the last reply and the new message) for nothing.
        Left cold, it may still be read in mid-reply, as a cycle's catch-up the ledger pays."""
        cost = self._catch_up(drafter, prompt)
        if last is not None and last.saved_by.get(drafter.name, 0.0) >= cost:
            return True
        return cost <= self.ledger.credit or self.WARM_MARGIN * cost <= self._expected_saving(drafter, last,
                                                                                                 covered=True)

    def _expected_saving(self, drafter: Drafter, last: Ledger | None = None, *, covered: bool = False) -> float:
        """Seconds a warm drafter is expected to save over a reply of the usual
        length: what warming it for a reply may cost (on a GPU the reading is cheap
        and the saving large; on a compute-bound CPU it saves only where the draft
        model is nearly always right, and a short reply must not wait for the reading).

        This reply's acceptance is not known yet: the saving is averaged over the
        acceptances it may have (`Acceptance.spread`), each counted only where it
        pays, since auto drops a drafter that turns out not to. It is saved only on
        the stretches the other drafters left to plain decoding in the last reply
        (`last`): in a session of edits that prompt lookup copies, a draft model has
        little left to win, and reading each conversation into it costs seconds.
        `covered` (for a reply's reading, which no cycle's ledger pays for): saved only
        where a draft the ledger's credit covers now pays (`_ks_the_ledger_covers`),
        whose savings then pay for longer ones. Where only 3-token drafts pay and their
        worst case is more than a reply's first credit (a 2-core Xeon: 182 ms and a
        1-token bet's after it, against 136), the model, read, sat idle, and first
        replies ran 4-5% slower than plain decoding."""
        plain = 1.0 / self.costs.target_pass(1)
        ks = self._ks_the_ledger_covers(drafter) if covered else None
        gains = []
        for a in self._acceptance(Bucket(drafter.name)).spread():
            acceptance = Acceptance(a)
            if ks is None or (ks and max(self._rates(drafter, acceptance, ks)) > plain * (1.0 + self.MARGIN)):
                gains.append(max(0.0, 1.0 - plain / self._best_rate(drafter, acceptance)))
            else:
                gains.append(0.0)
        return self._reply_s * self._left_to(drafter, last) * sum(gains) / len(gains)

    def _ks_the_ledger_covers(self, drafter: Drafter) -> list[int]:
        """The draft lengths whose worst case (the drafter warm) the ledger's credit covers
        now with the least bet's after it, as each cycle must (`_affordable`)."""
        credit = self.ledger.credit_for(drafter.name)
        reserve = min(self._worst_loss(d, 1, 0.0) for d in self.drafters)
        return [k for k in k_choices(self.k_max, self.costs.calibrated_sizes)
                if self._worst_loss(drafter, k, 0.0) + (reserve if k > 1 else 0.0) <= credit]

    @staticmethod
    def _left_to(drafter: Drafter, last: Ledger | None) -> float:
        """The share of the last reply that the other drafters did not serve (all of
        it where there was none)."""
        if last is None or last.plain_s <= 0:
            return 1.0
        others = sum(s for name, s in last.plain_by.items() if name != drafter.name)
        return max(0.0, 1.0 - others / last.plain_s)

    def _could_pay(self, drafter: Drafter) -> bool:
        """Whether the drafter, warm and right OPTIMISTIC of the time, beats plain
        decoding on this machine: if not, warming or probing it is money lost."""
        optimistic = Acceptance(max(self.OPTIMISTIC, self._acceptance(Bucket(drafter.name)).rate))
        return self._best_rate(drafter, optimistic) > 1.0 / self.costs.target_pass(1)

    def _best_rate(self, drafter: Drafter, acceptance: Acceptance) -> float:
        """Tokens per second of the drafter's best k when warm."""
        return max(self._rates(drafter, acceptance, k_choices(self.k_max, self.costs.calibrated_sizes)))

    def _rates(self, drafter: Drafter, acceptance: Acceptance, ks: Sequence[int],
               switch_s: float = 0.0) -> list[float]:
        """Expected tokens per second of a cycle asking for up to k tokens, for each k
        of `ks` (ascending): the drafter drafts fewer when it stops itself, which costs
        the step that stopped it but saves target columns."""
        s = acceptance.continuation
        rates = []
        for k, verify_s in zip(ks, expected_verify(self.costs, s, ks)):
            steps = expected_drafted(s, k) + (1.0 - s**k)
            rates.append(expected_tokens(acceptance.rate, k) / (verify_s + self.costs.draft(drafter.name, steps) + switch_s))
        return rates

    def plan(self, history: Sequence[int]) -> Plan:
        """The fastest safe plan of all the drafters offer; else a probe, if one is
        due; else plain, with the best plan it declined."""
        self._score_shadow(history)
        offers = [(d, self._offer(d, history)) for d in self.drafters]
        self._fade_idle(offers)
        plain_rate = 1.0 / self.costs.target_pass(1)
        options = list(self._options(history, offers))
        reserve = min((o.worst_loss for o in options if o.k == 1), default=0.0)
        safe = [o for o in options
                if o.rate > plain_rate * (1.0 + self.MARGIN) and self._affordable(o, reserve)]
        chosen = max(safe, key=_rate_of, default=None)  # of equal rates, the first
        best = chosen.plan(plain_rate) if chosen else Plan(None, 0)
        self.probes.cycle(used=best.drafter.name if best.drafter else None)
        self._shadows = [(len(history), offer.proposal, Bucket(d.name, offer.key)) for d, offer in offers
                         if offer.proposal and d is not best.drafter]
        if best.drafter is None:
            best = self._probe(history, offers) or best
        if best.kind == "plain" and options:
            best.declined = max(options, key=_rate_of).plan(plain_rate)
        best.reason = self.describe(best)
        return best

    def _fade_idle(self, offers: list[tuple[Drafter, Offer]]) -> None:
        """The rates of each drafter drafting on demand that the last cycle did not
        use, one cycle older, toward its long-run rates. It is measured only while
        used, and auto stops using it after a bad stretch: frozen, its rates would
        stay at that stretch's low, which is low partly by chance (it was dropped
        because it was low). Lookup's proposals are scored every cycle: theirs are
        current."""
        for drafter, offer in offers:
            bucket = Bucket(drafter.name, offer.key)
            if offer.proposal is None and drafter.name != self._last_used and bucket in self.long_run:
                self._acceptance(bucket).fade_toward(self.long_run[bucket])

    def _offer(self, drafter: Drafter, history: Sequence[int]) -> Offer:
        """What the drafter offers, cut to k_max: the one place --k caps every drafter."""
        offer = drafter.offer(history, self.k_max)
        if offer.k_max <= self.k_max:
            return offer
        proposal = offer.proposal[: self.k_max] if offer.proposal is not None else None
        return replace(offer, k_max=self.k_max, proposal=proposal)

    def _options(self, history: Sequence[int], offers: list[tuple[Drafter, Offer]]):
        """Each drafter's offer at each k, priced (Option)."""
        for drafter, offer in offers:
            bucket = Bucket(drafter.name, offer.key)
            a = self._acceptance(bucket)
            catch_up = self._catch_up(drafter, history) if offer.k_max > 0 else 0.0
            if self._not_worth_catching_up(drafter, catch_up):
                continue
            # drafting on demand (a draft model): it drafts while its guesses are worth a column
            p_draft = self.costs.break_even(drafter.name) if offer.proposal is None else None
            ks = k_choices(offer.k_max, self.costs.calibrated_sizes)
            for k, rate in zip(ks, self._rates(drafter, a, ks, catch_up / self.SWITCH_CYCLES)):
                yield Option(drafter, offer, bucket, a.rate, k, rate, self._worst_loss(drafter, k, catch_up), p_draft)

    def _probe(self, history: Sequence[int], offers: list[tuple[Drafter, Offer]]) -> Plan | None:
        """A probe of the first drafter due one (drafting on demand, so unscored while
        unused, and able to pay), if the ledger can pay for it."""
        drafter, offer = next(((d, offer) for d, offer in offers if offer.proposal is None and offer.k_max > 0
                               and self.probes.due(d.name) and self._could_pay(d)), (None, None))
        if drafter is None:
            return None
        catch_up = self._catch_up(drafter, history)
        if self._not_worth_catching_up(drafter, catch_up):
            return None
        k = next((k for k in range(min(self.PROBE_K, offer.k_max), 0, -1)
                  if self._worst_loss(drafter, k, catch_up) <= self.ledger.credit_for(drafter.name)), 0)
        if k == 0:
            return None
        self.probes.probed(drafter.name)
        bucket = Bucket(drafter.name, offer.key)
        return Plan(drafter, k, bucket=bucket, p_draft=self.costs.break_even(drafter.name), kind="probe",
                    acceptance=self._acceptance(bucket).rate)

    def _not_worth_catching_up(self, drafter: Drafter, catch_up_s: float) -> bool:
        """Whether the drafter sat out (reading what it missed costs more than a probe's
        own drafting) and the reading would cost more than it can win where the other
        drafters leave room in this reply (none, where lookup copies): then neither a
        probe nor a switch to it pays, however right it is rated."""
        return (catch_up_s > self.costs.draft(drafter.name, self.PROBE_K)
                and catch_up_s > self._expected_saving(drafter, self.ledger))

    def _catch_up(self, drafter: Drafter, history: Sequence[int]) -> float:
        """Seconds the drafter needs to read what it missed of `history`."""
        return self.costs.catch_up(drafter.name, drafter.behind(history))

    def describe(self, plan: Plan) -> str:
        """The plan in words, for the status line."""
        if plan.kind == "probe":
            return f"probing {plan.bucket}: acceptance {plan.acceptance:.0%} may have changed"
        if plan.kind == "plain":
            other = plan.declined
            if other is None:
                return "plain: nothing to draft"
            why = ("would risk more than this reply's ledger allows" if other.speedup > 1.0 + self.MARGIN
                   else "would not pay")
            return f"plain: drafting {why} (best {other.drafter.name} k={other.k}: {other.speedup:.2f}x)"
        text = f"{plan.bucket} k={plan.k}: {plan.speedup:.2f}x plain expected, acceptance {plan.acceptance:.0%}"
        if plan.p_draft is not None:
            text += f", drafting while {plan.p_draft:.0%} sure"
        return text

    def _affordable(self, option: Option, reserve: float) -> bool:
        """Whether the ledger can pay for a cycle's worst loss and still for the
        smallest bet after it (`reserve`: the least a 1-token draft risks): a lost
        long draft must not leave the rest of the reply without the means to win
        its loss back."""
        return option.worst_loss <= self.ledger.credit_for(option.drafter.name) - (reserve if option.k > 1 else 0.0)

    def _worst_loss(self, drafter: Drafter, k: int, catch_up_s: float) -> float:
        """What a cycle drafting k tokens loses against plain decoding if every
        guess is rejected (`catch_up_s`: what the drafter must read first). No
        cycle may risk more than the ledger's credit, so a reply never falls
        further behind plain decoding than its allowance, and long drafts, dear
        where a verify column costs nearly a pass (a CPU), are paid from what
        shorter ones saved."""
        verify = self.costs.target_pass(k + 1) - self.costs.target_pass(1)
        return catch_up_s + self.costs.draft(drafter.name, k) + verify

    def _score_shadow(self, history: Sequence[int]) -> None:
        """Score last cycle's unused free proposals (every drafter's) against what was generated."""
        for start, proposal, bucket in self._shadows:
            generated = history[start:]
            n = min(len(proposal), len(generated))
            agreed = next((i for i in range(n) if proposal[i] != generated[i]), n)
            if n:
                self._acceptance(bucket).observe(n, n, agreed)
        self._shadows = []

    def _prior(self, bucket: Bucket) -> float:
        return self._priors.get(bucket.drafter, 0.5)

    def _acceptance(self, bucket: Bucket) -> Acceptance:
        if bucket not in self.acceptance:
            self.acceptance[bucket] = Acceptance(self._prior(bucket))
        return self.acceptance[bucket]

    def observe(self, report: CycleReport) -> None:
        self.ledger.observe(report, self.costs.target_pass(1))
        self.costs.observe(report)
        drafter = report.plan.drafter
        self._last_used = drafter.name if drafter is not None else None
        if drafter is not None:
            bucket = report.plan.bucket or Bucket(drafter.name)
            self._acceptance(bucket).observe(report.asked, report.drafted, report.accepted)
            if report.plan.proposal is None:  # drafted on demand
                if bucket not in self.long_run:
                    self.long_run[bucket] = Acceptance(self._prior(bucket), decay=self.LONG_RUN_DECAY)
                self.long_run[bucket].observe(report.asked, report.drafted, report.accepted)
