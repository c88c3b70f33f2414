"""A memory probe's descent run at once (issue 60, ``memory.probe_steps``'s ``ahead``): where
nothing has fit and the next micro-batch lies below every failure, the open ones under it run
as one fan on the free slots; the boundary found is the one a run at a time finds. No
processes: each run's peak is scripted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.config import Knobs, MemoryProbe, TrialResult, TrialSpec, WorkloadSpec
from autotune.memory import drive, probe_memory, probe_spec, probe_steps
from autotune.space import divisors
from autotune.units import MIB
from tests.conftest import workload_target

TINY = WorkloadSpec(kind="file", target=workload_target("tiny"))
FP32 = Knobs(precision="fp32", compile_mode="off")


def _run(peak_mib: Callable[[int], float], cap_mib: float) -> Callable[[TrialSpec], TrialResult]:
    """A run whose peak is ``peak_mib(micro_batch)``: out of memory over ``cap_mib``."""

    def run(spec: TrialSpec) -> TrialResult:
        peak = int(peak_mib(spec.micro_batch) * MIB)
        if peak > cap_mib * MIB:
            return TrialResult(status="oom", message="out of memory", wall_s=1.0)
        return TrialResult(status="ok", peak_bytes=peak, step_times_s=(), wall_s=1.0)

    return run


def _rounds(peak_mib: Callable[[int], float], cap_mib: float, usable_mib: float,
            candidates: tuple[int, ...], hint: int | None, ahead: int,
            **options: Any) -> tuple[MemoryProbe, list[list[int]], list[list[bool]]]:
    """The probe driven round by round: what it found, each round's micro-batches (a fan's
    together) and whether each was made a run that may be the largest fit (timed)."""
    run = _run(peak_mib, cap_mib)
    rounds: list[list[int]] = []
    timed: list[list[bool]] = []

    def spec(micro_batch: int, largest: bool) -> TrialSpec:
        return probe_spec(TINY, "cpu", FP32, micro_batch, int(cap_mib * MIB), 60.0,
                          num_timed_steps=1 if largest else 0)

    steps = probe_steps(TINY, "cpu", FP32, candidates, budget_bytes=int(cap_mib * MIB),
                        usable_bytes=int(usable_mib * MIB), hint=hint, make_spec=spec,
                        ahead=ahead, **options)

    def each(step: TrialSpec | tuple[TrialSpec, ...]) -> Any:
        fan = step if isinstance(step, tuple) else (step,)
        rounds.append([s.micro_batch for s in fan])
        timed.append([s.num_timed_steps > 0 for s in fan])
        results = tuple(run(s) for s in fan)
        return results if isinstance(step, tuple) else results[0]

    try:
        step = next(steps)
        while True:
            step = steps.send(each(step))
    except StopIteration as done:
        return done.value, rounds, timed


def test_out_of_memory_everywhere_below_the_hint_runs_the_same_runs_in_fewer_rounds() -> None:
    # 16 fails at the hint; one at a time 8 next, then 1 (is anything feasible?), each
    # failing. With slots to spare 8 and 1 run at once, each timed (each may be the
    # boundary): the same three runs in two rounds, and nothing fits either way.
    def peak(m: int) -> float:
        return 5000 + m

    probe, rounds, timed = _rounds(peak, 350, 320, divisors(16), 16, 4)
    assert rounds == [[16], [8, 1]] and timed[1] == [True, True]
    one, serial, _ = _rounds(peak, 350, 320, divisors(16), 16, 1)
    assert serial == [[16], [8], [1]]
    assert probe.max_micro_batch == one.max_micro_batch == 0


def test_a_fit_in_the_fan_hands_the_search_back_to_one_run_at_a_time() -> None:
    # 1 and 2 fit: 8 and 1 run at once, 1 fits, and the bisection between goes on one run
    # at a time as it would (4, then 2): four rounds where one at a time takes five.
    probe, rounds, _ = _rounds(lambda m: 100 + 100 * m, 350, 320, divisors(16), 16, 4)
    assert rounds == [[16], [8, 1], [4], [2]]
    one, serial, _ = _rounds(lambda m: 100 + 100 * m, 350, 320, divisors(16), 16, 1)
    assert serial == [[16], [8], [1], [4], [2]]
    assert probe.max_micro_batch == one.max_micro_batch == 2


def test_no_fan_before_a_failure_or_once_something_fits() -> None:
    # The first run (the hint) is alone; a probe whose hint fits goes up one at a time.
    _, rounds, _ = _rounds(lambda m: 100 + 10 * m, 1000, 900, divisors(64), 8, 4)
    assert all(len(r) == 1 for r in rounds)


@pytest.mark.parametrize(("answer", "fan"), [(None, [16, 1]), ("it cannot win", [16])])
def test_a_reason_not_to_go_below_keeps_a_run_out_of_the_fan(answer: str | None,
                                                              fan: list[int]) -> None:
    # 32 ran over the usable budget (a peak to reason on); were 16 to fail, 1 would be next,
    # and a bound asked about it may keep it out (it is asked again, one at a time, should
    # 16 fail).
    asked: list[tuple[int, int]] = []

    def stop_below(over: int, below: int) -> str | None:
        asked.append((over, below))
        return answer if below == 1 else None

    probe, rounds, _ = _rounds(lambda m: 100 + 28 * m, 1000, 800, divisors(64), 32, 4,
                               stop_below=stop_below)
    assert rounds[:2] == [[32], fan]
    assert asked[:2] == [(32, 16), (32, 1)]
    assert probe.max_micro_batch == 16


def test_one_at_a_time_a_fan_s_runs_go_in_order() -> None:
    # ``drive`` (one slot, or the api's probe) runs a fan's specs one after another.
    ran: list[int] = []

    def run(spec: TrialSpec) -> TrialResult:
        ran.append(spec.micro_batch)
        return _run(lambda m: 100 + 100 * m, 350)(spec)

    probe = drive(probe_steps(TINY, "cpu", FP32, divisors(16), budget_bytes=350 * MIB,
                              usable_bytes=320 * MIB, hint=16, ahead=3), run)
    assert ran == [16, 8, 1, 4, 2] and probe.max_micro_batch == 2
    assert probe_memory(TINY, "cpu", FP32, divisors(16), budget_bytes=350 * MIB,
                        usable_bytes=320 * MIB, hint=16, run=run).max_micro_batch == 2


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 96), st.integers(0, 500), st.integers(1, 200), st.integers(50, 3000),
       st.floats(0.7, 1.0), st.integers(2, 8), st.data())
def test_any_fan_finds_the_boundary_one_run_at_a_time_finds(
        batch: int, base: int, per_sample: int, cap: int, usable_share: float, ahead: int,
        data: st.DataObject) -> None:
    # Peaks grow with the micro-batch: the boundary is the same whatever the fan's width,
    # never in more rounds, a fan only ever follows a failure with nothing fit yet, and its
    # runs up to its first fit are the runs one at a time makes.
    candidates = tuple(divisors(batch))
    hint = data.draw(st.sampled_from((None, *candidates)))

    def peak(m: int) -> float:
        return base + per_sample * m

    one, serial, _ = _rounds(peak, cap, cap * usable_share, candidates, hint, 1)
    fanned, rounds, _ = _rounds(peak, cap, cap * usable_share, candidates, hint, ahead)
    assert fanned.max_micro_batch == one.max_micro_batch
    assert fanned.peak_bytes == one.peak_bytes
    assert len(rounds) <= len(serial)
    assert all(len(r) <= ahead for r in rounds)
    seen: list[int] = []
    for r in rounds:
        if len(r) > 1:
            assert r == sorted(r, reverse=True)
            fit = [m for m in seen if peak(m) <= cap * usable_share and peak(m) <= cap]
            assert not fit and seen and max(r) < min(seen)
        seen += r
    fits_at = [m for r in rounds for m in r if peak(m) <= cap * usable_share and peak(m) <= cap]
    made = [m for r in rounds for m in r]
    assert set(made) >= {m for r in serial for m in r}
    assert len(made) <= len(serial) + len([r for r in rounds if len(r) > 1])
    assert not fits_at or one.max_micro_batch in fits_at


def test_floor_first_tries_the_smallest_after_a_failure_at_the_hint() -> None:
    # A compile's floor over the cap at every micro-batch: after 16, the smallest settles
    # it, one run where the one below and then the smallest are two (one slot or a fan).
    def floor(m: int) -> float:
        return 5000 + m

    for ahead in (1, 4):
        probe, rounds, _ = _rounds(floor, 350, 320, divisors(16), 16, ahead, floor_first=True)
        assert rounds == [[16], [1]] and probe.max_micro_batch == 0
    # Where the one below fits, the probe goes up from the smallest (two runs more).
    probe, rounds, _ = _rounds(lambda m: 100 + 20 * m, 350, 320, divisors(16), 16, 1,
                               floor_first=True)
    assert rounds == [[16], [1], [4], [8]] and probe.max_micro_batch == 8
    _, serial, _ = _rounds(lambda m: 100 + 20 * m, 350, 320, divisors(16), 16, 1)
    assert serial == [[16], [8]]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 96), st.integers(0, 500), st.integers(1, 200), st.integers(50, 3000),
       st.floats(0.7, 1.0), st.integers(1, 8), st.data())
def test_floor_first_finds_the_boundary_the_plain_probe_finds(
        batch: int, base: int, per_sample: int, cap: int, usable_share: float, ahead: int,
        data: st.DataObject) -> None:
    # Peaks grow with the micro-batch: floor-first changes the order of the runs, never the
    # boundary; where nothing fits below a failed hint, it makes two runs.
    candidates = tuple(divisors(batch))
    hint = data.draw(st.sampled_from(candidates))

    def peak(m: int) -> float:
        return base + per_sample * m

    plain, _, _ = _rounds(peak, cap, cap * usable_share, candidates, hint, ahead)
    floor, rounds, _ = _rounds(peak, cap, cap * usable_share, candidates, hint, ahead,
                               floor_first=True)
    assert floor.max_micro_batch == plain.max_micro_batch
    assert floor.peak_bytes == plain.peak_bytes
    if not plain.max_micro_batch and hint != candidates[0]:
        assert rounds == [[hint], [candidates[0]]]
