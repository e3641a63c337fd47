"""What speculation costs on this machine: target passes by batch size, a
draft step, a draft model's catch-up on history it missed. Measured once at
load (`calibrate`), kept current from every cycle (`Costs.observe`), and the
calibration lowered to the typical passes cycles show (`Costs.heal`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

from edgespec.config import read_kept
from edgespec.engine.cache import KVSequence
from edgespec.engine.policy import CycleReport

KEPT_MAX_BYTES = 1 << 20
"""The most a kept calibration holds (a few hundred bytes are written): a larger file is not one."""

EMA = 0.2
"""Weight of a new timing in the running cost estimates."""

STEADY_CATCH_UP = 2
"""Tokens a draft model in use every cycle evaluates before drafting: the last
draft token (drafted, never fed to it) and the target's own token. Part of
the cost of drafting. A catch-up over more tokens, after auto left the draft
model idle, is the price of switching back to it, measured and charged apart:
it is paid once per switch, not per drafted token, and it is not free."""


HEAL_PASSES = 3
"""Passes of a size a process must run before they tell what it costs (Costs.heal)."""

HEALED_TO = "median"
"""How a kept calibration's sizes are healed (Costs.heal), part of its file's name: one
healed another way (to the fastest passes, which priced drafts wrong) is measured again."""

HEAL_KEPT = 101
"""The latest passes of each size that healing looks at."""


def per_missed_token(seconds: float, read: int) -> float:
    """The price of reading a missed token, from a catch-up that read `read` tokens in
    `seconds`: per token past a steady cycle's, as Costs.catch_up charges it."""
    return seconds / max(read - STEADY_CATCH_UP, 1)


