"""Which policy a reply decodes with: plain, a fixed drafter and k, or auto mode,
whose one AutoPolicy per engine carries its costs and acceptance from reply to
reply; and the longest verify pass the target may run (with exact kernels,
measured once by the exactness probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from edgespec.engine.auto import AutoPolicy
from edgespec.engine.costs import calibrate, keep_healed, load_costs, pass_sizes, save_costs
from edgespec.engine.drafters import Drafter
from edgespec.engine.events import MODES, GenerationParams
from edgespec.engine.exact import largest_exact_batch
from edgespec.limits import MAX_DRAFT
from edgespec.engine.policy import Deferred, FixedPolicy, Policy

FAST_MAX_BATCH = MAX_DRAFT + 1
"""Without exact kernels: the longest verify pass (the last token and the longest draft)."""

ACCEPTANCE_PRIORS = {"draft": 0.7, "lookup": 0.5}
"""What auto mode assumes before it has seen a drafter at work: a same-family
draft model agrees with its target most of the time; a lookup match is a coin toss."""


def decoded_mode(params: GenerationParams) -> str:
    """The mode a reply is decoded in: params.mode, but plain for a seed with a temperature
    in auto mode. Auto's choices depend on timings, and a sampled reply on what was drafted:
    a seed promises the same reply."""
    if params.mode == "auto" and params.seed is not None and params.temperature > 0:
        return "plain"
    return params.mode


class Policies:
    """The policies of one engine's replies."""

    def __init__(self, target, draft, *, exact: bool, drafters: Sequence[Drafter],
                 costs_path: Callable[[int], Path | None]):
        """`target`, `draft`: the loaded models (their `seq`, the sequence in use, changes
        with the conversation); `drafters`: the engine's (drafters.engine_drafters);
        `costs_path(k_max)`: where a calibration is kept between runs (None: nowhere)."""
        self.target, self.draft = target, draft
        self.exact = exact
        self.drafters = list(drafters)
        self._by_mode = {d.name: d for d in self.drafters}
        """The mode table: a mode named after a drafter drafts with it alone."""
        self.costs_path = costs_path
        self.measured_batch: int = 0
        """max_verify_batch once known (with exact kernels, once the probe has run)."""
        self._probe_timings: dict[int, float] = {}
        self._auto: AutoPolicy | None = None
        self._kept: set[Path] = set()
        """Where auto's calibration was read from or kept (by k_max): each is healed at `keep_healed`."""

    def choose(self, params: GenerationParams) -> Policy:
        """The policy for params.mode: which drafter (if any) and how many tokens."""
        if params.mode not in MODES:
            raise ValueError(f"unknown mode {params.mode!r}: choose one of {', '.join(MODES)}")
        fixed = self._by_mode.get(params.mode)
        if params.mode == "draft" and fixed is None:
            raise ValueError("mode 'draft' needs a draft model: pass one, or use mode 'lookup' or 'auto'")
        if params.mode == "plain":
            return FixedPolicy(None, 0)
        if params.k == 0:
            return FixedPolicy(None, 0, f"plain decoding: k is 0, so {params.mode} mode drafts nothing")
        k_cap = self.max_verify_batch() - 1
        if k_cap < 1:
            return FixedPolicy(None, 0, "plain: no batch gives exact logits on this backend "
                                        "(without --exact it speculates)")
        if fixed is not None:
            return FixedPolicy(fixed, min(params.k, k_cap))
        return self._auto_policy(params, k_cap)

    def max_verify_batch(self) -> int:
        """The most tokens one verify pass may hold: FAST_MAX_BATCH (at most the
        context's batch), or with exact kernels the largest batch whose logits
        were measured to be exact."""
        if self.measured_batch:
            return self.measured_batch
        if self.exact:
            self.measured_batch, self._probe_timings = largest_exact_batch(self.target.seq)
        else:  # one llama_decode holds at most n_batch tokens (a small context lowers it)
            self.measured_batch = min(FAST_MAX_BATCH, self.target.seq.ctx.n_batch)
        return self.measured_batch

    def auto(self, params: GenerationParams) -> AutoPolicy:
        """The AutoPolicy, made (and so calibrated) now if it is not yet."""
        k_max = min(params.k, self.max_verify_batch() - 1)
        auto = self._make_auto(k_max)
        auto.k_max = k_max
        return auto

    def _auto_policy(self, params: GenerationParams, k_cap: int) -> Policy:
        k_max = min(params.k, k_cap)
        if self._auto is None or self._unmeasured(k_max):
            # made, or its calibration completed, after the reply's first token: measuring takes a second or two
            return Deferred(lambda: self._make_auto(k_max))
        self._auto.k_max = k_max
        return self._auto

    def _unmeasured(self, k_max: int) -> set[int]:
        """The passes auto prices drafts of up to k_max with that its calibration has not
        measured: it measures only those the context has room for, and one made at a
        nearly full context would price every draft from one-token passes for good."""
        return set(pass_sizes(k_max)) - set(self._auto.costs.calibrated)

    def forget_learnt(self) -> None:
        """Auto mode starts over as a new process would: every drafter at its prior, no
        reply seen; on the costs this process measured (measuring again takes seconds)."""
        if self._auto is not None:
            self._auto = AutoPolicy(self._auto.costs.fresh(), self.drafters, k_max=self._auto.k_max,
                                    priors=ACCEPTANCE_PRIORS)

    def keep_healed(self) -> None:
        """Keep auto's calibration as this process's cycles healed it (Costs.heal) for
        the next process: a calibration measured at a busy moment would otherwise price
        drafts wrong in every process after. Written where it changed, once (at the
        engine's close: on no reply's path)."""
        if self._auto is not None:
            for kept in sorted(self._kept):
                keep_healed(self._auto.costs, kept)

    def _make_auto(self, k_max: int) -> AutoPolicy:
        if self._auto is None:
            kept = self.costs_path(k_max)
            costs = load_costs(kept) if kept else None
            wanted = {n for n in pass_sizes(k_max) if n <= self.target.seq.room}
            if (costs is None or not wanted <= set(costs.calibrated)
                    or (self.draft is not None and "draft" not in costs.per_catch_up_token)):
                # none kept, or kept without sizes or a reading price measured now (an older
                # version's): those kept stand
                measured = {**(costs.calibrated if costs else {}), **self._probe_timings}
                costs = calibrate(self.target.seq, self.draft.seq if self.draft else None, k_max,
                                  measured=measured)
                if kept:
                    save_costs(costs, kept)
            if kept:
                self._kept.add(kept)
            self._auto = AutoPolicy(costs, self.drafters, k_max=k_max, priors=ACCEPTANCE_PRIORS)
        elif {n for n in self._unmeasured(k_max) if n <= self.target.seq.room}:
            costs = self._auto.costs
            measured = calibrate(self.target.seq, None, k_max, measured=costs.calibrated).calibrated
            costs.add_calibrated({n: s for n, s in measured.items() if n not in costs.calibrated})
            kept = self.costs_path(k_max)
            if kept:
                save_costs(costs, kept)
                self._kept.add(kept)
        self._auto.k_max = k_max
        return self._auto
