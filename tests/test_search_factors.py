"""The product of factors (``autotune.search.factors``) and the re-measure it asks for: a single
run far below what the other runs at its micro-batch predict of it is timed again before a cut
(a run that stalled is only slower, and nothing in it says so: issue 59's stall family).

No child runs: ``Evidence`` is filled with results as a search would have them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.config import Knobs
from autotune.search import factors
from autotune.search.policy import SURPRISE_NOISES, remeasure_first, surprises
from tests.test_search_rules import COMPILED, EAGER, at, evidence, run

FP32_EAGER = Knobs()
FP32_COMPILED = Knobs(compile_mode="default")


def test_a_parallelogram_of_runs_predicts_the_fourth() -> None:
    # fp32 eager 300, bf16 eager 330 (1.1x), fp32 compiled 400 (1.33x): bf16 compiled is
    # predicted at 330 x 400 / 300 = 440, from those three.
    ev = evidence(fp32_off_32=run(300, 32), bf16_off_32=run(330, 32),
                  fp32_default_32=run(400, 32), bf16_default_32=run(200, 32))
    value, source = factors.predicted(ev, at(COMPILED, 32))  # type: ignore[misc]
    assert value == pytest.approx(440)
    assert set(source) == {at(EAGER, 32), at(FP32_COMPILED, 32), at(FP32_EAGER, 32)}


def test_no_prediction_without_three_runs_at_the_micro_batch() -> None:
    # The fourth corner ran at 16, not 32: no parallelogram at 32.
    ev = evidence(fp32_off_16=run(300, 16), bf16_off_32=run(330, 32),
                  fp32_default_32=run(400, 32), bf16_default_32=run(200, 32))
    assert factors.predicted(ev, at(COMPILED, 32)) is None
    assert factors.predicted(evidence(bf16_default_32=run(200, 32)), at(COMPILED, 32)) is None


def test_a_run_stopped_early_is_a_near_corner_never_the_far_one() -> None:
    # Stopped early behind the leader (the run most likely to have stalled): as A or B it
    # can only put the prediction down; as C (the divisor) it would put it up.
    early = replace(run(330, 32, steps=3), timing_stop="behind")
    ev = evidence(fp32_off_32=run(300, 32), bf16_off_32=early,
                  fp32_default_32=run(400, 32), bf16_default_32=run(200, 32))
    found = factors.predicted(ev, at(COMPILED, 32))
    assert found is not None and found[0] == pytest.approx(440)
    ev = evidence(fp32_off_32=replace(run(300, 32, steps=3), timing_stop="behind"),
                  bf16_off_32=run(330, 32), fp32_default_32=run(400, 32),
                  bf16_default_32=run(200, 32))
    assert factors.predicted(ev, at(COMPILED, 32)) is None


@given(st.lists(st.floats(0.3, 3.0), min_size=4, max_size=4),
       st.sampled_from(["bf16_default_32", "bf16_off_32", "fp32_default_32", "fp32_off_32"]))
def test_a_table_without_interactions_is_predicted_exactly(factor: list[float],
                                                           left_out: str) -> None:
    # Each corner's speed a product of a precision's and a mode's factor: any corner is
    # predicted from the other three as it runs.
    base, bf16, compiled, _ = factor
    speeds = {"fp32_off_32": base, "bf16_off_32": base * bf16,
              "fp32_default_32": base * compiled, "bf16_default_32": base * bf16 * compiled}
    ev = evidence(**{k: run(100 * v, 32) for k, v in speeds.items()})
    precision, mode, _ = left_out.split("_")
    key = at(Knobs(precision=precision, compile_mode=mode), 32)
    found = factors.predicted(ev, key)
    assert found is not None and found[0] == pytest.approx(100 * speeds[left_out], rel=1e-6)


def _stalled(behind: float):
    """The leader fp32 compiled at 400; bf16 compiled, predicted at 440, ran once at
    ``behind`` x that, stopped early behind the leader."""
    one = replace(run(440 * behind, 32, steps=3), timing_stop="behind")
    ev = evidence(fp32_off_32=run(300, 32), bf16_off_32=run(330, 32),
                  fp32_default_32=run(400, 32), bf16_default_32=one)
    ev.runs[at(FP32_EAGER, 32)] = 2  # the baseline, timed twice (the noise's re-measure)
    return ev


def test_a_run_stopped_far_below_its_prediction_is_timed_again_before_the_race() -> None:
    ev = _stalled(1 / 1.8)  # 244/s: 0.61x the leader, 1.8x under what it should run
    assert surprises(ev) == [at(COMPILED, 32)]  # (the baseline, timed twice, is trusted)
    note = ev.skips[-1]
    assert note.rule == "re-measure-first" and note.target == at(COMPILED, 32).key()
    # Within SURPRISE_NOISES of the machine's noise (5%: its floor) of the prediction: no.
    assert surprises(_stalled(1 - 0.9 * SURPRISE_NOISES * 0.05)) == []


def test_a_run_timed_twice_or_predicted_far_behind_the_leader_is_not_timed_again() -> None:
    ev = _stalled(1 / 1.8)
    ev.runs[at(COMPILED, 32)] = 2
    assert surprises(ev) == []
    # bf16 gains nothing eager: predicted at 400 x 150 / 300 = 200, half the leader's 400,
    # under the refinement floor: a re-measure could not make it the leader.
    one = replace(run(100, 32, steps=3), timing_stop="behind")
    ev = evidence(fp32_off_32=run(300, 32), bf16_off_32=run(150, 32),
                  fp32_default_32=run(400, 32), bf16_default_32=one)
    ev.runs[at(FP32_EAGER, 32)] = 2
    assert surprises(ev) == []


def test_a_walk_s_cut_of_a_single_run_far_below_its_prediction_is_timed_again_first() -> None:
    # No stall seen here (no config ran twice), so only the prediction says the run is one.
    ev = _stalled(1 / 1.8)
    note = remeasure_first(ev, at(COMPILED, 32))
    assert note is not None and note.rule == "re-measure-first"
    assert note.variant == "predicted"
    assert note.figures["under"] == pytest.approx(1 - 1 / 1.8)
    assert note.figures["predicted"] == pytest.approx(440)
    assert remeasure_first(_stalled(0.97), at(COMPILED, 32)) is None


def test_no_prediction_re_measures_where_the_objective_counts_compile_time() -> None:
    # --train-steps: the score is the time to train, compile included, which no knob
    # multiplies as it does the steps' speed.
    ev = _stalled(1 / 1.8)
    ev.settings = replace(ev.settings, train_steps=1000)
    assert surprises(ev) == [] and remeasure_first(ev, at(COMPILED, 32)) is None