class Costs:
    """Seconds per target pass by batch size, and per draft step by drafter,
    measured on this machine and updated from every cycle. A step drafts one
    token, or finds the next guess too unsure and stops the draft."""

    def __init__(self, target: dict[int, float], per_draft_token: dict[str, float],
                 per_catch_up_token: dict[str, float] | None = None):
        self.calibrated = dict(target)
        """The pass costs as first given (measured at load, at an empty context)."""
        self.calibrated_sizes = tuple(sorted(self.calibrated))
        """Their sizes: the passes whose costs are known, not interpolated."""
        self.drift = 1.0
        """How much dearer passes run now than calibrated (a running ratio over every
        pass observed): what the sizes not measured since are taken to cost too."""
        self.observed: set[int] = set()
        """The sizes measured since the calibration (or the last restart)."""
        self.seen: dict[int, collections.deque[float]] = {}
        """The latest passes of each calibrated size run in cycles (HEAL_KEPT): what `heal` lowers it to."""
        self.target = dict(target)
        self.per_draft_token = dict(per_draft_token)
        self.per_catch_up_token = dict(per_catch_up_token or {})
        """Seconds per token a drafter takes to read the history it missed (in a batch)."""

    def add_calibrated(self, measured: dict[int, float]) -> None:
        """Pass costs measured after the calibration: sizes it left out because the
        context had no room for them then (calibrate measures only what fits)."""
        self.calibrated.update(measured)
        self.calibrated_sizes = tuple(sorted(self.calibrated))
        self.observed |= set(measured)  # measured now, as they run now
        self.target = {**self.target, **measured}

    def restart(self) -> None:
        """Pass costs back to the calibration's, for a new reply, healed (`heal`).
        A pass costs more at a longer context, but the estimates are kept by size
        only: sizes last measured in a long conversation would read dear in a short
        one, and a size a policy stops using is never measured again. The first
        cycles relearn them."""
        self.heal()
        self.drift, self.observed = 1.0, set()
        self.target = dict(self.calibrated)

    def heal(self) -> None:
        """Lower each calibrated size to the median of its passes run in cycles (of
        HEAL_PASSES at least). The calibration measures each size once, at an empty
        context, the cheapest a pass gets, and a busy machine only makes a pass slower:
        a size measured at a busy moment (seen: a single pass at 125 ms against 106
        quiet) would price every later reply's drafts wrong. The median, not the fastest:
        a size run hundreds of times (a single pass) shows a far luckier fastest pass
        than one run a few times, and healed to their fastest passes the sizes' prices
        drift apart by how often each ran (a 2-core Xeon: 4-token drafts priced at 1.65
        single passes, run at 1.58). Never raised: a slower pass ran at a longer context
        or beside a busy neighbour. Only between replies (restart, fresh, keep_healed):
        within one, the drift is a ratio to one calibration."""
        self.lower_to({n: statistics.median(passes) for n, passes in self.seen.items()
                       if len(passes) >= HEAL_PASSES})

    def lower_to(self, passes: dict[int, float]) -> bool:
        """Lower each calibrated size to its time in `passes` where that is less
        (the others stay); whether any was lowered."""
        lower = {n: seconds for n, seconds in passes.items() if seconds < self.calibrated.get(n, 0.0)}
        self.calibrated.update(lower)
        return bool(lower)

    @property
    def target(self) -> dict[int, float]:
        """Seconds of a target pass by the number of tokens it reads, as measured."""
        return self._target

    @target.setter
    def target(self, measured: dict[int, float]) -> None:
        self._target = measured
        self._changed()

    def _changed(self) -> None:
        """The measured pass costs changed: what was derived from them is derived anew.
        Auto prices a few dozen sizes every cycle, and the pass costs change only
        when a cycle is observed."""
        self._sizes: list[int] = sorted(self._target)
        self._interpolated: dict[float, float] = {}

    def fresh(self) -> "Costs":
        """A copy at the calibration's pass costs (healed) and the current draft costs:
        what a new AutoPolicy starts from, apart from these estimates as they move on."""
        self.heal()
        return Costs(self.calibrated, self.per_draft_token, self.per_catch_up_token)

    def target_pass(self, n: float) -> float:
        """Time of a target pass over n tokens, interpolated between measured sizes."""
        seconds = self._interpolated.get(n)
        if seconds is None:
            seconds = self._interpolated[n] = self._interpolate(n)
        return seconds

    def _interpolate(self, n: float) -> float:
        return interpolate(self.target, self._sizes, n)

    def break_even(self, name: str) -> float:
        """How likely a drafter's next guess must be to be accepted for drafting
        it to pay on this machine: it costs a draft step and a verify column, and
        saves a target pass when it and every guess before it are right. High
        where a verify column costs nearly a pass (a compute-bound CPU), low
        where it is almost free (a GPU)."""
        single, largest = self.target_pass(1), max(self.target)
        column = (self.target_pass(largest) - single) / (largest - 1) if largest > 1 else single
        return min(1.0, (self.per_draft_token.get(name, 0.0) + column) / single)

    def draft(self, name: str, steps: float) -> float:
        return self.per_draft_token.get(name, 0.0) * steps

    def catch_up(self, name: str, behind: int) -> float:
        """What reading `behind` missed tokens costs a drafter beyond a steady cycle's catch-up."""
        return self.per_catch_up_token.get(name, 0.0) * max(0, behind - STEADY_CATCH_UP)

    def observe(self, report: CycleReport) -> None:
        """A cycle's pass updates its size's estimate and the drift, which moves
        every size not measured since the calibration: passes run dearer at a long
        context or beside a busy neighbour, and a size left at its calibrated cost
        beside a single pass measured dearer would look cheap (a short draft priced
        to pay on a machine where it loses)."""
        n = report.drafted + 1
        calibrated = interpolate(self.calibrated, self.calibrated_sizes, n) if self.calibrated else 0.0
        if calibrated > 0:
            self.drift += EMA * (report.verify_s / calibrated - self.drift)
        old = self.target.get(n)
        self.target[n] = report.verify_s if old is None else old + EMA * (report.verify_s - old)
        if n in self.calibrated:
            self.seen.setdefault(n, collections.deque(maxlen=HEAL_KEPT)).append(report.verify_s)
        self.observed.add(n)
        for size in self.calibrated_sizes:
            if size not in self.observed:
                self.target[size] = self.calibrated[size] * self.drift
        self._changed()
        if report.plan.drafter is None:
            return
        name = report.plan.drafter.name
        if report.caught_up > STEADY_CATCH_UP:  # its draft time is mostly reading: no draft step to learn
            if report.caught_up >= CATCH_UP_PROBE:
                # A short catch-up is mostly a pass's fixed cost, and would price a long one at
                # a fraction of its time (3 tokens: a third of a step each), letting auto risk
                # more than its ledger holds.
                _ema(self.per_catch_up_token, name, per_missed_token(report.catch_up_s, report.caught_up))
        elif report.asked > 0:  # the step that found a guess too unsure counts too
            _ema(self.per_draft_token, name, report.draft_s / (report.drafted + report.stopped))


def interpolate(costs: dict[int, float], sizes: list[int] | tuple[int, ...], n: float) -> float:
    """The time of a pass over n tokens from `costs` (by size; `sizes`, sorted):
    linear between measured sizes, past the largest along the last slope, below
    the smallest at its cost."""
    if n in costs:
        return costs[n]
    i = bisect.bisect(sizes, n)  # sizes[i - 1] < n < sizes[i]
    if i == len(sizes):  # beyond the largest measured size: extend the last slope
        if i == 1:
            return costs[sizes[0]] * n / sizes[0]
        lower, upper = sizes[-2], sizes[-1]
    else:
        lower, upper = sizes[max(i - 1, 0)], sizes[i]
        if i == 0:  # below the smallest: its cost
            return costs[upper]
    t_lo, t_hi = costs[lower], costs[upper]
    return t_lo + (t_hi - t_lo) * (n - lower) / (upper - lower)


def _ema(estimates: dict[str, float], name: str, value: float) -> None:
    old = estimates.get(name)
    estimates[name] = value if old is None else old + EMA * (value - old)


def measure_pass(seq: KVSequence, n: int, *, repeats: int = 2, all_logits: bool = True) -> float:
    """Seconds for one pass over n tokens after what `seq` holds (the fastest of
    `repeats`), with every token's logits as a verify pass needs them (else the last
    token's, as a reading); the cache is left as it was."""
    base = len(seq.tokens)
    filler = (seq.tokens[-1:] or [0]) * n
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        seq.extend(filler, all_logits=all_logits)
        best = min(best, time.perf_counter() - start)
        seq.truncate(base)
    return best


