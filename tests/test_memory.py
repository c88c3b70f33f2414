"""memory.probe_memory finds the true largest micro-batch under a real cap, in few probes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from autotune.config import MIB, Knobs, ProbeStep, TrialResult, TrialSpec, WorkloadSpec
from autotune.memory import _fit_line, _next_probe, probe_memory, probe_spec
from autotune.runner import run_isolated
from autotune.space import divisors
from tests.conftest import workload_target

TINY = WorkloadSpec(kind="file", target=workload_target("tiny"))
FP32 = Knobs(precision="fp32", compile_mode="off")
CANDIDATES = divisors(12)  # 1, 2, 3, 4, 6, 12
BOUNDARY = 4  # the usable budget is put between the peaks of 4 and 6


def test_children_run_with_the_repeatable_cpu_allocator() -> None:
    """Without it the peak of one micro-batch moves between runs by more than a sample's worth
    (DESIGN.md section 4), and brute force would not be a truth."""
    from autotune.runner import CPU_ALLOCATOR, allocator_notes, child_environment

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
    assert any(s.micro_batch == 6 and not s.fits for s in probe.steps)  # the boundary confirmed


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


# ----------------------------------------------------------------------------------------------
# The search's arithmetic on synthetic probes (no processes).


def _step(micro_batch: int, peak: int | None, fits: bool, status: str = "ok") -> ProbeStep:
    return ProbeStep(micro_batch=micro_batch, status=status, peak_bytes=peak,  # type: ignore
                     fits=fits)


def test_fit_line() -> None:
    slope, intercept = _fit_line({1: 110, 3: 130, 5: 150})
    assert slope == pytest.approx(10)
    assert intercept == pytest.approx(100)


def test_line_predicts_the_largest_fitting() -> None:
    steps = [_step(48, None, False, "oom"), _step(1, 110, True), _step(6, 160, True)]
    between = [8, 12, 16, 24]
    # peak = 100 + 10 * m: 16 -> 260 fits in 265, 24 -> 340 does not.
    assert _next_probe(between, steps, 6, 48, 265, None) == 16
    assert _next_probe(between, steps, 6, 48, 1000, None) == 24


def test_line_predicting_nothing_confirms_just_above_lo() -> None:
    steps = [_step(48, None, False, "oom"), _step(1, 110, True), _step(6, 160, True)]
    assert _next_probe([8, 12, 16, 24], steps, 6, 48, 170, None) == 8


def test_non_increasing_line_tries_the_largest() -> None:
    steps = [_step(1, 200, True), _step(4, 150, True)]
    assert _next_probe([6, 8, 12], steps, 4, float("inf"), 1000, None) == 12


def test_nothing_fits_yet_tries_the_smallest() -> None:
    steps = [_step(48, None, False, "oom")]
    assert _next_probe([1, 2, 3, 4, 6], steps, 0, 48, 1000, None) == 1


def test_one_point_bisects_in_log_space() -> None:
    steps = [_step(16, None, False, "oom"), _step(1, 110, True)]
    assert _next_probe([2, 4, 8], steps, 1, 16, 1000, None) == 4


def test_hint_neighbours() -> None:
    between_up, between_down = [12, 24], [1, 2, 3, 4, 6]
    assert _next_probe(between_up, [_step(8, 100, True)], 8, float("inf"), 1000, 8) == 12
    assert _next_probe(between_down, [_step(8, None, False, "oom")], 0, 8, 1000, 8) == 6
