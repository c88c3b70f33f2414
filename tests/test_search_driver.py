"""The search as a whole (``autotune/search/driver.py`` and the executor): the limits
(``--max-trials``, ``--time-budget``), Ctrl-C, what a search stopped early never reached, a
resumed search taking the first one's path, and how long each run times.

A scripted device (``tests/scripted.py``) stands in for the runner.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

import optuna
import pytest

from autotune.config import Knobs, TrialResult, TrialSpec
from autotune.search import run_search, tuned_config
from autotune.timing import MIN_STEPS_TO_STOP
from tests.scripted import (
    CLASSES,
    SETTINGS,
    SLOW,
    VALUES,
    KnobDevice,
    ScriptedDevice,
    by_class,
    pick_winner_record,
    plan,
    search,
)


def test_max_trials_keeps_the_best_so_far() -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome, _ = search(device, replace(SETTINGS, max_trials=5))
    assert outcome.interrupted and len(device.specs) == outcome.num_runs == 5
    assert str(outcome.stop_reason) == "--max-trials reached (5 child runs): best so far"
    assert outcome.baseline is not None and outcome.baseline.key() == "fp32/off/32"


def test_max_trials_counts_the_re_measurements_too() -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 320, 330))
    runs_before_confirm = len(search(ScriptedDevice(device.speed))[0].records)
    outcome, _ = search(device, replace(SETTINGS, max_trials=runs_before_confirm + 1,
                                        fresh=True))
    # Every run before the close race, then one of its two re-measurements: the limit holds.
    assert len(device.specs) == outcome.num_runs == runs_before_confirm + 1
    assert outcome.interrupted and str(outcome.stop_reason).startswith("--max-trials reached")


def test_every_child_ends_within_the_time_budget() -> None:
    class Slow(ScriptedDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            time.sleep(0.3)
            return super().__call__(spec)

    device = Slow(by_class(100, 150, 160, 200, 300, 330))
    outcome, _ = search(device, replace(SETTINGS, time_budget_s=1.5, timeout_s=900.0))
    assert outcome.interrupted and str(outcome.stop_reason) == "--time-budget reached: best so far"
    # Each child's timeout is what was left of the budget when it started, never the 900 s.
    assert all(s.timeout_s <= 1.5 for s in device.specs)
    assert [s.timeout_s for s in device.specs] == sorted(
        (s.timeout_s for s in device.specs), reverse=True)


def test_a_run_cut_by_the_time_budget_stops_the_search_and_is_not_a_timeout_verdict(
        tmp_path) -> None:
    class Long(ScriptedDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            if spec.micro_batch == 1:  # a run longer than what is left: its child is killed
                self.specs.append(spec)
                return TrialResult(status="timeout", message="killed")
            return super().__call__(spec)

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    device = Long(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device, replace(SETTINGS, time_budget_s=60.0, storage=storage,
                                              study_name="s"))
    assert outcome.interrupted
    assert str(outcome.stop_reason).startswith("--time-budget reached during a run of fp32/off/1")
    assert all(r.verdict != "timeout" for r in records.values())
    # The run log says the budget cut it (autotune.html labels it so, not "(timeout)").
    assert [(r.label(), r.status) for r in outcome.runs if r.cut] == [("fp32/off 1", "timeout")]
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.trials[-1].state.name == "FAIL"  # not stored as the candidate's timeout


def test_a_timeout_within_the_budget_is_the_candidates_outcome() -> None:
    class Hangs(ScriptedDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            if spec.knobs.label() == "bf16/off":
                self.specs.append(spec)
                return TrialResult(status="timeout", message="no result after 900 s; killed")
            return super().__call__(spec)

    device = Hangs(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device, replace(SETTINGS, time_budget_s=3600.0, timeout_s=30.0))
    assert not outcome.interrupted
    assert records["bf16/off/32"].verdict == "timeout"
    assert any(r.status == "timeout" for r in outcome.runs) and not any(r.cut for r in outcome.runs)


def test_a_search_stopped_by_max_trials_lists_the_stages_and_knobs_it_never_reached() -> None:
    # 14 runs (the baseline twice: the machine's noise): the probes and checkpointing's
    # screening ran; the other knobs, the smaller micro-batches, the joint screen and the
    # re-measure never began. 13: the screening was entered, but its first run was the
    # 14th: checkpointing is not reached either. A search run to its end
    # lists nothing. memory_format, which this workload cannot use (no convolutions), never.
    def stopped(max_trials: int):
        device = KnobDevice(by_class(100, 150, 160, 200, 300, 330))
        return run_search(plan(), CLASSES, replace(SETTINGS, max_trials=max_trials),
                          values=VALUES, run=device), device
    outcome, _ = stopped(14)
    assert outcome.interrupted
    assert outcome.not_reached == (
        "knob screening (optimizer_impl)", "the smaller micro-batches",
        "the joint screen of the knobs", "the re-measure of the leaders")
    assert stopped(13)[0].not_reached[0] == "knob screening (checkpointing, optimizer_impl)"
    assert tuned_config(plan(), outcome, SETTINGS).not_reached == outcome.not_reached
    whole, device = stopped(60)
    assert not whole.interrupted and whole.not_reached == ()
    # Stopped as the close race's re-measure was to begin, or after its first run.
    race = by_class(100, 150, 160, 200, 320, 330)
    before = next(i for i, r in enumerate(search(ScriptedDevice(race))[0].runs)
                  if r.kind == "re-measure" and r.knobs.compiled)  # (the baseline's: noise)
    for extra, said in ((0, ("the re-measure of the leaders",)), (1, ())):
        outcome, _ = search(ScriptedDevice(race), replace(SETTINGS, max_trials=before + extra))
        assert outcome.interrupted and outcome.not_reached == said, extra
    # Whatever the limit, a setting or knob said not reached had no run.
    for max_trials in range(2, len(device.specs)):
        outcome, device = stopped(max_trials)
        # (stopped in the race after its first run: every stage began, nothing to list)
        assert outcome.interrupted and (outcome.not_reached or max_trials >= 19)
        said = dict(item.split(" (", 1) if item.startswith("knob") else
                    item.split(" of ", 1) if item.startswith("the memory probes") else
                    (item, "") for item in outcome.not_reached)
        unprobed = said.get("the memory probes", "").split(", ")
        unscreened = said.get("knob screening", "").rstrip(")").split(", ")
        for knobs in (s.knobs for s in device.specs):
            assert knobs.with_(checkpointing="off", optimizer_impl="default",
                               memory_format="contiguous").label() not in unprobed
            assert not set(knobs.changed()) & set(unscreened), (max_trials, knobs.label())


def test_ctrl_c_during_a_run_fails_its_trial_and_keeps_the_rest(tmp_path) -> None:
    class Interrupted(ScriptedDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            if len(self.specs) == 7:  # the 8th run: bf16/default/32 (bf16 led in eager)
                raise KeyboardInterrupt
            return super().__call__(spec)

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    device = Interrupted(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device, replace(SETTINGS, storage=storage, study_name="s"))
    assert outcome.interrupted and str(outcome.stop_reason) == "interrupted (Ctrl-C): best so far"
    assert "fp32/off/32" in records and "bf16/default/32" not in records
    # The study shows every run as it ended: none left running, the interrupted one failed.
    study = optuna.load_study(study_name="s", storage=storage)
    states = [(t.user_attrs["candidate"], t.state.name) for t in study.trials]
    assert states == [
        ("fp32/off/64", "COMPLETE"), ("fp32/off/1", "PRUNED"), ("fp32/off/8", "PRUNED"),
        ("fp32/off/32", "COMPLETE"), ("fp32/off/32", "COMPLETE"), ("bf16/off/32", "COMPLETE"),
        ("bf16/off/64", "COMPLETE"), ("bf16/default/32", "FAIL")]


def test_ctrl_c_right_after_the_baselines_trial_keeps_it() -> None:
    """The baseline's line is printed before its memory probe returns: a Ctrl-C in between
    still leaves a best so far (fp32 eager at its largest timed fit), not nothing."""
    def on_step(knobs: Knobs, step) -> None:
        if step.timed and step.fits:  # fp32/off/32, the run that ends the baseline's probe
            raise KeyboardInterrupt

    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome = run_search(plan(), CLASSES, SETTINGS, run=device, on_step=on_step)
    assert outcome.interrupted and device.runs()[-1] == "fp32/off/32"
    assert outcome.baseline is not None and outcome.baseline.key() == "fp32/off/32"
    assert [(r.micro_batch, r.verdict, r.is_baseline) for r in outcome.records] == [
        (64, "oom", False), (32, "ok", True)]


def test_a_resumed_search_reuses_every_run_re_measurements_included(tmp_path) -> None:
    settings = replace(SETTINGS, storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    first_device = ScriptedDevice(by_class(100, 150, 160, 200, 320, 330))
    first, _ = search(first_device, settings)
    again_device = ScriptedDevice(by_class(100, 150, 160, 200, 320, 330))
    again, _ = search(again_device, settings)
    assert again_device.specs == [] and again.num_runs == 0
    # The better of each re-measured pair, and its count; the resumed search timed nothing.
    assert [replace(r, timed_s=None) for r in again.records] == [
        replace(r, timed_s=None) for r in first.records]
    assert all(r.timed_s is None for r in again.records)
    assert sum(r.timed_s or 0.0 for r in first.records) > 0
    assert again.probes == first.probes


def test_a_resumed_knob_search_takes_the_first_ones_path(tmp_path) -> None:
    # Memory binds (32 fits, 64 does not) and the knobs are screened: the fused optimizer
    # wins. The study it resumes holds that winner from the start, but each stored run answers
    # only when asked, as the first search asked: checkpointing is screened on the leader the
    # first search had then (not on the fused winner: that would be two new runs at 64), and
    # the resumed search runs nothing, its records and probes the first one's.
    settings = replace(SETTINGS, storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")

    def device() -> KnobDevice:
        return KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                          ckpt_memory={"off": 1.0, "alternate": 0.9, "blocks": 0.8})

    first = run_search(plan(), CLASSES, settings, values=VALUES, run=device())
    assert any(r.knobs.optimizer_impl == "fused" for r in first.records)
    again_device = device()
    again = run_search(plan(), CLASSES, settings, values=VALUES, run=again_device)
    assert again_device.runs() == [] and again.num_runs == 0
    assert [replace(r, timed_s=None) for r in again.records] == [
        replace(r, timed_s=None) for r in first.records]
    assert again.probes == first.probes and again.skipped == first.skipped


def test_a_resumed_search_interrupted_before_it_asked_for_every_stored_run_picks_from_all(
        tmp_path) -> None:
    # The second search on the study takes another path (--refine-within 0 walks every
    # micro-batch) and is interrupted at its first new run, before it has asked for every
    # stored run: the best so far is still picked from all the study holds.
    settings = replace(SETTINGS, storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    speeds = by_class(100, 150, 160, 200, 300, 330)
    memory = {"off": 1.0, "alternate": 0.9, "blocks": 0.8}
    first = run_search(plan(), CLASSES, settings, values=VALUES,
                       run=KnobDevice(speeds, ckpt_memory=memory))

    class Interrupted(KnobDevice):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            raise KeyboardInterrupt

    again = run_search(plan(), CLASSES, replace(settings, refine_within=0.0), values=VALUES,
                       run=Interrupted(speeds, ckpt_memory=memory))
    assert again.interrupted and again.num_runs == 0
    assert str(again.stop_reason) == "interrupted (Ctrl-C): best so far"
    keys = sorted(f"{r.knobs.label()}/{r.micro_batch}" for r in again.records)
    assert keys == sorted(f"{r.knobs.label()}/{r.micro_batch}" for r in first.records)
    assert tuned_config(plan(), again, settings).knobs == tuned_config(
        plan(), first, settings).knobs


def _spiky(run: Callable[[TrialSpec], TrialResult], seed: int) -> Callable[
        [TrialSpec], TrialResult]:
    """``run``, but about one timed run in three has its steps 1.2-4x slower (a busy moment of a
    shared machine), drawn from ``seed``."""
    rng = random.Random(seed)

    def spiky(spec: TrialSpec) -> TrialResult:
        result = run(spec)
        if spec.num_timed_steps and rng.random() < 0.3:
            factor = rng.uniform(1.2, 4.0)
            result = replace(result, step_times_s=tuple(factor * t for t in result.step_times_s))
        return result

    return spiky


@pytest.mark.parametrize("seed", [0, pytest.param(5, marks=pytest.mark.slow),
                                  pytest.param(12, marks=pytest.mark.slow), 14])
def test_a_resumed_search_answers_each_ask_with_the_stored_runs_in_the_order_they_were_made(
        tmp_path, seed: int) -> None:
    # A first search on a busy machine (some runs slowed by a spike, drawn from the seed), then
    # a resumed one on the same study. Each ask is answered with the study's next run of the
    # candidate (its first run at its first timing, the next at each re-measure), so every
    # decision sees what the first search had seen then: the resumed search runs nothing and
    # picks as the first did, its records the same (re-measures and rounds included).
    settings = replace(SETTINGS, storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    speeds = by_class(100, 150, 160, 200, 300, 310)
    memory = {"off": 1.0, "alternate": 0.9, "blocks": 0.8}
    first = run_search(plan(), CLASSES, settings, values=VALUES,
                       run=_spiky(KnobDevice(speeds, ckpt_memory=memory), seed))
    # Each first search re-measured (two of them ran interleaved rounds): the resumed one must
    # answer those re-measures from the study too.
    assert any(r.num_runs > 1 for r in first.records)
    again_device = KnobDevice(speeds, ckpt_memory=memory)
    again = run_search(plan(), CLASSES, settings, values=VALUES, run=again_device)
    assert again_device.runs() == [] and again.num_runs == 0
    assert [replace(r, timed_s=None) for r in again.records] == [
        replace(r, timed_s=None) for r in first.records]
    picks = [tuned_config(plan(), o, settings) for o in (first, again)]
    assert picks[0].knobs == picks[1].knobs and picks[0].micro_batch == picks[1].micro_batch


def test_a_quiet_device_ranks_each_candidate_in_a_few_steps_and_times_the_close_race_in_full(
        ) -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 306))
    outcome, records = search(device, SLOW)
    first_runs = {}
    for spec in device.specs:
        if spec.num_timed_steps:
            first_runs.setdefault(f"{spec.precision}/{spec.compile_mode}/{spec.micro_batch}", spec)
    # Every first timing asked for the rank precision; a steady step is known after 3 steps.
    assert {s.timing_precision for s in first_runs.values()} == {SLOW.rank_precision}
    ranked = [r for r in records.values() if r.num_runs == 1 and r.verdict == "ok"]
    assert ranked and all(r.num_timed_steps == MIN_STEPS_TO_STOP for r in ranked)
    # The two within 2% are re-measured with every step (no precision stop), and stay "ok".
    confirm = [s for s in device.specs if s.num_timed_steps and s.timing_precision is None]
    assert sorted(f"{s.precision}/{s.compile_mode}/{s.micro_batch}" for s in confirm) == [
        "bf16/default/32", "bf16/max-autotune/32", "fp32/off/32"]  # (the baseline: the noise)
    assert all(s.stop_above_step_s is None for s in confirm)
    assert records["bf16/max-autotune/32"].num_runs == 2
    assert records["bf16/max-autotune/32"].verdict == "ok"
    # The cost says where the time went: timed steps are the runs' own step times.
    assert outcome.cost is not None and outcome.cost.num_runs == len(device.specs)
    assert outcome.cost.timed_s == pytest.approx(sum(r.timed_s or 0 for r in outcome.records))


def test_a_noisy_device_times_longer_before_it_ranks() -> None:
    quiet = ScriptedDevice(by_class(100, 150, 160, 200, 300, 200))
    search(quiet, SLOW)
    noisy = ScriptedDevice(by_class(100, 150, 160, 200, 300, 200),
                           jitter=(0.0, 0.3, -0.2, 0.25, -0.15))
    search(noisy, replace(SLOW, fresh=True))

    assert sum(noisy.timed_steps) > sum(quiet.timed_steps)
    assert max(noisy.timed_steps) == SLOW.num_timed_steps


def test_a_fast_run_over_the_usable_budget_stops_no_contender_behind_it() -> None:
    """bf16/default at 32 runs 600 samples/s but peaks over the usable 900 MiB (under the
    1000 MiB cap: it ran): it cannot be picked, so it must not set the bar that stops later
    runs "behind". bf16/max-autotune (390, fits) is timed after it and wins; measured against
    the over-budget run it was stopped as slower and bf16/off (380) was picked
    (benchmarks/replay.py, slow_cnn-xeon seed 3: pick quality 0.55)."""
    device = ScriptedDevice(
        by_class(100, 150, 160, 380, 600, 390),
        shapes={"bf16/default": lambda m: 1.0 if m == 32 else 0.3},
        peaks={"bf16/default": lambda m: 950 if m == 32 else 100 + 20 * m})
    outcome, records = search(device)
    assert records["bf16/default/32"].verdict == "over_budget"
    assert records["bf16/max-autotune/32"].verdict == "ok"  # not "slower": timed in full
    winner = pick_winner_record(outcome)
    assert winner is not None and (winner.knobs.label(), winner.micro_batch) == (
        "bf16/max-autotune", 32)


def test_each_runs_progress_says_the_runs_in_all_and_the_time_left_as_an_estimate() -> None:
    """issue 62: the progress counts ``run 9/~23, ~1 min 40 s left``: a total from the plan
    as it stands (never below the runs made, never above --max-trials) and the time left
    once a run has ended; the search decides as it does without anyone listening."""
    counts: list[tuple[int, int, float | None, bool]] = []
    clock = iter(range(0, 10_000, 3))

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        counts.append((count.done, count.total, count.left_s, record is None))

    settings = replace(SETTINGS, max_trials=40)
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    heard = run_search(plan(), CLASSES, settings, run=device, on_trial=on_trial,
                       clock=lambda: float(next(clock)))
    alone = run_search(plan(), CLASSES, settings, run=ScriptedDevice(device.speed))
    assert [(r.label(), r.verdict) for r in heard.records] == [
        (r.label(), r.verdict) for r in alone.records]
    made = counts[-1][0]
    assert all(done + starting <= total <= settings.max_trials
               for done, total, _, starting in counts)
    first = counts[0]
    assert first[:3] == (0, first[1], None) and first[1] > len(CLASSES)  # the plan's runs
    assert made / 2 <= first[1] <= made * 2, (first, made)  # an estimate, not a guess
    assert all(left is not None and left >= 0 for done, _, left, _ in counts if done)
    assert counts[-1][2] is not None and counts[-1][2] <= counts[1][2]  # less left at the end