CATCH_UP_PROBE = 16
"""Tokens of the draft model's calibration batch, the price of reading missed history."""

READING_LOGITS = "last"
"""How the kept reading price was measured (`reading_logits`): a calibration kept
without it priced reading with every token's logits, and its draft model is measured again."""


def pass_sizes(k_max: int) -> list[int]:
    """The target passes the calibration measures: 1 token, every power of two and
    the size just past it, up to a draft of k_max (k_max + 1). A pass costs less a
    token the longer it is, and not along a line, nor always more for more tokens:
    CPU kernels multiply a batch's columns in blocks (llama.cpp's repacked weights
    4 at a time, the rest one by one), so a pass costs a step more just past each
    multiple of the block (AMD EPYC Zen 5, 2 threads: 16 tokens 149 ms, 15 180 ms,
    17 182 ms). Measured at and past each power of two, the steps of any such block
    show, and auto drafts for the cheap side of them (AutoPolicy: `k_choices`)."""
    sizes, n = {1, k_max + 1}, 2
    while n <= k_max:
        sizes |= {n, n + 1}
        n *= 2
    return sorted(sizes)


def calibrate(target: KVSequence, draft: KVSequence | None, k_max: int,
              measured: dict[int, float] | None = None) -> Costs:
    """Quick cost measurement at load: target passes of `pass_sizes(k_max)` (those
    not `measured` already), one draft-model token, and a draft batch read as a
    catch-up or a prompt is, with the last token's logits only (every token's cost
    the bundled 0.5B draft a quarter more). Each pass once, longest first, after one
    untimed pass over the longest: a process's first passes run up to a quarter
    slower (AMD EPYC Zen 5: 687 ms against 555 for 64 tokens), later ones within a
    few percent, and a first run waits for the calibration (13 sizes to 65 tokens:
    3.0 s there, against 1.3 s for the 4 measured before)."""
    target_costs = dict(measured or {})
    sizes = [n for n in reversed(pass_sizes(k_max)) if n not in target_costs and n <= target.room]
    if sizes:
        measure_pass(target, sizes[0], repeats=1)
    for n in sizes:
        target_costs[n] = measure_pass(target, n, repeats=1)
    draft_costs, catch_up_costs = {"lookup": 0.0}, {}
    if draft is not None and draft.room > 1:
        draft_costs["draft"] = measure_pass(draft, 1)
        n = min(CATCH_UP_PROBE, draft.room - 1)
        catch_up_costs["draft"] = per_missed_token(measure_pass(draft, n, all_logits=False), n)
    return Costs(target_costs, draft_costs, catch_up_costs)


def save_costs(costs: Costs, path: Path) -> None:
    """Keep a calibration for the next process on the same machine and models (a
    one-shot `chat` or `generate` would otherwise pay for it every time).
    Best effort: a failed write only means measuring again next time."""
    data = {"target": {str(n): t for n, t in costs.calibrated.items()},
            "per_draft_token": costs.per_draft_token, "per_catch_up_token": costs.per_catch_up_token,
            "reading_logits": READING_LOGITS}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError as e:
        logging.getLogger("edgespec.cache").warning("could not keep the calibration in %s: %s", path, e)
        with contextlib.suppress(OSError):  # (no folder to clean: a file in its place)
            tmp.unlink(missing_ok=True)


def keep_healed(costs: Costs, path: Path) -> None:
    """Lower the calibration kept in `path` to `costs`' healed one (Costs.heal) where
    that is less, and write it again if it changed; its draft prices stay as kept
    (measured at load: the running ones follow the last reply's context). Only
    lowered: another process may have kept a lower one meanwhile. None kept (not
    there, or not one): none made. Best effort, as save_costs."""
    costs.heal()
    kept = load_costs(path)
    if kept is not None and kept.lower_to(costs.calibrated):
        save_costs(kept, path)


def load_costs(path: Path) -> Costs | None:
    """A calibration save_costs kept, or None (none, or not one: measured again).
    Kept without `reading_logits`, its reading price is none: an earlier version
    measured it otherwise (with every token's logits, or over all the batch's tokens)."""
    try:
        data = json.loads(read_kept(path, limit=KEPT_MAX_BYTES))
        target = {int(n): float(t) for n, t in data["target"].items()}
        draft = {str(k): float(v) for k, v in data["per_draft_token"].items()}
        catch_up = {str(k): float(v) for k, v in data["per_catch_up_token"].items()}
        if data.get("reading_logits") != READING_LOGITS:
            catch_up = {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return None  # not a calibration (OverflowError: a number past a float; RecursionError: json's nesting limit)
    values = [*target.values(), *draft.values(), *catch_up.values()]
    if not target or any(n < 1 for n in target) or not all(math.isfinite(v) and v >= 0 for v in values):
        return None
    return Costs(target, draft, catch_up)
