"""runner.run_isolated: every outcome is a value, from real child processes.

The children run in a pool of two (the trials are independent processes), once per module.
"""

from __future__ import annotations

import errno
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from autotune.config import MIB, TrialResult, TrialSpec, WorkloadSpec
from autotune.runner import run_isolated
from autotune.trial import classify_exception, is_out_of_memory
from tests.conftest import workload_target


def _spec(name: str, micro_batch: int = 1, **kwargs: object) -> TrialSpec:
    kwargs.setdefault("timeout_s", 300.0)
    return TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target(name)),
                     device="cpu", micro_batch=micro_batch, **kwargs)  # type: ignore[arg-type]


SPECS = {
    "ok": _spec("tiny", 2, num_warmup_steps=2, num_timed_steps=3,
                memory_budget_bytes=512 * MIB),
    # A window far longer than the steps it asks for: the tiny step takes ~40 ms alone and was
    # seen at 220 ms while the pool's other child ran, so 2 steps stay well under 1.5 s.
    "window": _spec("tiny", 2, num_warmup_steps=1, num_timed_steps=2, min_timed_s=1.5),
    "oom": _spec("tiny", 12, memory_budget_bytes=32 * MIB),  # needs about 85 MiB
    "oom_tiny_cap": _spec("tiny", 1, memory_budget_bytes=4 * MIB),
    "timeout": _spec("hang", timeout_s=8.0),
    "crash": _spec("crash"),
    "non_finite": _spec("nan_loss"),
    "bad_batch": _spec("bad_batch"),
    "wrong_rows": _spec("wrong_rows", 3),
    "raises": _spec("raises"),
    "not_a_workload": _spec("not_a_workload"),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrialResult]:
    names = sorted(SPECS, key=lambda n: n != "timeout")  # the 8 s hang first, beside the rest
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(names, pool.map(lambda n: run_isolated(SPECS[n]), names), strict=True))
    return done


def test_timing_goes_on_until_the_minimum_window(results: dict[str, TrialResult]) -> None:
    result = results["window"]
    assert result.status == "ok", result.message
    # 2 steps are far from 1.5 s, so it kept timing past the steps asked for.
    assert len(result.step_times_s) > 2
    assert sum(result.step_times_s) >= 1.45  # the window less the loop's own microseconds
    assert sum(result.step_times_s[:-1]) < 1.5  # and stopped once the window was full
    assert result.num_optimizer_steps == 1 + len(result.step_times_s)


def test_ok_has_positive_evidence(results: dict[str, TrialResult]) -> None:
    result = results["ok"]
    assert result.status == "ok", result.message
    assert result.ok
    assert len(result.step_times_s) == 3
    assert all(t > 0 for t in result.step_times_s)
    assert result.num_optimizer_steps == 2 + 3
    assert result.samples_per_step == 2 * 2
    assert result.peak_bytes is not None and 0 < result.peak_bytes <= 512 * MIB
    assert result.baseline_bytes and result.baseline_bytes > 0
    assert result.first_loss is not None and math.isfinite(result.first_loss)
    assert result.wall_s is not None and result.wall_s > 0
    assert result.num_graphs is None  # eager


def test_oom_under_a_real_cap(results: dict[str, TrialResult]) -> None:
    result = results["oom"]
    assert result.status == "oom", result.message
    # The cap limits the address space over the baseline: no measured peak can be above it.
    assert result.peak_bytes is not None and result.peak_bytes <= 32 * MIB


def test_oom_when_the_cap_is_tiny(results: dict[str, TrialResult]) -> None:
    # Even the optimizer's lazy imports must not fail under the cap as anything but an OOM.
    result = results["oom_tiny_cap"]
    assert result.status == "oom", result.message
    assert result.peak_bytes is not None and result.peak_bytes <= 4 * MIB


def test_timeout_kills_a_hanging_child(results: dict[str, TrialResult]) -> None:
    result = results["timeout"]
    assert result.status == "timeout", result.message
    assert "no result after 8 s" in result.message


def test_crash_names_the_signal(results: dict[str, TrialResult]) -> None:
    result = results["crash"]
    assert result.status == "crash", result.message
    assert "SIGKILL" in result.message
    assert result.peak_bytes is None


def test_non_finite_loss(results: dict[str, TrialResult]) -> None:
    result = results["non_finite"]
    assert result.status == "non_finite", result.message
    assert "loss became nan at optimizer step 1" in result.message
    assert result.first_loss is not None and math.isnan(result.first_loss)


@pytest.mark.parametrize(("name", "expected"), [
    ("bad_batch", "returned list; it must return a tensor"),
    ("wrong_rows", "its first dimension must be the micro-batch (3)"),
    ("raises", "ValueError: workload factory failed on purpose"),
    ("not_a_workload", "returned dict; it must return autotune.Workload"),
])
def test_workload_errors(results: dict[str, TrialResult], name: str, expected: str) -> None:
    result = results[name]
    assert result.status == "workload_error", result.message
    assert expected in result.message


def test_factory_error_carries_the_traceback(results: dict[str, TrialResult]) -> None:
    message = results["raises"].message
    assert "Traceback" in message
    assert "workloads.py" in message and "in raises" in message


