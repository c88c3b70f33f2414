"""The refine stage (``autotune/search/stages/refine.py``): smaller micro-batches of the
settings near the leader while each is faster by more than the noise, the smallest that fits
where it could still win, and compiled settings walked down only on evidence.

A scripted device (``tests/scripted.py``) stands in for the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autotune.config import TrialResult, TrialSpec
from autotune.search.pick import pick_winner
from autotune.units import MIB
from tests.scripted import (
    CLASSES,
    SETTINGS,
    SLOW,
    KnobDevice,
    ScriptedDevice,
    by_class,
    knob_search,
    search,
)


def test_smaller_micro_batches_only_while_they_get_faster() -> None:
    # The leader's class peaks at micro-batch 16: 32 -> 16 (faster by more than the 5% noise
    # margin) -> 8 (slower): stop.
    peak_at_16 = {1: 0.5, 2: 0.6, 4: 0.7, 8: 0.95, 16: 1.15, 32: 1.0, 64: 1.0}
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=peak_at_16.get,
                            retries_at=32)  # memory pressure: a compiled class is walked down
    outcome, records = search(device)
    leader = [k for k in device.runs() if k.startswith("bf16/max-autotune/")]
    assert leader[:4] == ["bf16/max-autotune/32", "bf16/max-autotune/64",
                          "bf16/max-autotune/16", "bf16/max-autotune/8"]
    assert ("bf16/max-autotune: micro-batches 4, 2, 1 not timed: 8 was not faster than 16 by "
            "more than the noise (5%)") in outcome.skipped
    best = max(records.values(), key=lambda r: r.samples_per_s or 0)
    assert (best.precision, best.compile_mode, best.micro_batch) == ("bf16", "max-autotune", 16)
    # A class far behind the leader is not refined, and the report says by how much.
    assert not any(k.startswith("fp32/off/16") for k in device.runs())
    assert any(s.startswith("fp32/off: micro-batches 16, 8, 4, 2, 1 not timed: its best is "
                            "0.30x the leader's") for s in outcome.skipped)


def test_a_gain_within_the_noise_is_followed_one_step_not_further() -> None:
    # 16 is 4% faster than 32: within the 5% margin, a tie, so the compiled walk goes one
    # past it (issue 59: it stopped there, never timing the one between); 8 runs 0.9x, not
    # faster than 16: 4 and below are not tried.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330),
                            shape=lambda m: {16: 1.04, 32: 1.0, 64: 1.0}.get(m, 0.9),
                            retries_at=32)  # memory pressure: a compiled class is walked down
    outcome, _ = search(device)
    assert "bf16/max-autotune/8" in device.runs()
    assert not any(k.startswith("bf16/max-autotune/4") for k in device.runs())
    assert ("bf16/max-autotune: micro-batches 4, 2, 1 not timed: 8 was not faster than 16 "
            "by more than the noise (5%)") in outcome.skipped
    # The range's other end is not timed either: the line through this compiled setting's
    # micro-batches predicts micro-batch 1 behind, and it would cost a compile.
    assert "bf16/max-autotune/1" not in device.runs()
    assert any(s.startswith("bf16/max-autotune: micro-batch 1 not timed: predicted")
               and "line through micro-batches 8, 16, 32" in s for s in outcome.skipped)


def test_a_compiled_class_at_the_whole_batch_is_not_refined_without_memory_pressure() -> None:
    # Everything fits at 64 (no accumulation): smaller compiled micro-batches would only add
    # accumulation steps, each at the cost of a compile. Eager ones cost no compile.
    small = {"peak_mib": lambda m: 100 + 5 * m}
    speeds = by_class(300, 150, 160, 310, 300, 330)
    device = ScriptedDevice(speeds, **small)
    outcome, _ = search(device)
    assert not any(k.startswith("bf16/max-autotune/32") for k in device.runs())
    assert ("bf16/max-autotune: micro-batches 32, 16, 8, 4, 2, 1 not timed: 64 (the whole "
            "per-device batch) ran without allocator retries, so a smaller one only adds "
            "accumulation steps, each at the cost of a compile (--micro-batches all times "
            "them)") in outcome.skipped
    assert "bf16/off/32" in device.runs()  # eager and near the leader: refined
    # Allocator retries at 64 are memory pressure: then a smaller one may well be faster.
    pressed = ScriptedDevice(speeds, retries_at=64, **small)
    search(pressed, replace(SETTINGS, fresh=True))  # another device: not the stored runs
    assert "bf16/max-autotune/32" in pressed.runs()


def test_settings_that_prune_nothing_time_every_fitting_candidate() -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    settings = replace(SETTINGS, refine_within=0.0, micro_batches_per_class=0, num_confirm=0)
    outcome, records = search(device, settings)
    fitting = ["1", "2", "4", "8", "16", "32"]
    assert {f"{c.label()}/{m}" for c in CLASSES for m in fitting} <= set(records)
    assert all(records[f"{c.label()}/64"].verdict == "oom" for c in CLASSES)
    assert outcome.skipped == ()


def test_a_setting_near_the_leader_times_its_smallest_micro_batch_only_if_it_could_win(
        ) -> None:
    # The leader's setting (bf16/max-autotune) is fastest at 16, so bf16/default (within 0.9 of
    # it) walks 32 -> 16 too, where its own per-micro-batch overhead makes it slower; the line
    # through them predicts 1 slower still: not timed, said.
    peak_at_16 = {1: 0.5, 2: 0.6, 4: 0.7, 8: 0.95, 16: 1.08, 32: 1.0, 64: 1.0}
    device = ScriptedDevice(by_class(100, 150, 160, 200, 315, 320),
                            shape=lambda m: m / (m + 2) / (32 / 34),
                            shapes={"bf16/max-autotune": peak_at_16.get},
                            retries_at=32)  # memory pressure: compiled settings are walked
    outcome, records = search(device, replace(SLOW, micro_batches_per_class=4))
    assert "bf16/default/16" in records and "bf16/default/1" not in records
    reason = next(s for s in outcome.skipped if s.startswith("bf16/default: micro-batch 1 not"))
    assert "predicted" in reason and "line through micro-batches 16, 32" in reason
    # The leader's own setting (compiled) is not timed at its smallest either: its line (16
    # cheaper per sample than 32) predicts 1 ahead, but not by more than that prediction's
    # own interval (it runs 0.5x there).
    assert "bf16/max-autotune/1" not in records
    reason = next(s for s in outcome.skipped
                  if s.startswith("bf16/max-autotune: micro-batch 1 not timed: predicted"))
    assert "not ahead by more than the prediction's own interval" in reason, reason


def _slower_below_32(m: int) -> float:
    """3% slower at 16 than at 32, slower still below."""
    return {64: 1.0, 32: 1.0, 16: 0.97}.get(m, 0.9 * m / (m + 4))


def test_a_compiled_leader_s_smallest_micro_batch_is_predicted_before_its_compile() -> None:
    # 16 ties with 32 (3% slower, within the noise): the walk goes one past it, to 8, and
    # stops. The compiled leader's setting would pay a compile for micro-batch 1: the line
    # through 8, 16 and 32 predicts it far behind, so it is not timed, and the report says so.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=_slower_below_32,
                            retries_at=32)  # memory pressure: the compiled leader is walked
    outcome, records = search(device)
    assert "bf16/max-autotune/16" in records and "bf16/max-autotune/1" not in records
    reason = next(s for s in outcome.skipped
                  if s.startswith("bf16/max-autotune: micro-batch 1 not timed: predicted"))
    assert "line through micro-batches 8, 16, 32" in reason


def _even_from_8(m: int) -> float:
    """As fast per sample at 16 and 8 as at 32 (ties), half as fast below 8."""
    return {64: 1.0, 32: 1.0, 16: 1.0, 8: 1.0}.get(m, 0.5)


def test_a_compiled_setting_s_smallest_micro_batch_is_not_compiled_for_a_predicted_tie(
        ) -> None:
    # The compiled leader's walk goes one past 16 (a tie with 32) and stops at 8, a tie
    # again (two in a row). The line through them
    # predicts micro-batch 1 even with 32, within the noise: not ahead of it, so not worth
    # the compile micro-batch 1 would cost. It is not timed, and the report says why.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=_even_from_8,
                            retries_at=32)  # memory pressure: the compiled leader is walked
    outcome, records = search(device)
    assert "bf16/max-autotune/8" in records and "bf16/max-autotune/1" not in records
    reason = next(s for s in outcome.skipped
                  if s.startswith("bf16/max-autotune: micro-batch 1 not timed: predicted"))
    assert reason.endswith("not ahead by more than the noise (5%), and a compiled micro-batch "
                           "costs a compile of its own"), reason
    assert reason.startswith("bf16/max-autotune: micro-batch 1 not timed: predicted 330.0 "
                             "samples/s from the line through micro-batches 8, 16, 32 ")
    assert "1.00x micro-batch 8's" in reason


def test_an_eager_leader_s_smallest_micro_batch_is_timed_though_predicted_behind() -> None:
    # The same walk on an eager leader times 1 anyway (a small micro-batch can stay in cache).
    device = ScriptedDevice(by_class(100, 150, 160, 400, 300, 330), shape=_slower_below_32)
    outcome, records = search(device)
    assert "bf16/off/16" in records and "bf16/off/1" in records
    assert not any(s.startswith("bf16/off: micro-batch 1 not timed") for s in outcome.skipped)


def test_a_setting_near_the_leader_is_not_walked_down_where_its_sibling_got_slower() -> None:
    # Every class is 10% slower per halving. The leader's setting (bf16 eager) walks 32 -> 16
    # (slower: its walk stops). bf16/max-autotune is within 0.9 of it: its 16 would cost a
    # compile, and the sibling's measured ratio (0.90x) predicts it slower: not timed, said.
    device = ScriptedDevice(by_class(100, 150, 160, 350, 300, 330))
    outcome, records = search(device, replace(SLOW, micro_batches_per_class=3))
    assert "bf16/off/16" in records
    assert "bf16/max-autotune/32" in records and "bf16/max-autotune/16" not in records
    assert ("bf16/max-autotune: micro-batches 16, 8, 4, 2, 1 not timed: predicted 297.0 "
            "samples/s at 16 from bf16/off's own ratio of micro-batch 16 to 32 (0.90x, both "
            "timed): not faster than 32 by more than the noise (5%)") in outcome.skipped
    best = max(records.values(), key=lambda r: r.samples_per_s or 0)
    assert (best.precision, best.compile_mode, best.micro_batch) == ("bf16", "off", 32)

    # Where the sibling got faster at 16, the compiled setting is walked down too (its own
    # figures decide; its own walk getting faster is evidence too): the prediction only ever
    # saves a run that could not win.
    peak_at_16 = {1: 0.5, 2: 0.6, 4: 0.7, 8: 0.95, 16: 1.08, 32: 1.0, 64: 1.0}
    device = ScriptedDevice(by_class(100, 150, 160, 350, 300, 345), shape=peak_at_16.get)
    outcome, records = search(device, replace(SLOW, micro_batches_per_class=3, fresh=True))
    assert "bf16/off/8" in records  # the leader's walk: faster at 16, slower at 8
    assert "bf16/max-autotune/16" in records and "bf16/max-autotune/8" in records
    assert ("bf16/max-autotune: micro-batches 4, 2, 1 not timed: 8 was not faster than 16 by "
            "more than the noise (5%)") in outcome.skipped


def test_a_compiled_setting_bound_by_memory_is_walked_down_only_on_evidence() -> None:
    # bf16/max-autotune leads at 32 (64 does not fit) and, as every setting here, runs 10%
    # slower at 16. Stepping it down costs a compile; nothing measured says a smaller
    # micro-batch could gain: not timed, and the report says why.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device)
    assert not any(r.startswith("bf16/max-autotune/16") for r in device.runs())
    assert ("bf16/max-autotune: micro-batches 16, 8, 4, 2, 1 not timed: a smaller micro-batch "
            "only adds accumulation steps (time per micro-batch linear in its size, plus one "
            "update per step) and costs a compile of its own: 32 ran without allocator "
            "retries, and no setting timed at both 16 and 32 ran faster at 16 (--micro-batches "
            "all times them)") in outcome.skipped
    # Where it is 15% faster at 16, the search cannot know without evidence, and misses it.
    peak_at_16 = {1: 0.5, 2: 0.6, 4: 0.7, 8: 0.95, 16: 1.15, 32: 1.0, 64: 1.0}
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=peak_at_16.get)
    outcome, records = search(device)
    assert "bf16/max-autotune/16" not in records
    # Allocator retries at 32 are that evidence: the walk finds 16.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=peak_at_16.get,
                            retries_at=32)
    outcome, records = search(device)
    best = max(records.values(), key=lambda r: r.samples_per_s or 0)
    assert (best.compile_mode, best.micro_batch) == ("max-autotune", 16)
    # So is an eager sibling near the leader timed faster at 16 (no retries anywhere).
    device = ScriptedDevice(by_class(100, 150, 160, 300, 300, 330), shape=peak_at_16.get)
    outcome, records = search(device)
    assert "bf16/off/16" in records
    best = max(records.values(), key=lambda r: r.samples_per_s or 0)
    assert (best.compile_mode, best.micro_batch) == ("max-autotune", 16)
    # --micro-batches all walks every setting regardless.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), shape=peak_at_16.get)
    outcome, records = search(device, replace(SETTINGS, micro_batches_per_class=0))
    assert "bf16/max-autotune/16" in records


def test_the_smallest_micro_batch_is_timed_and_the_knobs_screened_again_where_it_leads() -> None:
    # On a CPU a small micro-batch can stay in cache: here 1 runs 30% faster per sample than
    # 32, while 16 and 2 are slower (a noisy middle). The walk down of the eager leader stops
    # at 16; the range's other end (1) is timed anyway and leads; the optimizer
    # implementations, screened at 32 before, are screened again at 1, where fused wins.
    device = KnobDevice(by_class(100, 150, 160, 400, 300, 330),
                        shape=lambda m: {32: 1.0, 16: 0.9, 1: 1.3}.get(m, 0.8))
    _, records = knob_search(device)
    assert records["bf16/off/1"].verdict == "ok"
    assert "bf16/off+opt=fused/1" in records  # screened again at the new leader
    assert "bf16/off+opt=foreach/1" in records
    speed = {k: r.samples_per_s or 0 for k, r in records.items()}
    assert max(speed, key=speed.get) == "bf16/off+opt=fused/1"


@dataclass
class PeakRisesDevice(ScriptedDevice):
    """A scripted device whose ``label/micro_batch`` in ``risen`` peaks at the given MiB from
    its second timed run on (the allocator's noise between runs)."""

    risen: dict[str, float] = field(default_factory=dict)
    timed: dict[str, int] = field(default_factory=dict)

    def __call__(self, spec: TrialSpec) -> TrialResult:
        result = super().__call__(spec)
        key = f"{spec.knobs.label()}/{spec.micro_batch}"
        if spec.num_timed_steps and result.ok:
            self.timed[key] = self.timed.get(key, 0) + 1
            if self.timed[key] >= 2 and key in self.risen:
                return replace(result, peak_bytes=int(self.risen[key] * MIB))
        return result


def test_a_baseline_that_peaks_over_the_budget_when_timed_again_is_walked_down() -> None:
    # Every class but fp32 eager runs out of memory everywhere; fp32 eager fits 32 in its
    # probe (880 of 900 MiB usable), but its early re-measure peaks at 920 MiB: over the
    # usable budget, inside the cap. No run that fits has timed its steps, so there is no
    # leader to be behind: the walk down times 16 (which fits), and the search picks it
    # (it ended with no winner: behind-refine said "its best did not run").
    oom = {c.label(): (lambda m: 5000.0) for c in CLASSES if c.label() != "fp32/off"}
    device = PeakRisesDevice(by_class(100, 150, 160, 200, 300, 330),
                             peak_mib=lambda m: 100 + 24.375 * m, peaks=oom,
                             risen={"fp32/off/32": 920.0})
    outcome, records = search(device)
    assert records["fp32/off/32"].verdict == "over_budget"
    assert records["fp32/off/16"].verdict == "ok"
    winner = pick_winner(outcome.records, SETTINGS)
    assert winner is not None and (winner.knobs.label(), winner.micro_batch) == ("fp32/off", 16)
    assert not any(s.startswith("fp32/off: micro-batches 16") for s in outcome.skipped)


def test_a_sibling_of_another_precision_does_not_predict_an_eager_setting_s_walk() -> None:
    # fp32 eager leads at 32 and runs 0.9x there at 16; bf16 eager runs 0.9x the leader at 32
    # and 1.3x at 16 (half the bytes per element: the micro-batch whose working set fits a
    # cache moves with the precision). fp32's ratio of 16 to 32 predicted bf16 no faster at
    # 16, and bf16/off/16, the best, was never timed (the precision-swap tables of the
    # replay: 0.70 of the best).
    device = ScriptedDevice(by_class(200, 100, 100, 180, 100, 100),
                            shapes={"bf16/off": lambda m: {32: 1.0, 16: 1.3}.get(m, 0.8)})
    outcome, records = search(device)
    assert records["fp32/off/16"].verdict != "oom"  # the sibling walked 16 first
    assert "bf16/off/16" in records
    winner = pick_winner(outcome.records, SETTINGS)
    assert (winner.knobs.label(), winner.micro_batch) == ("bf16/off", 16)
    # (No bf16 sibling was timed at both 16 and 32, so nothing predicted bf16 eager's walk.)
    assert not any(s.rule == "sibling-ratio" and s.target == "bf16/off" for s in outcome.skips)
