"""Auto mode replayed on recorded replies of the bundled pair (tests/data/
bundled_traces.json, written by scripts/speculation_ceiling.py --save-traces)
under the costs of several machines (replay.MACHINES): on none may it be slower
than plain decoding, and on every one it must reach what the best fixed mode,
chosen per reply in hindsight, reaches."""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.engine.auto import AutoPolicy, Ledger
from edgespec.engine.choice import ACCEPTANCE_PRIORS
from edgespec.engine.drafters import PromptLookup
from edgespec.limits import LIMITS
from edgespec.engine.replay import (
    MACHINES, ReplayedDraft, SuiteRow, best_setting, load_traces, machine_costs, plain_seconds, replay, replay_auto,
    replay_suite, steady_best_fixed,
)

TRACES = Path(__file__).parent / "data" / "bundled_traces.json"
DEV_TRACES = Path(__file__).parent / "data" / "dev_traces.json"
"""Replies to tests/data/dev_prompts.yaml: a development suite for auto mode, apart from the benchmark's."""
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "speculation_ceiling.py"
K = LIMITS["k"].default
"""--k's default (the profiles' costs go to 17-token passes: k 16 at most)."""


@functools.cache
def replayed(machine: str, *, charged: bool = True) -> tuple[SuiteRow, ...]:
    """The suite replayed as the engine pays for it: the draft model's reading of each
    prompt included, by auto where it warms the model and by the fixed draft modes
    (`charged`); else that reading is free, and what is left is the cycles."""
    return tuple(replay_suite(load_traces(TRACES), machine_costs(machine), K, charge_warming=charged))


def table(rows) -> str:
    return ", ".join(f"{r.name} {r.auto:.2f}x (best fixed {r.fixed_mode} k={r.fixed_k} {r.fixed:.2f}x, "
                     f"ceiling {r.ceiling:.2f}x)" for r in rows)


def within_the_ledger(plain_s: float, auto_s: float, machine: str, *, allowances: int = 1) -> bool:
    """A reply loses at most what its ledger allows exploration (`allowances` of
    ALLOWANCE: twice where a drafter bets again what it saved in earlier replies)
    and the overshoot of the cycles that found the budget spent (two plain passes)."""
    return auto_s - plain_s <= allowances * Ledger.ALLOWANCE * plain_s + 2 * machine_costs(machine).target_pass(1)


@pytest.mark.parametrize("machine", MACHINES)
def test_auto_is_never_slower_than_plain_decoding(machine):
    """Over the suite, auto is at least as fast as plain decoding on every machine.
    On a single reply it may lose what a reply's ledger allows and what earlier
    replies saved (Ledger: twice the allowance); the draft model's reading of the
    prompt, paid before any cycle, is such a bet, made on what it saved in the last
    reply or on what it is expected to save (AutoPolicy.WARM_MARGIN)."""
    rows = replayed(machine)
    assert sum(r.auto_s for r in rows) <= sum(r.plain_s for r in rows) * (1 + 1e-9), table(rows)
    for r in rows:
        assert within_the_ledger(r.plain_s, r.auto_s, machine, allowances=2), table(rows)


@pytest.mark.parametrize("machine", MACHINES)
def test_auto_cycles_lose_no_more_than_a_replys_ledger_allows(machine):
    """The cycles alone (the draft model's reading of each prompt free): within one
    allowance, as the ledger prices every bet."""
    for r in replayed(machine, charged=False):
        assert within_the_ledger(r.plain_s, r.auto_s, machine), r


@pytest.mark.parametrize("machine", MACHINES)
def test_auto_is_never_slower_than_plain_decoding_on_the_development_suite_either(machine):
    """The same bounds on 30 more replies (tests/data/dev_prompts.yaml: free-form,
    code and edits of 19 to 128 tokens), one AutoPolicy for all of them as in the app."""
    truth = machine_costs(machine)
    traces = load_traces(DEV_TRACES)
    for charged, allowances in ((True, 2), (False, 1)):
        times = [(plain_seconds(t, truth), auto_s)
                 for t, auto_s in zip(traces, replay_auto(traces, truth, K, charge_warming=charged))]
        assert sum(a for _, a in times) <= sum(p for p, _ in times) * (1 + 1e-9)
        for trace, (plain, auto_s) in zip(traces, times):
            assert within_the_ledger(plain, auto_s, machine, allowances=allowances), (trace.name, charged,
                                                                                      plain / auto_s)


