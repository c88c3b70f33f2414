"""memory.probe_memory finds the true largest micro-batch under a real cap, in few probes."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from autotune.config import Knobs, TrialResult, TrialSpec, WorkloadSpec
from autotune.memory import probe_memory, probe_spec
from autotune.runner import run_isolated
from autotune.space import divisors
from autotune.units import MIB
from tests.conftest import workload_target

TINY = WorkloadSpec(kind="file", target=workload_target("tiny"))
FP32 = Knobs(precision="fp32", compile_mode="off")
CANDIDATES = divisors(12)  # 1, 2, 3, 4, 6, 12
BOUNDARY = 4  # the usable budget is put between the peaks of 4 and 6


def test_children_run_with_the_repeatable_cpu_allocator() -> None:
    """Without it the peak of one micro-batch moves between runs by more than a sample's worth
    (DESIGN.md section 4), and brute force would not be a truth."""
    from autotune.device.cpu import CPU_ALLOCATOR
    from autotune.runner import allocator_notes, child_environment

    env = child_environment("cpu")
    assert all(env[k] == v for k, v in CPU_ALLOCATOR.items())
    assert "MALLOC_ARENA_MAX=1" in allocator_notes("cpu")


@pytest.fixture(scope="module")
def brute_force_peaks() -> dict[int, int]:
    """Measured peak of every candidate, uncapped, with the real runner (two at a time)."""
    specs = [probe_spec(TINY, "cpu", FP32, m, None, 300.0) for m in CANDIDATES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run_isolated, specs))
    peaks = {}
    for micro_batch, result in zip(CANDIDATES, results, strict=True):
        assert result.status == "ok", (micro_batch, result.message)
        assert result.peak_bytes is not None
        peaks[micro_batch] = result.peak_bytes
    return peaks


@pytest.fixture(scope="module")
def usable_bytes(brute_force_peaks: dict[int, int]) -> int:
    after = CANDIDATES[CANDIDATES.index(BOUNDARY) + 1]
    return (brute_force_peaks[BOUNDARY] + brute_force_peaks[after]) // 2


@pytest.mark.subprocess
def test_peaks_grow_with_the_micro_batch(brute_force_peaks: dict[int, int]) -> None:
    peaks = [brute_force_peaks[m] for m in CANDIDATES]
    assert peaks == sorted(peaks), brute_force_peaks
    # Activations dominate: 12 samples need far more than one.
    assert brute_force_peaks[12] > 5 * brute_force_peaks[1]


@pytest.mark.subprocess
@pytest.mark.slow
def test_probe_finds_the_brute_force_answer(brute_force_peaks: dict[int, int],
                                            usable_bytes: int) -> None:
    truth = max(m for m in CANDIDATES if brute_force_peaks[m] <= usable_bytes)
    assert truth == BOUNDARY
    calls: list[int] = []

    def run(spec: TrialSpec) -> TrialResult:
        calls.append(spec.micro_batch)
        return run_isolated(spec)

    probe = probe_memory(TINY, "cpu", FP32, CANDIDATES, budget_bytes=int(usable_bytes / 0.9),
                         usable_bytes=usable_bytes, timeout_s=300.0, run=run)
    assert probe.max_micro_batch == truth, probe.steps
    assert probe.num_probes == len(calls) < len(CANDIDATES)
    assert calls[0] == CANDIDATES[-1]  # no hint: start at the target
    assert probe.peak_bytes is not None and probe.peak_bytes <= usable_bytes
    assert probe.margin_bytes() == usable_bytes - probe.peak_bytes
    assert probe.fitting() == (1, 2, 3, 4)
    for step in probe.steps:
        assert step.fits == (step.micro_batch <= truth), step
    # The boundary confirmed: 6 ran and failed, or the line through the fitting peaks put it
    # over the hard cap, so no run could have fitted (boundary.confirm_over)
    ran_over = any(s.micro_batch == 6 and not s.fits for s in probe.steps)
    line_over = [n for n in probe.notes if re.match(
        r"micro-batches above 4 not probed: the line through the peaks at [1-4](, [1-4])+ puts "
        r"6 at [\d.]+ MiB, over the [\d.]+ MiB cap$", n)]
    assert ran_over != bool(line_over), (probe.steps, probe.notes)
    assert brute_force_peaks[6] > usable_bytes


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_right_hint_settles_in_two_probes(usable_bytes: int) -> None:
    probe = probe_memory(TINY, "cpu", FP32, CANDIDATES, budget_bytes=int(usable_bytes / 0.9),
                         usable_bytes=usable_bytes, timeout_s=300.0, hint=BOUNDARY)
    assert probe.max_micro_batch == BOUNDARY
    assert [s.micro_batch for s in probe.steps] == [4, 6]
    assert [s.fits for s in probe.steps] == [True, False]


@pytest.mark.subprocess
@pytest.mark.slow
def test_nothing_fits_gives_zero() -> None:
    budget = 4 * MIB  # micro-batch 1 alone needs about 12 MiB
    probe = probe_memory(TINY, "cpu", FP32, (1, 2), budget_bytes=budget,
                         usable_bytes=int(budget * 0.9), timeout_s=300.0)
    assert probe.max_micro_batch == 0
    assert probe.peak_bytes is None
    assert [s.micro_batch for s in probe.steps] == [2, 1]
    assert not any(s.fits for s in probe.steps)
    assert all(s.status == "oom" for s in probe.steps), probe.steps
    assert probe.fitting() == ()


def _scripted(peak_mib: Callable[[int], float], cap_mib: float,
              ran: list[int]) -> Callable[[TrialSpec], TrialResult]:
    """A run whose peak is ``peak_mib(micro_batch)``: out of memory over ``cap_mib``."""

    def run(spec: TrialSpec) -> TrialResult:
        ran.append(spec.micro_batch)
        peak = int(peak_mib(spec.micro_batch) * MIB)
        if peak > cap_mib * MIB:
            return TrialResult(status="oom", message="out of memory", wall_s=1.0)
        return TrialResult(status="ok", peak_bytes=peak, step_times_s=(), wall_s=1.0)

    return run


def _peaked(peak_mib: dict[int, float], cap_mib: float,
            ran: list[int]) -> Callable[[TrialSpec], TrialResult]:
    """A run whose peak is ``peak_mib[micro_batch]``: out of memory over ``cap_mib``, with
    the peak it reached (as a capped child reports it)."""

    def run(spec: TrialSpec) -> TrialResult:
        ran.append(spec.micro_batch)
        peak = int(peak_mib[spec.micro_batch] * MIB)
        return TrialResult(status="oom" if peak > cap_mib * MIB else "ok", peak_bytes=peak,
                           message="out of memory" if peak > cap_mib * MIB else "",
                           wall_s=1.0)

    return run


# tiny_cnn on the Xeon, bf16 eager (the recorded table's peaks, MiB): micro-batch 1 needs
# more than 2 and 4, and 8 and up more again.
NOT_MONOTONE = {1: 35.3, 2: 22.9, 4: 23.0, 8: 27.5, 16: 28.7, 32: 31.5, 64: 36.9}


@pytest.mark.parametrize(("usable", "found", "runs", "fitting"), [
    # 16, 8 and 1 fail, 1 at a higher peak than 8: 4 (the gap's middle) fits, and nothing
    # lies between it and 8
    (25.0, 4, [16, 8, 1, 4], (2, 4)),
    (22.95, 2, [16, 8, 1, 4, 2], (2,)),  # 4 over too: the gap below it
    (22.0, 0, [16, 8, 1, 4, 2], ()),  # nothing between fits either
    (40.0, 64, [16, 32, 64], (1, 2, 4, 8, 16, 32, 64)),  # memory to spare: as ever
])
def test_a_smaller_micro_batch_failing_at_a_higher_peak_opens_the_ones_between(
        usable: float, found: int, runs: list[int], fitting: tuple[int, ...]) -> None:
    ran: list[int] = []
    probe = probe_memory(TINY, "cpu", FP32, divisors(64), budget_bytes=int(usable / 0.9 * MIB),
                         usable_bytes=int(usable * MIB), hint=16,
                         run=_peaked(NOT_MONOTONE, usable / 0.9, ran))
    assert probe.max_micro_batch == found
    assert ran == runs
    assert probe.fitting() == fitting  # never 1 below a fit: the probe saw it fail


def test_a_crash_at_a_higher_peak_says_nothing_of_memory() -> None:
    # Micro-batch 1 crashed (killed, not out of memory) at a peak above 16's failure: a crash is no
    # memory verdict, so nothing between is probed.
    ran: list[int] = []
    oom = _peaked(NOT_MONOTONE, 25.0 / 0.9, ran)

    def run(spec: TrialSpec) -> TrialResult:
        result = oom(spec)
        if spec.micro_batch == 1:
            return TrialResult(status="crash", peak_bytes=result.peak_bytes,
                               message="child killed by SIGSEGV", wall_s=1.0)
        return result

    probe = probe_memory(TINY, "cpu", FP32, divisors(64), budget_bytes=int(25.0 / 0.9 * MIB),
                         usable_bytes=int(25.0 * MIB), hint=16, run=run)
    assert probe.max_micro_batch == 0 and ran == [16, 8, 1]


@pytest.mark.parametrize("peaks", [
    {m: 12.0 + m for m in divisors(64)},  # grows with the micro-batch: 1 fails lowest
    # a floor the compile sets (tiny_cnn's compiled classes on the Xeon): 1 fails higher,
    # but 8 and 16 fail 114 MiB over the 10 MiB cap, more than GAP_EXCESS_SHARE of 1's 121
    {**{m: 124.0 for m in divisors(64)}, 1: 131.0},
])
def test_a_failure_that_rises_no_nearer_the_cap_opens_nothing(peaks: dict[int, float]) -> None:
    ran: list[int] = []
    probe = probe_memory(TINY, "cpu", FP32, divisors(64), budget_bytes=10 * MIB,
                         usable_bytes=9 * MIB, hint=16, run=_peaked(peaks, 10.0, ran))
    assert probe.max_micro_batch == 0 and ran == [16, 8, 1]


@pytest.mark.parametrize("known_at_8", ["ok", "timeout", "none", "not a candidate"])
def test_known_runs_put_their_peaks_on_the_line_from_the_start(known_at_8: str) -> None:
    # 100 MiB + 40 a sample, cap 1000 (usable 900): 16 fits (740), 32 does not (1380). A run
    # at 8 measured before the probe (340 MiB) and the probe's own at the hint 16 put 32 over
    # the cap by their line: the probe ends without running it. A run that says nothing of
    # memory (a timeout) or of another micro-batch is not on the line: 32 is run (an OOM).
    def peak(m: int) -> float:
        return 100 + 40 * m

    ran: list[int] = []
    known = {"ok": {8: TrialResult(status="ok", peak_bytes=int(peak(8) * MIB), wall_s=1.0)},
             "timeout": {8: TrialResult(status="timeout", wall_s=1.0)},
             "none": {},
             "not a candidate": {7: TrialResult(status="ok", peak_bytes=int(peak(7) * MIB),
                                                wall_s=1.0)}}[known_at_8]
    probe = probe_memory(TINY, "cpu", FP32, divisors(32), budget_bytes=1000 * MIB,
                         usable_bytes=900 * MIB, hint=16, run=_scripted(peak, 1000, ran),
                         known=known)
    assert probe.max_micro_batch == 16
    if known_at_8 == "ok":
        assert ran == [16]
        assert [(s.micro_batch, s.status) for s in probe.steps] == [(8, "ok"), (16, "ok")]
        assert probe.notes == ("micro-batches above 16 not probed: the line through the peaks "
                               "at 8, 16 puts 32 at 1.35 GiB, over the 1000.00 MiB cap",)
    else:
        assert ran == [16, 32]
        assert [(s.micro_batch, s.status) for s in probe.steps] == [(16, "ok"), (32, "oom")]


def test_a_known_failure_at_the_hint_goes_on_as_its_run_would_have() -> None:
    # The hint 16 is known not to fit: the next run is the largest candidate below it, as
    # after a run there; a known fit above the hint's failure ends the bracket.
    def peak(m: int) -> float:
        return 100 + 60 * m  # 8 fits (580), 16 does not (1060 > 1000)

    ran: list[int] = []
    oom = TrialResult(status="oom", message="out of memory", wall_s=1.0)
    probe = probe_memory(TINY, "cpu", FP32, divisors(32), budget_bytes=1000 * MIB,
                         usable_bytes=900 * MIB, hint=16, run=_scripted(peak, 1000, ran),
                         known={16: oom})
    assert ran == [8] and probe.max_micro_batch == 8
    ran.clear()
    probe = probe_memory(TINY, "cpu", FP32, divisors(32), budget_bytes=1000 * MIB,
                         usable_bytes=900 * MIB, hint=16, run=_scripted(peak, 1000, ran),
                         known={16: oom, 8: TrialResult(status="ok", peak_bytes=580 * MIB,
                                                        wall_s=1.0)})
    assert ran == [] and probe.max_micro_batch == 8 and probe.peak_bytes == 580 * MIB


@pytest.mark.parametrize("answer", [None, "it cannot win"])
def test_stop_below_is_asked_only_below_a_run_over_the_usable_budget_with_nothing_fit(
        answer: str | None) -> None:
    # 100 MiB + 28 a sample, cap 1000 (usable 900): 32 runs but peaks at 996, over the usable;
    # 16 fits (548). Asked before 16 (nothing fit yet, below a run over the usable), a reason
    # ends the probe with nothing found to fit, said in its notes; None probes on.
    asked: list[tuple[int, int]] = []

    def stop_below(over: int, below: int) -> str | None:
        asked.append((over, below))
        return answer

    ran: list[int] = []
    probe = probe_memory(TINY, "cpu", FP32, divisors(64), budget_bytes=1000 * MIB,
                         usable_bytes=900 * MIB, hint=32,
                         run=_scripted(lambda m: 100 + 28 * m, 1000, ran),
                         stop_below=stop_below)
    assert asked == [(32, 16)]
    if answer is None:
        assert ran == [32, 16] and probe.max_micro_batch == 16
        assert probe.notes == ()
    else:
        assert ran == [32] and probe.max_micro_batch == 0 and probe.peak_bytes is None
        assert probe.notes == ("micro-batches below 32 not probed: it cannot win",)


def test_stop_below_is_not_asked_below_an_out_of_memory_or_once_a_micro_batch_fits() -> None:
    # 64 ends out of memory (a failure says nothing of speed): the smaller ones are probed
    # unasked, and nothing below a fit is asked about either.
    asked: list[tuple[int, int]] = []
    ran: list[int] = []
    probe = probe_memory(TINY, "cpu", FP32, divisors(64), budget_bytes=1000 * MIB,
                         usable_bytes=900 * MIB, hint=64,
                         run=_scripted(lambda m: 100 + 20 * m, 1000, ran),
                         stop_below=lambda over, below: asked.append((over, below)) or "no")
    assert ran[0] == 64 and probe.max_micro_batch == 32 and asked == []


# -- why nothing fits: a memory verdict, or the workload's failure, never "does not fit" for a
# run that failed otherwise (no child runs here: the run without the cap is given) -----------

def _crashed_at_1(usable: int = 100 * MIB) -> tuple[object, object]:
    from autotune.api.request import Budget
    from autotune.config import MemoryProbe, ProbeStep

    probe = MemoryProbe(knobs=FP32, max_micro_batch=0, peak_bytes=None, budget_bytes=usable,
                        usable_bytes=usable, candidates=(1, 2), steps=(ProbeStep(
                            micro_batch=1, status="crash", peak_bytes=None, fits=False,
                            message="child killed by SIGSEGV"),))
    return probe, Budget(budget_bytes=usable, usable_bytes=usable, headroom=0.0)


@pytest.mark.parametrize(("uncapped", "says"), [
    # Without the cap it fit the budget: the cap did not cause the crash.
    (TrialResult(status="ok", peak_bytes=40 * MIB), "the workload is broken, not too big: at "
     "micro-batch 1 (fp32/off) (under the memory cap; without it the run fit, at a peak of "
     "40.00 MiB: a crash that does not always happen) its process died [crash]: child killed "
     "by SIGSEGV"),
    # No run left to tell (the limits spent): the crash is said, not a memory verdict.
    (None, "at micro-batch 1 (fp32/off) the process died under the memory cap [crash]: child "
     "killed by SIGSEGV. No run was left (--time-budget or --max-trials spent) to run it "
     "without the cap and tell whether the cap caused it"),
])
def test_a_crash_at_micro_batch_1_is_named_never_does_not_fit(
        uncapped: TrialResult | None, says: str) -> None:
    from autotune.api.nothing_fits import nothing_fits
    from autotune.device import describe_device
    from autotune.names import FLAGS

    probe, budget = _crashed_at_1()
    error = nothing_fits(TINY, describe_device("cpu"), budget, probe,  # type: ignore[arg-type]
                         None, uncapped=uncapped, name=FLAGS)
    assert error.exit_code == 2 and str(error).startswith(says), str(error)
    assert "does not fit" not in str(error)


def test_a_crash_under_the_cap_that_needs_more_without_it_is_a_memory_verdict() -> None:
    from autotune.api.nothing_fits import nothing_fits
    from autotune.device import describe_device

    probe, budget = _crashed_at_1()
    error = nothing_fits(TINY, describe_device("cpu"), budget, probe,  # type: ignore[arg-type]
                         None, uncapped=TrialResult(status="ok", peak_bytes=300 * MIB))
    assert error.exit_code == 1
    assert str(error).startswith("micro-batch 1 does not fit in 100.00 MiB usable"), str(error)
    assert "it needs 300.00 MiB at its peak (fp32/off)" in str(error)


def test_a_leak_that_went_over_the_budget_under_the_cap_is_named_as_a_leak() -> None:
    """A leaking workload's timed run can end over the usable memory but under the cap (it
    ran, over budget): still a leak, never 'does not fit' with a need under the budget."""
    from autotune.api.nothing_fits import nothing_fits
    from autotune.config import MemoryProbe, ProbeStep
    from autotune.device import describe_device
    from autotune.search import Candidate

    usable = 60 * MIB
    probe = MemoryProbe(knobs=FP32, max_micro_batch=0, peak_bytes=None, budget_bytes=usable,
                        usable_bytes=usable, candidates=(1,), steps=(ProbeStep(
                            micro_batch=1, status="ok", peak_bytes=62 * MIB, fits=False),))
    timed = TrialResult(status="ok", peak_bytes=62 * MIB, num_optimizer_steps=6,
                        step_memory_bytes=tuple(MIB * m for m in (20, 28, 36, 44, 52, 60)))
    error = nothing_fits(TINY, describe_device("cpu"), _budget(usable), probe,  # type: ignore[arg-type]
                         None, {Candidate(knobs=FP32, micro_batch=1): timed},
                         uncapped=TrialResult(status="ok", peak_bytes=25 * MIB))
    assert error.exit_code == 2
    assert str(error).startswith("micro-batch 1 (fp32/off) went over the usable memory after 6 "
                                 "optimizer steps: memory grew by 8.0 MiB every optimizer "
                                 "step"), str(error)


def test_a_fit_that_varies_from_run_to_run_is_said_so_not_a_need_under_the_budget() -> None:
    from autotune.api.nothing_fits import nothing_fits
    from autotune.config import MemoryProbe, ProbeStep
    from autotune.device import describe_device
    from autotune.names import FLAGS

    usable = 60 * MIB
    probe = MemoryProbe(knobs=FP32, max_micro_batch=0, peak_bytes=None, budget_bytes=usable,
                        usable_bytes=usable, candidates=(1,), steps=(ProbeStep(
                            micro_batch=1, status="ok", peak_bytes=62 * MIB, fits=False),))
    error = nothing_fits(TINY, describe_device("cpu"), _budget(usable), probe,  # type: ignore[arg-type]
                         None, uncapped=TrialResult(status="ok", peak_bytes=55 * MIB),
                         name=FLAGS)
    assert error.exit_code == 1
    assert str(error) == (
        "micro-batch 1 (fp32/off) did not fit in 60.00 MiB usable in one run (62.00 MiB) and "
        "fit in another without the cap (peak 55.00 MiB): its memory varies from run to run at "
        "the edge of the budget. Give a little more --memory-budget, or a smaller --headroom, "
        "so that every run fits")


def _budget(usable: int) -> object:
    from autotune.api.request import Budget

    return Budget(budget_bytes=usable, usable_bytes=usable, headroom=0.0)


@pytest.mark.parametrize(("status", "fits", "verdict"), [
    ("ok", True, "fits"), ("ok", False, "does not fit"), ("oom", False, "does not fit"),
    ("crash", False, "no memory verdict"), ("timeout", False, "no memory verdict"),
    ("non_finite", False, "no memory verdict"),
])
def test_a_probes_progress_line_says_does_not_fit_only_of_memory(status: str, fits: bool,
                                                                 verdict: str) -> None:
    from autotune.config import ProbeStep
    from autotune.report_progress import probe_step_line

    line = probe_step_line("fp32/off", ProbeStep(micro_batch=1, status=status,  # type: ignore[arg-type]
                                                 peak_bytes=None, fits=fits, wall_s=2.0))
    assert line.endswith(f"  {verdict}, 2.0 s"), line


@pytest.mark.parametrize(("status", "peak_mib", "largest"), [
    ("ok", 95.0, 4),  # a timed run over the 90 MiB usable: the next fit down
    ("oom", None, 4),  # out of memory at the fit: the same
])
def test_a_timed_run_over_the_budget_at_the_fit_refutes_it(status: str, peak_mib: float | None,
                                                           largest: int) -> None:
    # The probe fit 8 (its run 80 MiB); a timed run there went over: peaks vary from run to
    # run and the larger counts, so 8 no longer fits and 4 is the largest fit.
    from autotune.memory import refuted

    ran: list[int] = []
    probe = probe_memory(WorkloadSpec(), "cpu", FP32, (1, 2, 4, 8, 16),
                         run=_scripted(lambda m: 10 * m, 100, ran), budget_bytes=100 * MIB,
                         usable_bytes=90 * MIB, timeout_s=60.0, hint=8)
    assert probe.max_micro_batch == 8
    over = TrialResult(status=status, peak_bytes=int(peak_mib * MIB) if peak_mib else None,
                       step_times_s=(0.1,) * 3 if status == "ok" else ())
    lower = refuted(probe, over, 90 * MIB)
    assert lower is not None and lower.max_micro_batch == largest
    assert 8 not in lower.fitting() and lower.fitting()[-1] == largest
    assert lower.notes[-1].startswith("micro-batch 8 does not fit after all: its timed run ")
    # a run that fit, or failed in a way memory does not explain, refutes nothing
    fit = TrialResult(status="ok", peak_bytes=85 * MIB, step_times_s=(0.1,) * 3)
    assert refuted(probe, fit, 90 * MIB) is None
    assert refuted(probe, TrialResult(status="hang"), 90 * MIB) is None
    # nothing below: fits nothing
    one = refuted(lower, over, 90 * MIB)
    while one is not None and one.max_micro_batch:
        one = refuted(one, over, 90 * MIB)
    assert one is not None and one.max_micro_batch == 0 and one.peak_bytes is None
