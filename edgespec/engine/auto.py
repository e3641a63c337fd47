"""Auto mode: before each cycle, the drafter and k that maximise expected tokens
per second from costs measured on this machine (engine/costs.py) and acceptance
measured online, plain decoding included; exploration paid from a ledger of
what drafting saved against plain decoding.
"""

from __future__ import annotations

from typing import Sequence

from edgespec.engine.costs import Costs
from edgespec.engine.drafters import Drafter, PromptLookup
from edgespec.engine.policy import Bucket, CycleReport, Plan, Policy


def expected_drafted(continuation: float, k: int) -> float:
    """Tokens a drafter that goes on with probability `continuation` at each
    step (a draft model stops when unsure of its next guess) drafts of k."""
    if continuation >= 1.0:
        return float(k)
    return continuation * (1.0 - continuation ** k) / (1.0 - continuation)


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

    def __init__(self, prior: float, *, weight: float = 2.0, decay: float = 0.9):
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

    def forget(self, weight: float) -> None:
        """Keep the rates but as the evidence of `weight` cycles at most, so that
        new cycles quickly outweigh them."""
        self.accepted, self.ended = _scaled_to(weight, self.accepted, self.ended)
        self.drafted, self.stops = _scaled_to(weight, self.drafted, self.stops)

    def observe(self, asked: int, drafted: int, accepted: int) -> None:
        if asked <= 0:
            return
        self.accepted = self.decay * self.accepted + accepted
        self.ended = self.decay * self.ended + (1.0 if accepted < asked else 0.0)
        self.drafted = self.decay * self.drafted + drafted
        self.stops = self.decay * self.stops + (1.0 if drafted < asked else 0.0)


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
    estimates said, and long drafts are paid from what shorter ones saved."""

    ALLOWANCE = 0.02

    def __init__(self, expected_s: float = 0.0) -> None:
        self.expected_s = expected_s
        """Plain decode seconds a reply is expected to take (earlier replies' mean)."""
        self.saved = 0.0
        """Seconds drafting cycles took less (negative: more) than plain passes would have."""
        self.plain_s = 0.0
        """Seconds plain decoding would have taken for this reply's tokens so far."""
        self.saved_by: dict[str, float] = {}
        """`saved`, by drafter."""

    @property
    def credit(self) -> float:
        """Seconds that exploration may still cost."""
        return self.saved + self.ALLOWANCE * (self.plain_s + self.expected_s) / 2

    def observe(self, report: CycleReport, single_s: float) -> None:
        """`single_s`: what a single-token pass costs now."""
        if report.plan.drafter is None:
            self.plain_s += report.verify_s
            return
        tokens = report.accepted + 1
        saved = tokens * single_s - report.draft_s - report.verify_s
        name = report.plan.drafter.name
        self.plain_s += tokens * single_s
        self.saved += saved
        self.saved_by[name] = self.saved_by.get(name, 0.0) + saved


class AutoPolicy(Policy):
    """Before each cycle, the drafter and k that maximise expected tokens per
    second, plain decoding (k = 0) included.

    Prompt lookup's proposals cost nothing to make, so they are scored even in
    cycles that do not use them ("shadow" proposals, checked against the tokens
    the cycle produced): its acceptance is always current, and auto switches to
    it as soon as the reply starts copying. A draft model is probed now and then
    instead, so that a change in its acceptance is noticed."""

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
    OPTIMISTIC = 0.9
    """The acceptance at which a draft model is worth warming for a reply: one
    that cannot pay even then (as slow as the target) is left cold."""

    TYPICAL_REPLY = 128
    """Tokens a first reply is expected to run, before any has been seen."""

    FORGET_WEIGHT = 2.0
    """At a new reply, a drafter rated below its prior gets a fresh chance: what
    earlier replies taught counts as this many cycles, so that a draft model rated
    low on a chat reply wins back its place on a code reply in a probe or two. One
    rated high keeps its standing: a reply often starts unsure (a code fence, a
    name) before the stretch the draft model predicts well."""

    def __init__(self, costs: Costs, drafters: Sequence[Drafter], *, k_max: int, lookup_k_max: int = 16,
                 priors: dict[str, float] | None = None):
        self.costs = costs
        self.drafters = list(drafters)
        self.k_max = k_max
        self.lookup_k_max = max(lookup_k_max, k_max)
        self._priors = priors or {}
        self.acceptance: dict[Bucket, Acceptance] = {}
        self._idle = {d.name: 0 for d in self.drafters}
        self._probe_wait = {d.name: self.PROBE_EVERY for d in self.drafters}
        self._shadow: tuple[int, list[int], Bucket] | None = None
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
        self.ledger = Ledger(self._reply_s)
        for bucket, acceptance in self.acceptance.items():
            if acceptance.rate < self._prior(bucket):
                acceptance.forget(self.FORGET_WEIGHT)
        for drafter in self.drafters:
            if self._could_pay(drafter) and self._worth_warming(drafter, prompt, last):
                drafter.prefill(prompt)
                # due for a probe PROBE_FIRST cycles in (the wait between later probes is kept)
                self._idle[drafter.name] = max(self._idle[drafter.name],
                                               self._probe_wait[drafter.name] - self.PROBE_FIRST)

    def _worth_warming(self, drafter: Drafter, prompt: Sequence[int], last: Ledger | None) -> bool:
        """Whether reading the prompt into the drafter now is worth its time: after a
        reply whose savings from it would have paid for the reading, or when the
        reading costs no more than the ledger lends or than the drafter is expected
        to save in this reply. In a
        session of edits that prompt lookup serves, an idle draft model would
        otherwise read each new prompt (the last reply and the new message) for nothing."""
        cost = self.costs.catch_up(drafter.name, drafter.behind(prompt))
        if last is not None and last.saved_by.get(drafter.name, 0.0) >= cost:
            return True
        return cost <= max(self.ledger.credit, self._expected_saving(drafter))

    def _expected_saving(self, drafter: Drafter) -> float:
        """Seconds a warm drafter is expected to save over a reply of the usual
        length at its acceptance so far: what warming it for a first reply may cost
        (on a GPU the reading is cheap and the saving large; on a compute-bound CPU
        it saves nothing, and a short reply must not wait for the reading)."""
        plain = 1.0 / self.costs.target_pass(1)
        rate = self._best_rate(drafter, self._acceptance(Bucket(drafter.name)))
        return self._reply_s * max(0.0, 1.0 - plain / rate)

    def _could_pay(self, drafter: Drafter) -> bool:
        """Whether the drafter, warm and right OPTIMISTIC of the time, beats plain
        decoding on this machine: if not, warming or probing it is money lost."""
        optimistic = Acceptance(max(self.OPTIMISTIC, self._acceptance(Bucket(drafter.name)).rate))
        return self._best_rate(drafter, optimistic) > 1.0 / self.costs.target_pass(1)

    def _best_rate(self, drafter: Drafter, acceptance: Acceptance) -> float:
        """Tokens per second of the drafter's best k when warm."""
        return max(self._rate(drafter, acceptance, k) for k in range(1, self.k_max + 1))

    def _rate(self, drafter: Drafter, acceptance: Acceptance, k: int, switch_s: float = 0.0) -> float:
        """Expected tokens per second of a cycle asking for up to k tokens: the
        drafter drafts fewer when it stops itself, which costs the step that
        stopped it but saves target columns."""
        s = acceptance.continuation
        drafted = expected_drafted(s, k)
        steps = drafted + (1.0 - s**k)
        cycle_s = self.costs.target_pass(1 + drafted) + self.costs.draft(drafter.name, steps) + switch_s
        return expected_tokens(acceptance.rate, k) / cycle_s

    def plan(self, history: Sequence[int]) -> Plan:
        self._score_shadow(history)
        plain_rate = 1.0 / self.costs.target_pass(1)
        best, best_rate = Plan(None, 0), plain_rate * (1.0 + self.MARGIN)
        runner_up = None
        options = [(d, *self._options(d, history)) for d in self.drafters]
        for drafter, k_cap, bucket, proposal in options:
            a = self._acceptance(bucket)
            catch_up = self.costs.catch_up(drafter.name, drafter.behind(history)) if k_cap > 0 else 0.0
            for k in range(1, k_cap + 1):
                rate = self._rate(drafter, a, k, catch_up / self.SWITCH_CYCLES)
                if rate > best_rate and self._worst_loss(drafter, k, catch_up) <= self.ledger.credit:
                    best, best_rate = Plan(drafter, k, bucket=bucket, proposal=proposal), rate
                if runner_up is None or rate > runner_up[1]:
                    runner_up = (Plan(drafter, k, bucket=bucket), rate)
        for drafter in self.drafters:
            if best.drafter is drafter:
                self._idle[drafter.name] = 0
                self._probe_wait[drafter.name] = self.PROBE_EVERY
            else:
                self._idle[drafter.name] += 1
        self._shadow = next(((len(history), proposal, bucket) for d, _, bucket, proposal in options
                             if proposal and d is not best.drafter), None)
        if best.drafter is None:
            probe = next(((d, min(self.PROBE_K, k_cap), bucket) for d, k_cap, bucket, proposal in options
                          if proposal is None and self._idle[d.name] >= self._probe_wait[d.name] and k_cap > 0
                          and self._could_pay(d)), None)
            if probe is not None and self._worst_loss(*probe[:2], self.costs.catch_up(
                    probe[0].name, probe[0].behind(history))) <= self.ledger.credit:
                drafter, k, bucket = probe
                self._idle[drafter.name] = 0
                self._probe_wait[drafter.name] = min(2 * self._probe_wait[drafter.name], self.PROBE_MAX)
                best = Plan(drafter, k, bucket=bucket, p_draft=self.costs.break_even(drafter.name), kind="probe",
                            acceptance=self._acceptance(bucket).rate)
            elif runner_up is not None:
                best.declined, rate = runner_up
                best.declined.speedup = rate / plain_rate
        else:
            best.speedup, best.acceptance = best_rate / plain_rate, self._acceptance(best.bucket).rate
            if best.proposal is None:  # a draft model: it drafts while its guesses are worth a column
                best.p_draft = self.costs.break_even(best.drafter.name)
        best.reason = self.describe(best)
        return best

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

    def _worst_loss(self, drafter: Drafter, k: int, catch_up_s: float) -> float:
        """What a cycle drafting k tokens loses against plain decoding if every
        guess is rejected (`catch_up_s`: what the drafter must read first). No
        cycle may risk more than the ledger's credit, so a reply never falls
        further behind plain decoding than its allowance, and long drafts, dear
        where a verify column costs nearly a pass (a CPU), are paid from what
        shorter ones saved."""
        verify = self.costs.target_pass(k + 1) - self.costs.target_pass(1)
        return catch_up_s + self.costs.draft(drafter.name, k) + verify

    def _options(self, drafter: Drafter, history: Sequence[int]) -> tuple[int, Bucket, list[int] | None]:
        """The longest draft worth considering, the acceptance bucket, and for
        lookup its proposal (bucketed by the kind of match it is)."""
        if isinstance(drafter, PromptLookup):
            tokens, kind = drafter.match(history, self.lookup_k_max, skip=True)
            return len(tokens), Bucket(drafter.name, kind or "none"), tokens
        return self.k_max, Bucket(drafter.name), None

    def _score_shadow(self, history: Sequence[int]) -> None:
        """Score last cycle's unused lookup proposal against what was generated."""
        if self._shadow is None:
            return
        start, proposal, bucket = self._shadow
        self._shadow = None
        generated = history[start:]
        n = min(len(proposal), len(generated))
        agreed = next((i for i in range(n) if proposal[i] != generated[i]), n)
        if n:
            self._acceptance(bucket).observe(n, n, agreed)

    def _prior(self, bucket: Bucket) -> float:
        return self._priors.get(bucket.drafter, 0.5)

    def _acceptance(self, bucket: Bucket) -> Acceptance:
        if bucket not in self.acceptance:
            self.acceptance[bucket] = Acceptance(self._prior(bucket))
        return self.acceptance[bucket]

    def observe(self, report: CycleReport) -> None:
        self.ledger.observe(report, self.costs.target_pass(1))
        self.costs.observe(report)
        if report.plan.drafter is not None:
            bucket = report.plan.bucket or Bucket(report.plan.drafter.name)
            self._acceptance(bucket).observe(report.asked, report.drafted, report.accepted)