@pytest.mark.parametrize("machine", MACHINES)
def test_a_first_reply_is_never_slower_than_plain_decoding(machine):
    """Each reply of both suites as a session's first (a fresh AutoPolicy, nothing
    learnt or carried), the draft model's reading of the prompt paid: within one
    allowance. A short edit (19 tokens) must not pay for a reading that only a
    reply of the usual length could win back (it lost 16% on a CPU)."""
    truth = machine_costs(machine)
    for trace in [*load_traces(TRACES), *load_traces(DEV_TRACES)]:
        plain, (auto_s,) = plain_seconds(trace, truth), replay_auto([trace], truth, K, charge_warming=True)
        assert within_the_ledger(plain, auto_s, machine), (trace.name, plain / auto_s)


NOT_YET = pytest.mark.xfail(strict=True, reason="the goal of the issue 'auto takes what pays', not reached yet")


def machines(*not_yet: str) -> list:
    return [pytest.param(m, marks=NOT_YET) if m in not_yet else m for m in MACHINES]


@pytest.mark.parametrize("machine", machines("cpu 2 threads", "cpu 1 thread", "cpu exact kernels", "dear draft",
                                             "cpu kernel blocks", "gpu", "slow link"))
def test_auto_reaches_the_best_fixed_mode_of_each_reply(machine):
    """Per reply at least 0.9x the fixed mode and k that was fastest for it, in hindsight.
    Not yet on most profiles: the fixed mode is chosen knowing whether the reply
    copies the prompt (lookup k=5 on fix-typo) or is code the draft model gets right
    (draft k=3 on write-function), which auto learns from the reply's first cycles at
    a risk its ledger bounds (0.85x of both on a 2-thread CPU)."""
    rows = replayed(machine)
    assert min(r.auto / r.fixed for r in rows) >= 0.9, table(rows)


@pytest.mark.parametrize("machine", machines("cpu exact kernels", "cpu kernel blocks", "gpu", "slow link"))
def test_auto_reaches_the_best_fixed_modes_over_the_suite(machine):
    """Over the suite at least 0.97x the fixed modes fastest for each reply, together."""
    rows = replayed(machine)
    assert sum(r.fixed_s for r in rows) >= 0.97 * sum(r.auto_s for r in rows), table(rows)


@pytest.mark.parametrize("machine", machines("cpu 2 threads", "cpu kernel blocks", "gpu", "slow link"))
def test_auto_reaches_the_steady_best_fixed_mode(machine):
    """The goals above against the best fixed mode with the luck of one k taken out
    (steady_best_fixed: each k scored with its neighbours): per reply 0.9x, over the
    suite 0.97x. Not yet where auto leaves the draft model cold on code (write-function
    on a 2-thread CPU: 0.87x of draft k=3), or takes lookup's long drafts where the draft
    model's pay more (a GPU, a slow link: reformat-json, fix-typo)."""
    rows = replayed(machine)
    assert min(r.auto / r.steady for r in rows) >= 0.9, table(rows)
    assert sum(r.plain_s / r.steady for r in rows) >= 0.97 * sum(r.auto_s for r in rows), table(rows)


@pytest.mark.parametrize("machine", MACHINES)
def test_auto_keeps_what_it_reached(machine):
    """Where the goals above are not reached yet, what is: over the suite 0.92x
    the best fixed modes, per reply 0.75x; 0.6x over a slow link, where auto reads
    a short edit's prompt into the draft model on the strength of the last reply
    (a tenth of the reply's time there) and prompt lookup then copies it alone."""
    rows = replayed(machine)
    assert sum(r.fixed_s for r in rows) >= 0.92 * sum(r.auto_s for r in rows), table(rows)
    assert min(r.auto / r.fixed for r in rows) >= (0.6 if machine == "slow link" else 0.75), table(rows)


@pytest.mark.parametrize("machine", MACHINES)
def test_no_one_setting_beats_auto_over_the_suite(machine):
    """The one `--mode M --k K` fastest over the whole suite, chosen in hindsight (what
    a user who tuned it once for every reply gets: `--mode draft --k 3` beat auto on a
    2-thread CPU when the issue was filed), is no faster than auto over the suite.
    Where the draft model costs a tenth of a target pass, draft k=3 pays on chat too
    (68% agreement): auto gets there by rating an idle draft model again at its
    long-run rate (AutoPolicy._fade_idle), not at the low of the stretch it dropped
    it after."""
    rows = replayed(machine)
    (mode, k), seconds = best_setting(rows)
    assert sum(r.auto_s for r in rows) <= seconds * (1 + 1e-9), (mode, k, sum(r.plain_s for r in rows) / seconds,
                                                                  table(rows))


