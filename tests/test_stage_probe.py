"""The probe stage (``autotune/search/stages/probe.py``): fp32 eager first, each class's
largest fitting micro-batch found and timed, probes stopped where a bound says the rest cannot
win, and the compile modes beyond default only for a precision near the leader.

A scripted device (``tests/scripted.py``) stands in for the runner; the real runner is
exercised end to end in test_search.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config import TrialResult, TrialSpec
from autotune.search import run_search
from autotune.search.slots import Slot, ThreadSlots
from autotune.timing import MIN_STEPS_TO_STOP
from autotune.units import MIB
from tests.scripted import (
    CLASSES,
    CONV,
    SETTINGS,
    VALUES,
    KnobDevice,
    OrderedSlots,
    ScriptedDevice,
    by_class,
    knob_search,
    pick_winner_record,
    plan,
    search,
)


def test_baseline_first_then_each_class_from_the_boundary_found() -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device)
    # fp32 eager first, from the target down: 64 does not fit; 1 and 8 only measure memory
    # (bisection points), and the line through them predicts 32, timed in the run that
    # finds it fits. Every other class starts there, and 64 confirms the boundary. The
    # compiled classes go by their precision's eager speed: bf16 (200) before fp32 (100).
    # The baseline is timed again at once: this machine's run-to-run noise.
    assert device.runs()[:13] == [
        "fp32/off/64", "fp32/off/1 (probe)", "fp32/off/8 (probe)", "fp32/off/32",
        "fp32/off/32", "bf16/off/32", "bf16/off/64", "bf16/default/32", "bf16/default/64",
        "fp32/default/32", "fp32/default/64", "bf16/max-autotune/32", "bf16/max-autotune/64"]
    assert outcome.baseline is not None and outcome.baseline.key() == "fp32/off/32"
    assert records["fp32/off/32"].is_baseline and records["fp32/off/64"].verdict == "oom"
    assert {p.knobs.label(): p.max_micro_batch for p in outcome.probes} == {
        "fp32/off": 32, "bf16/off": 32, "fp32/default": 32, "bf16/default": 32,
        "bf16/max-autotune": 32}
    # Probes that timed nothing are not trials: no record, no throughput.
    assert "fp32/off/1" not in records and "fp32/off/8" not in records
    assert records["bf16/default/32"].samples_per_s == pytest.approx(300)


def test_a_boundary_found_by_a_bisection_point_is_timed_afterwards() -> None:
    # Memory jumps past micro-batch 8: the line through 1 and 8 predicts 32, which fails.
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330),
                            peak_mib=lambda m: 100 + 20 * m if m <= 8 else 2000)
    outcome, records = search(device)
    assert device.runs()[:6] == ["fp32/off/64", "fp32/off/1 (probe)", "fp32/off/8 (probe)",
                                 "fp32/off/32", "fp32/off/16", "fp32/off/8"]
    assert outcome.baseline is not None and outcome.baseline.key() == "fp32/off/8"
    assert records["fp32/off/8"].samples_per_s == pytest.approx(100 * 0.8)


def test_a_compiled_probe_above_its_fit_is_timed_in_the_probe_not_run_again() -> None:
    # Eager fits 8 (80 MiB a sample); compiled code 16 (40 MiB a sample). bf16/default starts
    # at the hint 8 and fits; 16 above it is no bisection point to skip timing: were it not
    # timed, its largest fit would run once more (another child, its graphs loaded again).
    # The line through 8 and 16 puts 32 at 1380 MiB, over the 1000 MiB cap: not run.
    eager, compiled = (lambda m: 100 + 80 * m), (lambda m: 100 + 40 * m)
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), peaks={
        "fp32/off": eager, "bf16/off": eager, "fp32/default": compiled,
        "bf16/default": compiled, "bf16/max-autotune": compiled})
    outcome, records = search(device)
    runs = [r for r in device.runs() if r.startswith("bf16/default/")]
    assert runs[:2] == ["bf16/default/8", "bf16/default/16"]  # both timed, neither a "(probe)"
    assert runs.count("bf16/default/16") == 1 + (records["bf16/default/16"].num_runs > 1)
    assert "bf16/default/32" not in runs
    probe = next(p for p in outcome.probes if p.knobs.label() == "bf16/default")
    assert probe.max_micro_batch == 16 and [s.timed for s in probe.steps] == [True, True]
    assert probe.notes == ("micro-batches above 16 not probed: the line through the peaks at "
                           "8, 16 puts 32 at 1.35 GiB, over the 1000.00 MiB cap",)
    # Eager probe points stay bisection points: a run of their own costs little.
    assert "fp32/off/1 (probe)" in device.runs()


def test_a_class_far_behind_is_not_probed_above_its_first_fit() -> None:
    # fp32 fits 16 (40 MiB a sample), bf16 32. bf16/off times 16 and 32: 1.11x for twice the
    # micro-batch. fp32/default, probed after bf16/default (bf16 led in eager), runs 135
    # samples/s at 16 against the leader's 300: a larger micro-batch gains at most 1.18x by
    # that pair's overhead, so its probe stops at 16 instead of compiling 32 to see it fail.
    fp32 = lambda m: 100 + 40 * m  # noqa: E731
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330),
                            peaks={"fp32/off": fp32, "fp32/default": fp32})
    outcome, _ = search(device)
    assert device.runs().index("bf16/default/32") < device.runs().index("fp32/default/16")
    assert "bf16/off/16" in device.runs() and "bf16/off/32" in device.runs()
    assert not any(r.startswith("fp32/default/32") for r in device.runs())
    probe = next(p for p in outcome.probes if p.knobs.label() == "fp32/default")
    assert probe.max_micro_batch == 16 and [s.micro_batch for s in probe.steps] == [16]
    assert probe.notes == (
        "micro-batches above 16 not probed: at 16 it runs 135.0 samples/s, 0.45x the leader's "
        "(bf16/default/32); a larger one gains at most 1.18x (up to 64: the per-micro-batch "
        "overhead bf16/off showed from 16 to 32, 1.11x, spread over more samples), 158.8 "
        "samples/s: behind by more than the noise (5%)",)
    assert f"fp32/default: {probe.notes[0]}" in outcome.skipped
    # The baseline's own probe always finds its boundary (it is what an untuned user runs):
    # no gain ceiling stops it, only the line through its peaks at 1, 8 and 16, which puts 32
    # at 1380 MiB, over the 1000 MiB cap (it could only run out of memory there).
    baseline = next(p for p in outcome.probes if p.knobs.label() == "fp32/off")
    assert baseline.max_micro_batch == 16 and 32 not in [s.micro_batch for s in baseline.steps]
    assert baseline.notes == (
        "micro-batches above 16 not probed: the line through the peaks at 1, 8, 16 puts 32 at "
        "1.35 GiB, over the 1000.00 MiB cap",)


def test_a_compiled_class_far_behind_over_the_budget_is_not_probed_below_it() -> None:
    # fp32/default peaks 28 MiB a sample: at the hint 32 (the eager boundary) it runs, but its
    # 996 MiB are over the 900 usable. It ran 150 samples/s there, half the leader's 300: a
    # smaller micro-batch of compiled code only adds accumulation steps, so 16 is not compiled
    # to find its fit. Its probe is not listed as fitting nothing: the reason is said instead.
    over = lambda m: 100 + 28 * m  # noqa: E731
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330), peaks={"fp32/default": over})
    outcome, records = search(device)
    assert [r for r in device.runs() if r.startswith("fp32/default/")] == ["fp32/default/32"]
    assert records["fp32/default/32"].verdict == "over_budget"
    assert "fp32/default" not in {p.knobs.label() for p in outcome.probes}
    assert ("fp32/default: micro-batches below 32 not probed: at 32 it ran 150.0 samples/s "
            "(over the usable budget), 0.50x the leader's (bf16/default/32), under the 0.90 "
            "that refinement needs (--refine-within) by more than the noise (5%); a smaller "
            "micro-batch of a compiled setting only adds accumulation steps (time per "
            "micro-batch linear in its size, plus one update per step), at the cost of a "
            "compile of its own") in outcome.skipped
    winner = pick_winner_record(outcome)
    assert winner is not None and winner.knobs.label() == "bf16/max-autotune"


@pytest.mark.parametrize("speeds, label", [
    ((100, 285, 160, 200, 300, 330), "fp32/default"),  # 0.95x the leader: it could win
    ((100, 150, 160, 200, 300, 330), "bf16/off"),  # eager: no compile, and cache effects
    ((300, 150, 160, 100, 300, 330), "bf16/off"),  # eager, though far behind the leader
])
def test_a_class_over_the_budget_near_the_leader_or_eager_is_probed_below_it(
        speeds: tuple[float, ...], label: str) -> None:
    device = ScriptedDevice(by_class(*speeds), peaks={label: lambda m: 100 + 28 * m})
    outcome, records = search(device)
    assert records[f"{label}/32"].verdict == "over_budget"
    assert f"{label}/16" in device.runs()
    probe = next(p for p in outcome.probes if p.knobs.label() == label)
    assert probe.max_micro_batch == 16
    assert not any("micro-batches below" in s for s in outcome.skipped)


def test_other_compile_modes_only_for_a_precision_near_the_leader() -> None:
    device = ScriptedDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome, records = search(device)
    assert "bf16/max-autotune/32" in records  # bf16 leads: its kernel autotuning is tried
    assert not any(k.startswith("fp32/max-autotune") for k in device.runs())
    why = next(s for s in outcome.skipped if s.startswith("fp32/max-autotune not tried"))
    assert "fp32's best is 0.50x the leader's (bf16/default/32)" in why
    assert "--refine-within" in why


def test_a_share_just_under_the_threshold_is_not_rounded_up_to_it() -> None:
    # The floor is 0.90 less the noise measured (5% on this quiet device): 0.855.
    device = ScriptedDevice(by_class(100, 256.35, 160, 200, 300, 330))  # fp32: 0.8545x bf16
    outcome, _ = search(device)
    why = next(s for s in outcome.skipped if s.startswith("fp32/max-autotune not tried"))
    assert "fp32's best is 0.85x the leader's (bf16/default/32), under the 0.855 that" in why
    device = ScriptedDevice(by_class(100, 256.5, 160, 200, 300, 330))  # fp32: 0.855x bf16
    outcome, _ = search(device)
    assert not any(s.startswith("fp32/max-autotune not tried") for s in outcome.skipped)


def test_when_fp32_eager_fits_nothing_checkpointing_is_the_baseline_offered() -> None:
    # 1 sample needs 1020 MiB without checkpointing (over 900 usable); blocks keeps 30%.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                        peak_mib=lambda m: 100 + 920 * m)
    outcome, records = knob_search(device)
    assert outcome.baseline is not None
    assert outcome.baseline.knobs.checkpointing == "blocks"
    assert records[outcome.baseline.key()].is_baseline
    assert any("fp32/off fits no micro-batch" in s and "ckpt=blocks" in s
               for s in outcome.skipped)


def _near_miss_device(fp32_off_1_mib: float, saves_mib: float = 40.0) -> KnobDevice:
    """fp32 eager peaks ``fp32_off_1_mib`` at micro-batch 1 (900 MiB usable, a 1000 MiB
    cap; a run that ran out of memory reports the peak it needed, as the replay's recorded
    tables do); the fused optimizer's temporaries are ``saves_mib`` smaller, and fused at 1
    outruns what checkpointing fits (as the shrunk EPYC deep GPT of the replay's
    budget-shrink family). Every other class fits nothing."""
    return KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                      peak_mib=lambda m: 100 + (fp32_off_1_mib - 100) * m,
                      peaks={c: lambda m: 5000 * m for c in (
                          "fp32/default", "fp32/max-autotune", "bf16/off", "bf16/default",
                          "bf16/max-autotune")},
                      ckpt_speed={"off": 1.0, "alternate": 0.7, "blocks": 0.6},
                      impl_saves_mib={"fused": saves_mib}, oom_peak=True)


HEADROOM_MISS = ("fp32/off/1 peaked at 920.00 MiB, over the 900.00 MiB usable but under the "
                 "1000.00 MiB cap (the headroom kept for the allocator's noise): "
                 "fp32/off+opt=foreach, fp32/off+opt=fused probed from there too, each a value "
                 "that frees no memory by design but may land under")
OOM_MISS = ("fp32/off/1 ran out of memory at 1.03 GiB, within 25% of a peak over the 900.00 MiB "
            "usable (what a value that frees no memory by design, an optimizer implementation "
            "or a memory format, took off a CPU run's peak): fp32/off+opt=foreach, "
            "fp32/off+opt=fused probed from there too, each of which may land under")


@pytest.mark.parametrize(("need_mib", "saves_mib", "said"), [
    # fp32/off/1 ran every step at 920 MiB: over the 900 usable, under the 1000 cap. Fused's
    # 40 MiB less fits there (880 MiB).
    (920, 40, HEADROOM_MISS),
    # fp32/off/1 ran out of memory needing 1050 MiB: over the 1000 cap, but within 25% of a
    # peak over the 900 usable (an optimizer implementation took 22% off a CPU run's peak in
    # the recorded tables: the shrunk EPYC deep GPT's best, foreach at 1, fits where the
    # default ran out). Fused's 200 MiB less fits there (850 MiB).
    (1050, 200, OOM_MISS),
])
def test_a_baseline_that_misses_near_the_budget_has_its_other_values_probed_there(
        need_mib: float, saves_mib: float, said: str) -> None:
    # Rule near-miss. Checkpointing still rescues the baseline; the optimizer values are
    # probed at 1 as well, and fused fits there: it runs 55 samples/s, where the best
    # checkpointing fits runs 0.6 x 0.6 x 100 (blocks at 2) or 0.7 x 1.1 x 0.5 x 100
    # (alternate with fused at 1).
    device = _near_miss_device(need_mib, saves_mib=saves_mib)
    outcome, records = knob_search(device)
    assert outcome.baseline is not None and outcome.baseline.knobs.checkpointing == "blocks"
    winner = pick_winner_record(outcome)
    assert winner is not None and f"{winner.knobs.label()}/{winner.micro_batch}" \
        == "fp32/off+opt=fused/1"
    assert records["fp32/off+opt=fused/1"].samples_per_s == pytest.approx(55)
    assert said in outcome.skipped


@pytest.mark.parametrize("width", [1, 2])
def test_a_baseline_whose_second_run_peaks_over_the_budget_is_rescued(width: int) -> None:
    # fp32/off/1 peaks 880 MiB in its probe and first timed run (900 usable), then 920 MiB in
    # the noise's re-measure (inside the headroom): peaks vary from run to run, the larger
    # counts, so fp32 eager fits nothing. Every other class fits nothing either; before, the
    # search went on with a baseline that did not fit and ended with no winner (the EPYC deep
    # GPT at a shrunk budget, 7 seeds of 30). Now its fit steps down to none, checkpointing
    # rescues the baseline, and fused (40 MiB less) fits at 1 and wins.
    inner = _near_miss_device(880, saves_mib=40)
    timed: list[TrialSpec] = []

    def device(spec: TrialSpec) -> TrialResult:
        result = inner(spec)
        if spec.num_timed_steps and spec.knobs.label() == "fp32/off" and spec.micro_batch == 1:
            timed.append(spec)
            if len(timed) >= 2 and result.ok:
                result = dataclasses.replace(result, peak_bytes=920 * MIB)
        return result

    if width == 1:
        outcome, records = knob_search(device)
    else:  # two slots: the noise's re-measure runs beside the next classes' probes
        slots = ThreadSlots([Slot(i, f"cpu {i}") for i in range(width)],
                            lambda spec, slot, on_start: device(spec))
        outcome = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device, slots=slots)
        records = {f"{r.knobs.label()}/{r.micro_batch}": r for r in outcome.records}
    assert len(timed) >= 2
    assert outcome.baseline is not None and outcome.baseline.knobs.checkpointing == "blocks"
    winner = pick_winner_record(outcome)
    assert winner is not None and f"{winner.knobs.label()}/{winner.micro_batch}" \
        == "fp32/off+opt=fused/1", sorted(records)
    probe = next(p for p in outcome.probes if p.knobs.label() == "fp32/off")
    assert probe.max_micro_batch == 0
    assert ("micro-batch 1 does not fit after all: its timed run peaked 920.00 MiB, over the "
            "900.00 MiB usable, where its probe's run fit (peaks vary from run to run; the "
            "larger counts)") in probe.notes


@pytest.mark.parametrize("need_mib", [1210, 2000])
def test_a_baseline_far_over_the_cap_has_no_other_value_probed_without_freeing_memory(
        need_mib: float) -> None:
    # 1210 MiB at 1 (or 2000) is more than 25% over a peak within the 900 usable: no value
    # that frees no memory by design takes that off; the rescue alone.
    device = _near_miss_device(need_mib, saves_mib=400)
    outcome, _ = knob_search(device)
    assert outcome.baseline is not None and outcome.baseline.knobs.checkpointing == "blocks"
    assert not any(s.knobs.checkpointing == "off" and s.knobs.optimizer_impl != "default"
                   and s.micro_batch == 1 for s in device.specs)
    assert not any(s.startswith("fp32/off/1 ") for s in outcome.skipped)


def test_another_class_that_misses_within_the_headroom_has_its_other_values_probed() -> None:
    # fp32 eager fits 32; bf16 eager peaks 920 MiB at 1 (inside the headroom), and the fused
    # optimizer's 40 MiB less fits there: 500 x 1.1 x 0.5 = 275 samples/s, where fp32
    # eager's best with fused is 110 (as the shrunk EPYC CNN of the replay's budget-shrink
    # family, where bf16 eager just missed at 1).
    device = KnobDevice(by_class(100, 150, 160, 500, 300, 330),
                        peaks={"bf16/off": lambda m: 920 * m,
                               **{c: lambda m: 5000 * m for c in (
                                   "fp32/default", "fp32/max-autotune", "bf16/default",
                                   "bf16/max-autotune")}},
                        impl_saves_mib={"fused": 40.0})
    outcome, records = knob_search(device)
    assert outcome.baseline is not None and outcome.baseline.key() == "fp32/off/32"
    winner = pick_winner_record(outcome)
    assert winner is not None and f"{winner.knobs.label()}/{winner.micro_batch}" \
        == "bf16/off+opt=fused/1"
    assert records["bf16/off+opt=fused/1"].samples_per_s == pytest.approx(275)
    assert any(s.startswith("bf16/off/1 peaked at 920.00 MiB") for s in outcome.skipped)


def _pair_device(above_8: float) -> KnobDevice:
    """Memory binds at 8 (100 + 90 MiB a sample) but for bf16 eager (40 MiB a sample: it fits
    16, and its probe times 8 and 16); above 8 each sample runs ``above_8`` times as fast as
    at 8."""
    return KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 100 + 90 * m,
                      peaks={"bf16/off": lambda m: 100 + 40 * m},
                      shape=lambda m: above_8 if m > 8 else 1 - 0.1 * math.log2(8 / m))


def test_a_pair_whose_larger_run_stopped_behind_still_bounds_what_a_larger_one_gains() -> None:
    # As on the AMD EPYC's causal LM: bf16/off's 16 runs 0.8x per sample (stopped early:
    # behind the leader, its own 8, three steps). fp32/default runs 0.50x the leader at 8:
    # that pair says a larger micro-batch gains nothing (0.80x from 8 to 16), so its probe
    # stops at 8 instead of compiling 16 to find it behind (or out of memory).
    device = _pair_device(above_8=0.8)
    outcome, records = knob_search(device)
    assert records["bf16/off/16"].verdict == "slower"
    assert records["bf16/off/16"].num_timed_steps == MIN_STEPS_TO_STOP
    assert "fp32/default/8" in records
    assert not any(s.knobs.label() == "fp32/default" and s.micro_batch > 8
                   for s in device.specs)
    assert ("fp32/default: micro-batches above 8 not probed: at 8 it runs 150.0 samples/s, "
            "0.50x the leader's (bf16/default/8); a larger one gains at most 1.00x (up to 64: "
            "the per-micro-batch overhead bf16/off showed from 8 to 16, 0.80x, spread over "
            "more samples), 150.0 samples/s: behind by more than the noise (5%)"
            ) in outcome.skipped


def test_a_pair_whose_larger_run_the_time_limit_cut_to_one_step_bounds_nothing() -> None:
    # The same, but bf16/off at 16 runs 0.05x per sample: cut by the time limit after one
    # step, its median has no interval, so the pair is not used and fp32/default is probed at
    # 16.
    device = _pair_device(above_8=0.05)
    outcome, records = knob_search(device)
    assert records["bf16/off/16"].verdict == "slower"
    assert records["bf16/off/16"].num_timed_steps < MIN_STEPS_TO_STOP
    assert any(s.knobs.label() == "fp32/default" and s.micro_batch == 16 for s in device.specs)
    assert not any(s.startswith("fp32/default: micro-batches above 8 not probed: at 8")
                   for s in outcome.skipped)


def _eager_ahead_with_a_layout() -> KnobDevice:
    # bf16 eager needs more memory than fp32 eager (32 does not fit, 16 does) and runs 0.6x
    # bf16 compiled; channels_last doubles eager convolutions' speed only, so bf16 eager with
    # it at 16 is the best (360 samples/s against 310).
    return KnobDevice(by_class(100, 110, 115, 200, 300, 310), traits=CONV,
                      peaks={"bf16/off": lambda m: 100 + 30 * m},
                      factor=lambda k, m: 2.0 if k.memory_format == "channels_last"
                      and k.compile_mode == "off" else 1.0)


@pytest.mark.parametrize("width", [1, 3])
def test_a_class_probed_beside_a_faster_one_is_not_stopped_by_it_where_one_slot_would_not_be(
        width: int) -> None:
    # With one slot bf16 eager is probed before the compiled classes, so its timed run at 16
    # ran in full (the baseline the only bar) and the joint screen put channels_last on it.
    # With three, eager runs take 5 s and compiled 1 s: bf16 compiled's run at 32 ended
    # before bf16 eager's at 16 began, which was stopped behind it, its setting never
    # screened with knobs, and the pick was bf16/max-autotune+opt=fused/32 (0.86 of the best)
    # where one slot picks the best. Now a class's runs are stopped only by the classes one
    # slot would have probed before it.
    device = _eager_ahead_with_a_layout()
    slots = None if width == 1 else OrderedSlots(
        device, width, lambda spec: 5.0 if spec.compile_mode == "off" else 1.0)
    outcome = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device, slots=slots)
    records = {f"{r.knobs.label()}/{r.micro_batch}": r for r in outcome.records}
    assert records["bf16/off/16"].verdict == "ok"  # timed in full: not stopped behind
    winner = pick_winner_record(outcome)
    assert winner is not None and winner.knobs.compile_mode == "off" \
        and winner.knobs.memory_format == "channels_last" and winner.micro_batch == 16