# ----------------------------------------------------------------------------------------------
# is_out_of_memory: by type first, then the messages allocators raise.


def _raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise exc from inner
    except BaseException as outer:
        return outer


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    MemoryError(),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory:"
                 " you tried to allocate 4194304 bytes. Error code 12"),
    RuntimeError("could not create a primitive"),
    RuntimeError("std::bad_alloc"),
], ids=["torch-oom", "MemoryError", "ENOMEM", "cpu-allocator", "onednn", "bad_alloc"])
def test_is_out_of_memory(exc: BaseException) -> None:
    assert is_out_of_memory(exc)
    assert classify_exception(exc) == "oom"


def test_is_out_of_memory_follows_the_cause_chain() -> None:
    wrapped = _raised_from(ValueError("compile failed"), MemoryError())
    assert is_out_of_memory(wrapped)
    implicit = None
    try:
        try:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        except RuntimeError:
            raise KeyError("raised while handling the OOM")  # noqa: B904
    except KeyError as exc:
        implicit = exc
    assert is_out_of_memory(implicit)
    assert not is_out_of_memory(_raised_from(ValueError("outer"), KeyError("inner")))


@pytest.mark.parametrize("exc", [
    RuntimeError("shape mismatch: mat1 and mat2 shapes cannot be multiplied"),
    ValueError("out of memory"),  # right words, wrong type: not an allocator error
    OSError(errno.ENOENT, "No such file"),
    KeyError("x"),
], ids=["shape", "ValueError", "ENOENT", "KeyError"])
def test_is_not_out_of_memory(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)
    assert classify_exception(exc) != "oom"


@pytest.mark.slow
def test_compiled_trial_counts_its_graphs() -> None:
    result = run_isolated(_spec("tiny", 1, compile_mode="default", num_timed_steps=3))
    assert result.status == "ok", result.message
    assert result.num_graphs is not None and result.num_graphs > 0
    assert result.compile_s is not None and result.compile_s > 0
    assert len(result.step_times_s) == 3


@pytest.mark.slow
def test_a_graph_break_is_counted() -> None:
    result = run_isolated(_spec("graph_break", 1, compile_mode="default", num_timed_steps=2))
    assert result.status == "ok", result.message
    assert result.num_graph_breaks is not None and result.num_graph_breaks >= 1
    assert result.num_graphs is not None and result.num_graphs >= 1


def test_the_baseline_counts_model_flops_of_its_step() -> None:
    result = run_isolated(_spec("tiny", 2, accumulate_steps=3, num_warmup_steps=1,
                                num_timed_steps=1, count_flops=True))
    assert result.status == "ok", result.message
    rows = 2 * 3 * 128  # micro-batch x accumulation x sequence
    # up (8 -> 4096) and down (4096 -> 8): forward 2 matmuls, backward 3 (no input gradient).
    assert result.flops_per_step == 5 * 2 * rows * 8 * 4096
    plain = run_isolated(_spec("tiny", 2, num_warmup_steps=1, num_timed_steps=1))
    assert plain.status == "ok" and plain.flops_per_step is None


def test_one_run_is_the_probe_and_the_trial() -> None:
    # Warm-up accumulates 2 micro-batches (a probe's memory worst case), the timed steps the
    # config's 1: throughput and FLOPs are the config's, the loss guard compares like with like.
    result = run_isolated(_spec("tiny", 2, accumulate_steps=1, warmup_accumulate_steps=2,
                                num_warmup_steps=2, num_timed_steps=3, count_flops=True))
    assert result.status == "ok", result.message
    assert result.samples_per_step == 2
    assert result.num_optimizer_steps == 2 + 3
    assert result.flops_per_step == 5 * 2 * (2 * 128) * 8 * 4096  # one micro-batch of 2 rows
    assert result.reference_loss is not None
    assert result.first_loss == pytest.approx(result.reference_loss, rel=1e-5)
    # Its first step accumulated the same two micro-batches as a run of accumulation 2 (same
    # seed, same batches): the memory it measured is that step's.
    two = run_isolated(_spec("tiny", 2, accumulate_steps=2, num_warmup_steps=1,
                             num_timed_steps=1))
    one = run_isolated(_spec("tiny", 2, accumulate_steps=1, num_warmup_steps=1,
                             num_timed_steps=1))
    assert two.status == one.status == "ok", (two.message, one.message)
    assert result.first_loss == two.first_loss != one.first_loss


@pytest.mark.slow
def test_compile_threads_do_not_count_as_training_memory() -> None:
    # Inductor compiles CPU kernels on one thread per core; their stacks (8 MiB of address
    # space each) must land in the child's baseline, not in its measured peak.
    import os

    spec = _spec("tiny", 1, compile_mode="default", memory_budget_bytes=512 * MIB)
    peaks = {}
    for threads in ("1", "2"):
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = threads
        try:
            result = run_isolated(spec)
        finally:
            del os.environ["TORCHINDUCTOR_COMPILE_THREADS"]
        assert result.status == "ok", result.message
        peaks[threads] = result.peak_bytes or 0
    assert abs(peaks["2"] - peaks["1"]) < 4 * MIB, peaks