def test_the_steady_best_fixed_mode_takes_the_luck_of_one_k_out():
    """A k that happens to end its drafts where a reply's edits are (lookup k=5 on
    fix-typo: 1.63x where k=4 and k=6 give 1.44x and 1.51x) is not what a fixed mode
    can be counted on for: each setting is scored by the mean of its k and the k on
    either side (the setting itself where there is none), and the steadiest best is
    reported beside the luckiest."""
    lookup = dict(zip(range(1, 7), (9.0, 8.0, 7.5, 7.0, 5.0, 7.0)))
    draft = dict(zip(range(1, 7), (8.0, 6.6, 6.0, 6.3, 6.9, 7.5)))
    settings = {("plain", 0): 10.0, **{("lookup", k): s for k, s in lookup.items()},
                **{("draft", k): s for k, s in draft.items()}}
    assert steady_best_fixed(settings) == (("draft", 3), pytest.approx(6.3))  # lookup k=5 and k=6: 6.33
    row = SuiteRow("r", 10.0, 6.5, "lookup", 5, 5.0, 4.0, settings)
    assert row.steady == pytest.approx(10.0 / 6.3)
    assert steady_best_fixed({("plain", 0): 10.0, ("lookup", 1): 12.0, ("lookup", 2): 11.0}) == (("plain", 0), 10.0)
    assert steady_best_fixed({("plain", 0): 10.0, ("lookup", 1): 8.0, ("lookup", 2): 11.0}) == (("lookup", 1),
                                                                                             pytest.approx(9.0))


def test_the_best_setting_is_the_fastest_over_the_suite_not_per_reply():
    settings = [{("plain", 0): 10.0, ("draft", 3): 6.0, ("lookup", 2): 9.0},
                {("plain", 0): 10.0, ("draft", 3): 12.0, ("lookup", 2): 7.0}]
    rows = [SuiteRow(f"r{i}", 10.0, 10.0, "", 0, min(s.values()), 5.0, s) for i, s in enumerate(settings)]
    assert best_setting(rows) == (("lookup", 2), 16.0)  # draft k=3 wins one reply, 18 s in all


@NOT_YET
def test_auto_pays_on_a_two_thread_cpu():
    rows = replayed("cpu 2 threads")
    assert sum(r.plain_s for r in rows) >= 1.2 * sum(r.auto_s for r in rows), table(rows)


@pytest.mark.parametrize("machine", ["gpu", "slow link", "cpu 2 threads"])
def test_auto_wins_on_edits_wherever_verifying_is_cheaper_than_decoding(machine):
    rows = {r.name: r.auto for r in replayed(machine)}
    edits = [rows[name] for name in ("fix-typo", "reformat-json", "rename-variable")]
    assert statistics.geometric_mean(edits) > 1.25, rows


@pytest.mark.parametrize("machine", ["gpu", "cpu 2 threads"])
def test_no_cycle_of_auto_drafts_more_than_k(machine):
    """--k 2: no cycle drafts more than 2 tokens, whichever drafter auto takes."""
    truth = machine_costs(machine)
    draft, lookup = ReplayedDraft(truth), PromptLookup()
    drafted = []

    class Recording(AutoPolicy):
        def observe(self, report):
            drafted.append(report.drafted)
            super().observe(report)

    auto = Recording(machine_costs(machine), [lookup, draft], k_max=2, priors=ACCEPTANCE_PRIORS)
    for trace in load_traces(TRACES):
        replay(auto, trace, truth, draft)
    assert max(drafted) == 2


def ceiling_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--traces", str(TRACES), *args],
                          capture_output=True, text=True, timeout=300)


