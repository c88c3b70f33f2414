"""The search's rules one by one: each bound on hand-made evidence (its figures known), the
rounds' stopping rule as a property, and every rule id stated in docs/search.md.

No child runs: ``Evidence`` is filled with results as a search would have them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.config import Knobs, MemoryProbe, StopReason, TrialResult
from autotune.errors import Interrupted
from autotune.search import bounds, reach_bounds
from autotune.search._records import Candidate, SearchSettings
from autotune.search.evidence import Evidence
from autotune.search.plan import Plan
from autotune.search.policy import (
    MOST_ROUNDS,
    ROUNDS,
    ROUNDS_LEAD,
    another_round,
    rechecked,
)
from autotune.search.rules import RULES, Skip
from autotune.units import MIB
from tests.scripted import BUDGET, CLASSES, plan

SETTINGS = SearchSettings(num_timed_steps=5, cache=False)
EAGER = Knobs(precision="bf16", compile_mode="off")
COMPILED = Knobs(precision="bf16", compile_mode="default")


def run(sps: float, micro_batch: int, *, peak_mib: float = 300, steps: int = 5,
        jitter: float = 0.0, retries: int = 0) -> TrialResult:
    """A timed run of ``steps`` steps at ``sps`` samples/s (per-device batch 64)."""
    step_s = 64 / sps
    times = tuple(step_s * (1 + (jitter if i % 2 else -jitter)) for i in range(steps))
    return TrialResult(status="ok", peak_bytes=int(peak_mib * MIB), step_times_s=times,
                       samples_per_step=64, first_loss=2.0, reference_loss=2.0,
                       num_alloc_retries=retries, wall_s=1.0)


def evidence(**runs: TrialResult) -> Evidence:
    """Evidence holding ``runs`` keyed as ``precision_mode_microbatch`` (e.g. bf16_off_32)."""
    ev = Evidence(Plan.of(plan(), CLASSES, {}), SETTINGS)
    for name, result in runs.items():
        precision, mode, micro_batch = name.split("_")
        ev.took(Candidate(knobs=Knobs(precision=precision, compile_mode=mode),
                          micro_batch=int(micro_batch)), result)
    base = Knobs(precision="fp32", compile_mode="off")
    ev.name_baseline(next((c for c in ev.results if c.knobs == base), None))
    return ev


def at(knobs: Knobs, micro_batch: int) -> Candidate:
    return Candidate(knobs=knobs, micro_batch=micro_batch)


def test_every_rule_id_is_stated_in_the_search_page() -> None:
    page = (Path(__file__).parent.parent / "docs" / "search.md").read_text()
    stated = set(re.findall(r"`([a-z-]+)`", page))
    assert set(RULES) <= stated, sorted(set(RULES) - stated)


def test_a_skip_with_an_unknown_rule_id_cannot_be_made() -> None:
    with pytest.raises(AssertionError, match="unknown rule id"):
        Skip("made-up", "", "text")


def test_gain_ceiling_stops_a_probe_only_when_the_ceiling_stays_behind_the_leader() -> None:
    # A sibling gained 1.05x from 8 to 16: spread over more samples, a larger micro-batch
    # of bf16/default can gain at most a little over that, so at 200 samples/s against a
    # leader at 400 it cannot win; at 390 (within the noise with its ceiling) it can.
    sibling = dict(fp32_off_8=run(100, 8), fp32_off_16=run(105, 16))
    ev = evidence(**sibling, bf16_off_32=run(400, 32), bf16_default_16=run(200, 16))
    why = bounds.larger(ev, at(COMPILED, 16))
    assert why is not None and why.rule == "gain-ceiling"
    assert why.figures["share"] == pytest.approx(0.5)
    assert 1.0 < why.figures["ceiling"] < 1.2
    ev = evidence(**sibling, bf16_off_32=run(400, 32), bf16_default_16=run(390, 16))
    assert bounds.larger(ev, at(COMPILED, 16)) is None


def test_over_budget_below_needs_the_run_behind_by_more_than_refine_within() -> None:
    over = run(200, 32, peak_mib=BUDGET / MIB + 50)  # ran, over the usable budget
    ev = evidence(fp32_off_32=run(100, 32), bf16_off_32=run(400, 32), bf16_default_32=over)
    why = bounds.below(ev, at(COMPILED, 32))
    assert why is not None and why.rule == "over-budget-below"
    close = run(380, 32, peak_mib=BUDGET / MIB + 50)
    ev = evidence(fp32_off_32=run(100, 32), bf16_off_32=run(400, 32), bf16_default_32=close)
    assert bounds.below(ev, at(COMPILED, 32)) is None
    assert bounds.below(ev, at(EAGER, 32)) is None  # an eager setting's smaller may win


def test_frees_nothing_only_where_the_leader_runs_the_whole_batch_without_retries() -> None:
    ev = evidence(bf16_off_64=run(400, 64))
    why = bounds.frees_nothing(ev, at(EAGER, 64))
    assert why is not None and why.rule == "frees-nothing"
    assert bounds.frees_nothing(evidence(bf16_off_64=run(400, 64, retries=2)),
                                at(EAGER, 64)) is None
    assert bounds.frees_nothing(evidence(bf16_off_32=run(400, 32)), at(EAGER, 32)) is None


def test_compiled_whole_batch_is_not_walked_down_unless_memory_presses() -> None:
    ev = evidence(bf16_default_64=run(400, 64))
    why = bounds.compiled_whole_batch(ev, COMPILED, [64, 32, 16])
    assert why is not None and why.rule == "compiled-whole-batch"
    assert "32, 16" in why.text
    pressed = evidence(bf16_default_64=run(400, 64, retries=1))
    assert bounds.compiled_whole_batch(pressed, COMPILED, [64, 32, 16]) is None
    assert bounds.compiled_whole_batch(ev, EAGER, [64, 32, 16]) is None


def test_compiled_whole_batch_is_walked_where_the_whole_batch_stopped_behind_a_smaller_one(
        ) -> None:
    # bf16/default at the whole batch (64) stopped after 3 steps, clearly behind the leader,
    # its own 32 at 1.2x: a smaller one ahead of the largest breaks the line. The early stop
    # left the largest no full figure, and the bound read that as no evidence (a fresh
    # non-monotone table: fused at 16, the leader, never walked down to its best at 4).
    stopped = replace(run(400, 64, steps=3), timing_stop="behind")
    ev = evidence(bf16_default_64=stopped, bf16_default_32=run(480, 32))
    assert bounds.compiled_whole_batch(ev, COMPILED, [64, 32, 16]) is None
    why = bounds.compiled_whole_batch(evidence(bf16_default_64=stopped), COMPILED, [64, 32, 16])
    assert why is not None and why.rule == "compiled-whole-batch"


def test_sibling_ratio_walks_a_compiled_setting_that_ran_slower_above_its_fit() -> None:
    # bf16/default fits 32; its run at 64 (over the usable budget) ran 0.9x: the step down
    # from 64 to 32 got faster, as a walk's does when its best is not its largest. Without
    # that run (or with it faster) and no sibling timed at 16 and 32, 16 is not timed.
    over = run(360, 64, peak_mib=BUDGET / MIB + 50)
    ev = evidence(bf16_default_32=run(400, 32), bf16_default_64=over)
    assert bounds.sibling_ratio(ev, COMPILED, [32], 16) is None
    for runs in ({}, {"bf16_default_64": replace(over, step_times_s=tuple(
            t * 0.8 for t in over.step_times_s))}):
        why = bounds.sibling_ratio(evidence(bf16_default_32=run(400, 32), **runs),
                                   COMPILED, [32], 16)
        assert why is not None and why.rule == "sibling-ratio", runs


def test_behind_refine_skips_a_mode_only_for_a_precision_behind_the_leader() -> None:
    ev = evidence(fp32_off_32=run(100, 32), bf16_off_32=run(400, 32))
    ev.probes = {k: None for k in (Knobs(precision="fp32", compile_mode="off"), EAGER)}
    fp32_max = Knobs(precision="fp32", compile_mode="max-autotune")
    why = bounds.mode(ev, fp32_max)
    assert why is not None and why.rule == "behind-refine"
    assert why.figures["share"] == pytest.approx(0.25)
    assert bounds.mode(ev, Knobs(precision="bf16", compile_mode="max-autotune")) is None


def test_line_predicts_loss_for_a_smallest_micro_batch_the_line_puts_behind() -> None:
    # Time per micro-batch linear in its size: 32 at 400/s, 16 at 380/s: 8 is predicted
    # slower still, so the run is not made; a compiled one must be predicted ahead.
    ev = evidence(bf16_off_32=run(400, 32), bf16_off_16=run(380, 16))
    why = bounds.line_predicts_loss(ev, EAGER, 8)
    assert why is not None and why.rule == "line-predicts-loss"
    ev = evidence(bf16_off_32=run(300, 32), bf16_off_16=run(400, 16))  # smaller is faster
    assert bounds.line_predicts_loss(ev, EAGER, 8) is None


@given(st.lists(st.floats(min_value=0.5, max_value=2.0), min_size=0, max_size=8))
def test_interleaved_rounds_stop_within_a_bound_whatever_they_say(shares: list[float]) -> None:
    # Fed round by round, the rounds end once one of the two is ahead in ROUNDS_LEAD rounds
    # more than the other (after ROUNDS at least), or at MOST_ROUNDS: never more, however
    # close the two are, and never on a tie.
    made: list[float] = []
    for share in shares:
        if not another_round(made):
            break
        made.append(share)
    ahead = sum(s > 1 for s in made)
    if len(shares) >= MOST_ROUNDS:
        assert ROUNDS <= len(made) <= MOST_ROUNDS
        assert not another_round(made)
        assert 2 * ahead != len(made)  # a majority decides
        assert abs(2 * ahead - len(made)) >= ROUNDS_LEAD or len(made) == MOST_ROUNDS
    if len(made) == ROUNDS and (made[0] > 1) == (made[1] > 1):
        assert not another_round(made)  # two rounds that agree decide
    if len(made) == 3:  # 2 of 3 is a lead of one: another round
        assert another_round(made)


def test_a_stored_timing_slower_now_beyond_the_noise_is_replaced_by_the_fresh_run() -> None:
    key = at(EAGER, 32)
    fresh, note = rechecked(key, run(400, 32), run(300, 32), SETTINGS)
    assert fresh and note.rule == "recheck" and note.figures["now"] == pytest.approx(300)
    fresh, note = rechecked(key, run(400, 32), run(395, 32), SETTINGS)
    assert not fresh and "within the noise" in note.text


def test_recompute_twin_skips_checkpointing_only_above_a_fit_that_got_slower() -> None:
    # bf16/off ran 400/s at 16 (the leader) and 300/s at 32: its own pair says a larger
    # micro-batch cannot catch up, so checkpointing (worth a run only above 32) cannot win.
    ev = evidence(fp32_off_16=run(100, 16), bf16_off_16=run(400, 16), bf16_off_32=run(300, 32))
    why = bounds.recompute(ev, at(EAGER, 16))
    assert why is not None and why.rule == "recompute-twin" and why.figures["largest"] == 32
    # where the largest timed fit is the leader, nothing bounds a larger micro-batch's gain
    ev = evidence(fp32_off_16=run(100, 16), bf16_off_16=run(300, 16), bf16_off_32=run(400, 32))
    assert bounds.recompute(ev, at(EAGER, 32)) is None
    # a fit under memory pressure is no floor: freeing memory can make it faster
    ev = evidence(fp32_off_16=run(100, 16), bf16_off_16=run(400, 16),
                  bf16_off_32=run(300, 32, retries=3))
    assert bounds.recompute(ev, at(EAGER, 16)) is None


@pytest.mark.parametrize("first", ["fp32_default", "bf16_max-autotune"])
def test_sibling_ratio_breaks_a_tie_by_the_order_the_runs_came_not_by_hashing(first: str) -> None:
    # Two siblings as alike to bf16/default (each shares one of precision and mode), both timed
    # at 16 and 32: the one timed first predicts, whatever the process's hash seed (a set of
    # settings once decided it, so two runs of one search could say different things).
    others = {"fp32_default": (95, 16), "bf16_max-autotune": (90, 16)}
    order = [first, *(k for k in others if k != first)]
    runs = {f"{name}_{m}": run(sps if m == 16 else 100, m) for name in order
            for sps, _ in [others[name]] for m in (32, 16)}
    ev = evidence(**runs, bf16_default_32=run(400, 32))
    why = bounds.sibling_ratio(ev, COMPILED, [32], 16)
    assert why is not None
    precision, mode = first.split("_")
    assert why.figures["sibling"] == Knobs(precision=precision, compile_mode=mode).label()


def test_sibling_ratio_walks_a_compiled_setting_down_only_on_evidence() -> None:
    # No setting timed at both 16 and 32: a compiled setting is not walked down (each step a
    # compile), an eager one is.
    ev = evidence(fp32_off_32=run(100, 32), bf16_default_32=run(400, 32))
    why = bounds.sibling_ratio(ev, COMPILED, [32], 16)
    assert why is not None and why.rule == "sibling-ratio"
    assert bounds.sibling_ratio(ev, Knobs(precision="fp32", compile_mode="off"), [32], 16) \
        is None
    # a sibling that ran 1.3x faster at 16 than at 32 is the evidence: walk it
    ev = evidence(fp32_off_32=run(100, 32), fp32_off_16=run(130, 16),
                  bf16_default_32=run(400, 32))
    assert bounds.sibling_ratio(ev, COMPILED, [32], 16) is None
    # one no faster at 16 predicts this one no faster either: not walked, with the figure
    ev = evidence(fp32_off_32=run(100, 32), fp32_off_16=run(95, 16),
                  bf16_default_32=run(400, 32))
    why = bounds.sibling_ratio(ev, COMPILED, [32], 16)
    assert why is not None and "0.95x" in why.text


def test_sibling_ratio_walks_the_compiled_leader_where_its_sibling_tied() -> None:
    def probed(**runs: TrialResult) -> Evidence:  # each setting probed: fits up to 32
        ev = evidence(**runs)
        for knobs in dict.fromkeys(c.knobs for c in ev.results):
            ev.probes[knobs] = MemoryProbe(
                knobs=knobs, max_micro_batch=32, peak_bytes=300 * MIB, budget_bytes=BUDGET,
                usable_bytes=BUDGET, candidates=(1, 2, 4, 8, 16, 32))
        return ev

    # bf16/default leads at 32 (400/s); fp32/off ran 0.98x at 16 what it ran at 32: within
    # the 5% noise, no evidence 16 loses, so the leader's setting is walked there
    ev = probed(fp32_off_32=run(100, 32), fp32_off_16=run(98, 16),
                bf16_default_32=run(400, 32))
    assert ev.leaders_setting() == COMPILED
    assert bounds.sibling_ratio(ev, COMPILED, [32], 16) is None
    # a compiled setting behind the leader needs the sibling faster beyond the noise
    ev = probed(fp32_off_32=run(100, 32), fp32_off_16=run(98, 16),
                bf16_default_32=run(400, 32), **{"bf16_max-autotune_32": run(420, 32)})
    assert ev.leaders_setting() == Knobs(precision="bf16", compile_mode="max-autotune")
    why = bounds.sibling_ratio(ev, COMPILED, [32], 16)
    assert why is not None and why.rule == "sibling-ratio"
    assert why.figures["ratio"] == pytest.approx(0.98)
    # the leader's too where the sibling went slower beyond the noise
    ev = probed(fp32_off_32=run(100, 32), fp32_off_16=run(90, 16),
                bf16_default_32=run(400, 32))
    why = bounds.sibling_ratio(ev, COMPILED, [32], 16)
    assert why is not None and why.figures["ratio"] == pytest.approx(0.90)


def test_sibling_ratio_walks_a_compiled_setting_on_past_a_step_that_tied() -> None:
    # bf16/default ran 400/s at 32 and 390/s at 16: within the 5% noise, a tie, so the line
    # (each step down slower by its extra update) did not show, and 8 is timed with no
    # sibling (issue 59's non-monotone tables: gains under the noise at each step, 1.28x at
    # 4 in all; the walk stopped at 8 for want of a sibling).
    ev = evidence(fp32_off_32=run(100, 32), bf16_default_32=run(400, 32),
                  bf16_default_16=run(390, 16))
    assert bounds.sibling_ratio(ev, COMPILED, [32, 16], 8) is None
    # 16 behind 32 beyond the noise is the line: with no sibling, 8 is not timed
    ev = evidence(fp32_off_32=run(100, 32), bf16_default_32=run(400, 32),
                  bf16_default_16=run(360, 16))
    why = bounds.sibling_ratio(ev, COMPILED, [32, 16], 8)
    assert why is not None and why.variant == "no-sibling"
    # the walk's best itself is no step that tied: one micro-batch walked is no evidence
    ev = evidence(fp32_off_32=run(100, 32), bf16_default_32=run(400, 32))
    assert bounds.sibling_ratio(ev, COMPILED, [32], 16) is not None


# ----------------------------------------------------------------------------------------------
# A batch of proposed runs: its results are taken in any order.

_BATCH = [at(Knobs(precision=p, compile_mode=m), mb)
          for p, m, mb in (("fp32", "off", 32), ("bf16", "off", 64), ("bf16", "default", 32),
                           ("bf16", "default", 16))]


@given(st.lists(st.tuples(st.floats(50, 500), st.floats(50, 500), st.booleans(),
                          st.booleans(), st.booleans()), min_size=2, max_size=len(_BATCH)),
       st.randoms(use_true_random=False))
def test_a_batch_of_proposed_runs_leaves_the_same_evidence_whatever_order_they_end_in(
        runs: list[tuple[float, float, bool, bool, bool]], rng) -> None:
    # Each candidate: its first run's and its run again's samples/s, whether the run again
    # ran out of memory, whether its first timing came from the study store (a re-check) and
    # whether the run again compiled afresh (a first launch; compiled, not stored, only).
    from autotune.search.executor import Executor, Proposal
    from autotune.search.stages import race

    def state(order: list[int]) -> tuple:
        ev = evidence()
        ex = Executor(ev, run=lambda spec: TrialResult(status="crash"), on_trial=None,
                      on_step=None)
        batch = []
        for key, (first, again, oom, stored, cold) in zip(_BATCH, runs, strict=False):
            ev.took(key, run(first, key.micro_batch, jitter=0.02))
            if stored:
                ev.stored.add(key)
            cold = cold and not stored and key.knobs.compile_mode != "off"
            result = TrialResult(status="oom", peak_bytes=2 * BUDGET) if oom else run(
                again, key.micro_batch, jitter=0.03)
            batch.append((Proposal(key, ex.spec(key, early_stop=False), cold=cold,
                                   recheck=stored), result))
        for i in order:
            proposal, result = batch[i]
            race.tell(ex, proposal, result, ev.record(proposal.candidate, result))
        return (ev.results, ev.runs, ev.drift, ev.cold, ev.stored,
                sorted(s.text for s in ev.skips), ev.ranked())

    order = list(range(len(runs)))
    shuffled = order[:]
    rng.shuffle(shuffled)
    assert state(order) == state(shuffled)


# ----------------------------------------------------------------------------------------------
# Why a search ended: a value, said in the words autotune.json and the footer wrote before it.

@pytest.mark.parametrize(("stop", "stopped_by", "said"), [
    (StopReason(), "", "every class was tried or pruned with a reason"),
    (StopReason("max-trials", "5"), "--max-trials reached (5 child runs)",
     "--max-trials reached (5 child runs): best so far"),
    (StopReason("time-budget"), "--time-budget reached", "--time-budget reached: best so far"),
    (StopReason("time-budget", "fp32/off/1"),
     "--time-budget reached during a run of fp32/off/1 (stopped)",
     "--time-budget reached during a run of fp32/off/1 (stopped): best so far"),
    (StopReason.signal(KeyboardInterrupt()), "interrupted (Ctrl-C)",
     "interrupted (Ctrl-C): best so far"),
    (StopReason.signal(Interrupted("SIGTERM", 15), "calibrating"),
     "interrupted (SIGTERM) while calibrating",
     "interrupted (SIGTERM) while calibrating: best config kept"),
])
def test_a_stop_reason_is_said_as_the_files_before_it_said_it(
        stop: StopReason, stopped_by: str, said: str) -> None:
    assert (stop.stopped_by, str(stop)) == (stopped_by, said)
    assert stop.interrupted == bool(stopped_by)
    assert stop.by_signal == stopped_by.startswith("interrupted")
    assert stop.exit_code == (143 if "SIGTERM" in said else 130)


def test_the_noise_is_measured_the_median_gap_floored_and_a_stall_is_the_widest() -> None:
    # No config ran twice: confirm_within (5%). Gaps of 2%, 12% and 80% (a stall): the
    # typical noise is their median, 12%; how slow one run can come out, 80%.
    ev = evidence(bf16_off_32=run(200, 32))
    assert ev.noise_level == pytest.approx(0.05) and ev.stall == pytest.approx(0.05)
    for i, gap in enumerate((0.02, 0.12, 0.80)):
        ev.note_drift(at(EAGER, 2 ** i), run(100, 2 ** i), run(100 / (1 + gap), 2 ** i))
    assert ev.noise_level == pytest.approx(0.12) and ev.stall == pytest.approx(0.80)
    assert ev.noise(at(EAGER, 32)) == pytest.approx(0.12)  # every bound reads it


def test_behind_refine_cuts_only_behind_refine_within_less_the_measured_noise() -> None:
    # A best at 0.80x the leader: cut at 5% noise (floor 0.855), refined at 15% (0.765).
    ev = evidence(bf16_default_32=run(400, 32), bf16_off_32=run(320, 32))
    assert not bounds.refines(ev, 0.80) and bounds.refines(ev, 0.86)
    why = bounds.behind(ev, "bf16/off", 0.80)
    assert why.rule == "behind-refine" and why.figures["floor"] == pytest.approx(0.855)
    ev.note_drift(at(EAGER, 8), run(100, 8), run(100 / 1.15, 8))
    assert ev.refine_floor() == pytest.approx(0.765) and bounds.refines(ev, 0.80)


def test_knob_reach_bounds_an_optimizer_by_the_update_it_could_save() -> None:
    # The eager setting runs 0.80x the compiled leader. With its update 40% of its step, an
    # optimizer implementation could gain up to 1.67x: screened. With 10%, 1.11x: 0.89x at
    # most, behind by more than the noise: not. Another knob is bounded by 1 / refine_within.
    def with_update(share: float) -> TrialResult:
        r = run(320, 32)
        return replace(r, update_times_s=tuple(share * t for t in r.step_times_s))

    for share, screened in ((0.4, True), (0.1, False)):
        ev = evidence(bf16_default_32=run(400, 32), bf16_off_32=with_update(share))
        why, note = reach_bounds.knob_reach(ev, at(EAGER, 32), {"optimizer_impl"})
        assert (why is None) == screened and (note is not None) == screened
        assert (note or why).figures["ceiling"] == pytest.approx(1 / (1 - share))
    ev = evidence(bf16_default_32=run(400, 32), bf16_off_32=with_update(0.4))
    why, _ = reach_bounds.knob_reach(ev, at(EAGER, 32), {"optimizer_impl", "compile_scope"})
    assert why is not None and why.figures["ceiling"] == pytest.approx(1 / 0.9)
    # A memory format's gain has no bound the runs show (eager convolutions gained 1.7x
    # with channels_last on CPU tables where compiled code gained 1.06x): screened.
    why, note = reach_bounds.knob_reach(ev, at(EAGER, 32), {"optimizer_impl", "memory_format"})
    assert why is None and note is not None and note.variant == "unbounded"
    assert "ceiling" not in note.figures and "has no bound" in note.text


def test_a_single_run_a_stall_could_explain_is_timed_again_before_its_cut() -> None:
    # The leader at 400; bf16/off ran once at 200 (0.50x: under the floor). Where this
    # machine's runs of one config landed at most 5% apart, the cut stands; where one came
    # out 1.9x slower (a stall, beyond the 5% typical gap), that run is timed again first.
    from autotune.search.policy import remeasure_first
    ev = evidence(bf16_default_32=run(400, 32), bf16_off_32=run(200, 32))
    for i in range(3):  # typical gaps: 0-2%
        ev.note_drift(at(COMPILED, 2 ** i), run(100, 2 ** i), run(100 / (1 + 0.01 * i), 2 ** i))
    assert remeasure_first(ev, at(EAGER, 32)) is None
    ev.note_drift(at(COMPILED, 8), run(100, 8), run(100 / 1.9, 8))
    note = remeasure_first(ev, at(EAGER, 32))
    assert note is not None and note.rule == "re-measure-first"
    assert note.figures["stall"] == pytest.approx(0.9)
    ev.runs[at(EAGER, 32)] = 2  # timed twice already: its better run stands
    assert remeasure_first(ev, at(EAGER, 32)) is None


def test_capped_class_probes_checkpointing_unless_the_whole_batch_stays_behind() -> None:
    # bf16 eager fits 8 (memory caps it below the per-device 64), the leader runs 400 at 32.
    # At 100 samples/s at 8, a step no faster at 64 than at 8 reaches 800: probe it. At 40,
    # 320 (0.80x): behind beyond the 5% noise, skipped with its figures.
    for sps, probed in ((100, True), (40, False)):
        ev = evidence(bf16_default_32=run(400, 32), bf16_off_8=run(sps, 8))
        why = bounds.capped_reach(ev, at(EAGER, 8), at(COMPILED, 32))
        assert (why is None) == probed
    assert why is not None and why.rule == "capped-class"
    assert why.figures["reach"] == pytest.approx(0.8) and why.figures["per_device"] == 64
    assert "reaches 0.80x" in why.text


def test_a_run_ahead_over_the_budget_is_proposed_with_each_checkpointing_that_frees_memory(
        ) -> None:
    # bf16/off ran every step at 32 at 1.1x the leader but peaked 950 MiB, over the 900 MiB
    # usable: the joint stage proposes it there with each checkpointing value (rule joint,
    # over-budget); at 0.5x the leader, not (checkpointing runs no faster).
    from autotune.search.stages.joint import relieved
    from tests.scripted import VALUES
    for sps, proposed in ((200, False), (440, True)):
        ev = Evidence(Plan.of(plan(), CLASSES, VALUES), SETTINGS)
        ev.took(at(COMPILED, 32), run(400, 32))
        ev.took(at(EAGER, 32), run(sps, 32, peak_mib=950))
        found = {c.key(): note for c, note in relieved(ev, at(COMPILED, 32))
                 if c.knobs.checkpointing != "off"}
        assert bool(found) == proposed
    assert set(found) == {"bf16/off+ckpt=blocks/32", "bf16/off+ckpt=alternate/32"}
    assert all(n.rule == "joint" and n.variant == "over-budget" for n in found.values())


def test_an_eager_class_needs_no_less_memory_only_where_it_peaks_no_lower_everywhere() -> None:
    """``reach_bounds.no_lower`` (rules ``compile-floor`` and ``oom-class-reach``'s
    ``peak-not-below``): every micro-batch both ran, the smallest cited. bf16 eager peaking
    above fp32's at 64 but below at 1 needs less where a compile's floor shows: not
    "no less" (the largest alone said so before 2026-11-30)."""
    from autotune.search.reach_bounds import no_lower

    assert no_lower({1: 50, 8: 70, 64: 120}, {1: 40, 8: 70, 64: 110}) == 1
    assert no_lower({1: 30, 64: 120}, {1: 40, 64: 110}) is None
    assert no_lower({1: 30}, {2: 40}) is None  # no micro-batch in common: nothing said
    assert no_lower({4: 40, 2: 41}, {4: 40}) == 4


@given(st.dictionaries(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 10**9)),
       st.dictionaries(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 10**9)))
def test_no_lower_cites_the_smallest_common_micro_batch_and_holds_at_every_one(
        mine: dict[int, int], theirs: dict[int, int]) -> None:
    m = reach_bounds.no_lower(mine, theirs)
    common = sorted(set(mine) & set(theirs))
    if m is None:
        assert not common or any(mine[x] < theirs[x] for x in common)
    else:
        assert m == common[0] and all(mine[x] >= theirs[x] for x in common)
        if reach_bounds.no_lower(theirs, mine) is not None:  # each no lower: equal
            assert all(mine[x] == theirs[x] for x in common)