def test_the_ceiling_script_prints_what_the_replay_measures_as_json():
    done = ceiling_script("--machine", "gpu", "--machine", "cpu 2 threads", "--charge-warming", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [m["machine"] for m in report] == ["gpu", "cpu 2 threads"]
    rows = replayed("cpu 2 threads")
    prompts = report[1]["prompts"]
    assert [p["id"] for p in prompts] == [r.name for r in rows]
    assert {p["category"] for p in prompts} == {"free-form", "code", "grounded"}
    for p, r in zip(prompts, rows):
        assert (p["plain_s"], p["auto"], p["best_fixed"], p["ceiling"]) == pytest.approx((r.plain_s, r.auto, r.fixed,
                                                                                          r.ceiling))
        assert (p["best_fixed_mode"], p["best_fixed_k"]) == (r.fixed_mode, r.fixed_k)
        assert p["best_fixed_steady"] == pytest.approx(r.steady)
    assert report[1]["suite"]["auto"] == pytest.approx(sum(r.plain_s for r in rows) / sum(r.auto_s for r in rows))
    assert report[1]["suite"]["best_fixed_steady"] == pytest.approx(sum(r.plain_s for r in rows)
                                                                     / sum(r.plain_s / r.steady for r in rows))
    (mode, k), seconds = best_setting(rows)
    assert (report[1]["suite"]["best_setting_mode"], report[1]["suite"]["best_setting_k"]) == (mode, k)
    assert report[1]["suite"]["best_setting"] == pytest.approx(sum(r.plain_s for r in rows) / seconds)


def test_the_ceiling_script_says_which_traces_it_cannot_read(tmp_path):
    """A traces file missing or not one: one line naming it, no traceback."""
    (tmp_path / "bad.json").write_text("{not json")
    for path in (tmp_path / "missing.json", tmp_path / "bad.json"):
        done = ceiling_script("--traces", str(path), "--machine", "gpu")
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert str(path) in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_ceiling_script_replays_several_files_as_one_suite_in_several_orders():
    """--traces twice: one suite, in the order given; --orders 2: that order and a
    shuffle of it, each with its own suite figures (the first is the suite's)."""
    done = ceiling_script("--traces", str(DEV_TRACES), "--machine", "gpu", "--orders", "2", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    names = [t.name for t in (*load_traces(TRACES), *load_traces(DEV_TRACES))]
    assert [p["id"] for p in report["prompts"]] == names
    assert len(report["orders"]) == 2 and report["orders"][0] == report["suite"]
    rows = replay_suite([*load_traces(TRACES), *load_traces(DEV_TRACES)], machine_costs("gpu"), K)
    assert report["suite"]["auto"] == pytest.approx(sum(r.plain_s for r in rows) / sum(r.auto_s for r in rows))
    assert report["orders"][1]["best_fixed"] == pytest.approx(report["suite"]["best_fixed"])  # hindsight: any order


def test_charging_the_draft_models_reading_of_the_prompt_costs_draft_modes_alone():
    """ReplayedDraft(charge_prefill=True): a fixed draft mode takes longer by the draft
    model's reading of the prompt; prompt lookup reads nothing and takes as long."""
    from edgespec.engine.policy import FixedPolicy

    costs, trace = machine_costs("cpu 2 threads"), load_traces(TRACES)[4]
    free, charged = ReplayedDraft(costs), ReplayedDraft(costs, charge_prefill=True)
    reading = costs.catch_up("draft", len(trace.prompt))
    assert reading > 0
    assert (replay(FixedPolicy(charged, 3), trace, costs, charged)
            == pytest.approx(replay(FixedPolicy(free, 3), trace, costs, free) + reading))
    lookup = PromptLookup()
    assert (replay(FixedPolicy(lookup, 3), trace, costs, charged)
            == pytest.approx(replay(FixedPolicy(lookup, 3), trace, costs, free)))


def test_the_chats_reading_ahead_is_replayed_on_no_replys_clock():
    """ReplayedDraft(read_ahead_but=N): the prompt but its last N tokens is read into the
    policy's drafters before the reply, as the chat reads a message while it is written;
    a fixed draft mode then pays for reading those N alone. Auto reads ahead a draft
    model that can pay on the machine (cpu 2 threads), and not one that cannot (a CPU
    where batching gains nothing): there it takes as long as without."""
    from edgespec.engine.policy import FixedPolicy

    costs, trace = machine_costs("cpu 2 threads"), load_traces(TRACES)[4]
    free, ahead = ReplayedDraft(costs), ReplayedDraft(costs, charge_prefill=True, read_ahead_but=8)
    assert (replay(FixedPolicy(ahead, 3), trace, costs, ahead)
            == pytest.approx(replay(FixedPolicy(free, 3), trace, costs, free) + costs.catch_up("draft", 8)))
    traces = load_traces(TRACES)
    for machine, reads in (("cpu 2 threads", True), ("no batching gain", False)):
        truth = machine_costs(machine)
        charged = replay_auto(traces, truth, K, charge_warming=True)
        typed = replay_auto(traces, truth, K, charge_warming=True, read_ahead_but=8)
        assert (typed != charged) is reads, machine


def test_the_ceiling_script_replays_each_reply_as_a_sessions_first():
    """--first-replies: the suite's figures with each reply replayed by a fresh AutoPolicy."""
    done = ceiling_script("--machine", "cpu 2 threads", "--charge-warming", "--first-replies", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    truth = machine_costs("cpu 2 threads")
    traces = load_traces(TRACES)
    alone = [replay_auto([t], truth, K, charge_warming=True)[0] for t in traces]
    plain = [plain_seconds(t, truth) for t in traces]
    assert report["first_replies"]["auto"] == pytest.approx(sum(plain) / sum(alone))
    assert report["first_replies"]["slowest_auto"] == pytest.approx(min(p / a for p, a in zip(plain, alone)))
    assert report["first_replies"]["best_fixed"] == pytest.approx(report["suite"]["best_fixed"])


def test_recorded_traces_need_a_machine_to_be_replayed_on():
    done = ceiling_script()
    assert done.returncode != 0 and done.stderr and "Traceback" not in done.stderr


def test_the_proposal_ceiling_takes_every_right_proposal_at_its_best_length():
    """The bound bench_repeat.py --ceiling prints: with passes that cost the same at
    any size, a proposer always right produces the reply in one pass per k + 1
    tokens; one never right, or passes that cost by the token, gain nothing."""
    from edgespec.engine.costs import Costs
    from edgespec.engine.replay import proposal_ceiling

    prompt, reply = [0], list(range(1, 10))  # the first token comes with the prompt: 8 to go
    flat, linear = Costs({1: 1.0, 17: 1.0}, {}), Costs({1: 1.0, 17: 17.0}, {})

    def right(history):
        return reply[len(history) - len(prompt):]

    def wrong(history):
        return [99] * 16

    assert proposal_ceiling(prompt, reply, flat, 16, [right]) == pytest.approx(1.0)
    assert proposal_ceiling(prompt, reply, flat, 3, [right]) == pytest.approx(2.0)
    assert proposal_ceiling(prompt, reply, flat, 16, [wrong]) == pytest.approx(8.0)
    assert proposal_ceiling(prompt, reply, linear, 16, [right, wrong]) == pytest.approx(8.0)


def test_a_recorded_trace_holds_what_draft_and_target_were_sure_of(smollm2, tmp_path):
    """--save-traces records, for each reply position, the draft model's guess and top
    probability and the target's own: with one model as both, the two agree."""
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text('prompts:\n  - {id: count, category: free-form, prompt: "Count from one to five."}\n')
    saved = tmp_path / "traces.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--target", str(smollm2), "--draft", str(smollm2),
                           "--ctx", "512", "--k", "3", "--prompts", str(prompts), "--max-tokens", "12",
                           "--save-traces", str(saved)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (trace,) = load_traces(saved)
    assert trace.name == "count" and len(trace.reply) == 12
    assert trace.guess == trace.reply  # its own greedy choice, read back
    assert len(trace.target_confidence) == len(trace.reply)
    assert trace.target_confidence == pytest.approx(trace.confidence, abs=0.02)
    assert all(0.0 < p <= 1.0 for p in trace.target_confidence)


def test_traces_recorded_before_the_target_confidence_still_load(tmp_path):
    old = {k: v for k, v in vars(load_traces(TRACES)[0]).items() if k != "target_confidence"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps([old]))
    (trace,) = load_traces(path)
    assert trace.target_confidence is None and trace.reply == old["reply"]


def test_the_bounds_script_tells_auto_each_replys_rate_or_lends_it_the_whole_reply():
    """scripts/auto_bounds.py replays auto beside variants that know or risk more: "told"
    prices the draft model at the reply's own rates from the prompt on, "loose" lends a
    whole reply's time to its ledger; its auto row is the tests' replay."""
    import importlib.util

    from edgespec.engine.policy import Bucket

    spec = importlib.util.spec_from_file_location("auto_bounds", SCRIPT.parent / "auto_bounds.py")
    bounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bounds)
    costs, traces = machine_costs("gpu"), load_traces(TRACES)
    truth = {tuple(t.prompt): bounds.reply_acceptance(t, costs) for t in traces}
    assert truth[tuple(traces[8].prompt)].rate > 0.9 > truth[tuple(traces[0].prompt)].rate  # reformat-json, chat

    def fresh(policy):
        return policy(costs.fresh(), [PromptLookup(), ReplayedDraft(costs)], k_max=K, priors=ACCEPTANCE_PRIORS)

    told = fresh(bounds.told(truth))
    for trace in (traces[8], traces[0]):
        told.prefill(trace.prompt)
        assert told._acceptance(Bucket("draft")).rate == pytest.approx(truth[tuple(trace.prompt)].rate)
    loose = fresh(bounds.loose(AutoPolicy))
    loose.prefill(traces[0].prompt)
    assert loose.ledger.credit >= loose.ledger.expected_s / 2 > 0
    report = bounds.bounds(traces, "gpu", K, None)
    rows = replayed("gpu")
    assert report["auto"]["speedup"] == pytest.approx(sum(r.plain_s for r in rows) / sum(r.auto_s for r in rows))
    assert report["best_fixed"] == pytest.approx(sum(r.plain_s for r in rows) / sum(r.fixed_s for r in rows))
