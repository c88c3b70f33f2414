"""trial: the one training step and its checks, in this process (no child processes)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from autotune.config import TrialResult, TrialSpec, WorkloadSpec
from autotune.errors import WorkloadError
from autotune.timing import MIN_STEPS_TO_STOP
from autotune.trial import classify_exception, is_out_of_memory, run_trial, train_step
from autotune.user_code import check_loss, check_model, user_traceback
from autotune.workload import Workload
from tests.conftest import workload_target
from tests.workloads import WideMLP, _batch


def _step(loss: Callable[[nn.Module, Any], Any]) -> torch.Tensor:
    workload = Workload(name="w", build_model=WideMLP, make_batch=_batch, loss=loss)
    model = workload.build_model()
    return train_step(model, workload.make_optimizer(model.parameters()),
                      [_batch(1), _batch(1)], workload, precision="fp32", device_type="cpu")


@pytest.mark.parametrize(("loss", "says"), [
    (lambda model, batch: 0.5, "loss returned float 0.5; it must return a scalar torch.Tensor"),
    (lambda model, batch: model(*batch).reshape(1, 1).expand(4, 1),
     "loss returned a tensor of shape (4, 1); it must be a scalar: reduce it, e.g. .mean()"),
    (lambda model, batch: (model(*batch) * 100).long(),
     "loss returned a tensor of dtype torch.int64; it must be floating point"),
    (lambda model, batch: model(*batch).detach(),
     "loss returned a tensor that does not require grad"),
    (lambda model, batch: None, "loss returned NoneType; it must return a scalar torch.Tensor"),
], ids=["float", "vector", "integer", "no-grad", "none"])
def test_train_step_names_a_loss_that_is_not_a_scalar_float_tensor_with_grad(
        loss: Callable[[nn.Module, Any], Any], says: str) -> None:
    with pytest.raises(WorkloadError) as info:
        _step(loss)
    assert says in str(info.value)
    assert classify_exception(info.value) == "workload_error"


class _TakesOne(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _RaisesInside(_TakesOne):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + len(y.shape, 1)  # type: ignore[call-arg]  # the model's bug


def test_the_default_loss_says_what_the_model_took_and_returned() -> None:
    """A plain module without ``loss=``: a raw TypeError once; now what the default loss
    called, what the model took or returned, and how to pass ``loss``."""
    workload = Workload(name="plain", build_model=_TakesOne, make_batch=_batch)
    pair, one = (torch.randn(2, 8), torch.randn(2, 8)), torch.randn(2, 8)
    for model in (_TakesOne(), torch.compile(_TakesOne())):
        with pytest.raises(WorkloadError, match=(
                r"workload 'plain': the default loss calls model\(\*batch\), and _TakesOne."
                r"forward does not take that batch \(.*takes 2 positional arguments but 3 were "
                r"given\); pass loss=lambda model, batch: \.\.\.")) as info:
            workload.compute_loss(model, pair)
        assert classify_exception(info.value) == "workload_error"
    with pytest.raises(WorkloadError, match=(
            r"the default loss is model\(batch\)\.loss, and the model returned Tensor, which "
            r"has no \.loss; pass loss=lambda model, batch")):
        workload.compute_loss(_TakesOne(), one)
    with pytest.raises(TypeError, match="len"):  # the model's own TypeError stays its own
        workload.compute_loss(_RaisesInside(), pair)


def test_a_right_loss_steps() -> None:
    loss = _step(lambda model, batch: model(*batch))
    assert loss.shape == () and torch.isfinite(loss)


def test_the_loss_check_reads_no_values() -> None:
    # Meta tensors have no data: any read (a sync on a device) would raise here.
    check_loss(torch.ones((), device="meta", requires_grad=True), "w")
    with pytest.raises(WorkloadError, match=r"shape \(4, 1\)"):
        check_loss(torch.ones(4, 1, device="meta", requires_grad=True), "w")


def test_check_model() -> None:
    with pytest.raises(WorkloadError, match="build_model returned dict; it must return a torch"):
        check_model({"up": nn.Linear(2, 2)}, "w")
    with pytest.raises(WorkloadError, match="all 4 of its parameter tensors are frozen"):
        check_model(WideMLP().requires_grad_(False), "w")
    with pytest.raises(WorkloadError, match="it has no parameters"):
        check_model(nn.ReLU(), "w")
    check_model(WideMLP(), "w")


def _user_code_fails() -> None:
    nn.functional.linear(torch.ones(2, 3), torch.ones(4, 5))  # shapes do not match


def test_user_traceback_keeps_only_the_workloads_frames() -> None:
    with pytest.raises(RuntimeError) as info:
        _user_code_fails()
    text = user_traceback(info.value)
    assert text.startswith("Traceback (the workload's frames")
    assert "in _user_code_fails" in text and "nn.functional.linear" in text
    assert "/torch/" not in text and "/autotune/" not in text
    wrapped = WorkloadError("factory raised")
    wrapped.__cause__ = info.value
    assert user_traceback(wrapped) == text  # a WorkloadError shows what it wraps


def test_user_traceback_keeps_the_last_frames_of_a_deep_one() -> None:
    def recurse(depth: int) -> None:
        if depth == 0:
            raise ValueError("deep")
        recurse(depth - 1)

    with pytest.raises(ValueError) as info:
        recurse(30)
    lines = user_traceback(info.value).splitlines()
    assert len(lines) <= 15
    assert "earlier frames" in lines[1] and 'raise ValueError("deep")' in lines[-1]


def test_sys_exit_is_a_workload_error() -> None:
    exc = SystemExit(3)
    assert classify_exception(exc) == "workload_error"
    assert str(WorkloadError.from_exit(exc)) == "the workload called sys.exit(3)"
    assert str(WorkloadError.from_exit(SystemExit())) == "the workload called sys.exit()"
    assert str(WorkloadError.from_exit(SystemExit("bye"))) == (
        "the workload called sys.exit('bye')")


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




# ----------------------------------------------------------------------------------------------
# How long a real run times (in this process, uncapped: run_trial without a child).


def _timed(**fields: Any) -> TrialResult:
    spec = TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target("tiny")),
                     device="cpu", micro_batch=2, **{"accumulate_steps": 2, **fields})
    result = run_trial(spec)
    assert result.status == "ok", result.message
    return result


def test_a_run_times_until_its_median_is_known_then_stops() -> None:
    # Any spread is within a precision of 1000%: three steps, the fewest a spread needs.
    precise = _timed(num_timed_steps=50, timing_precision=10.0)
    assert (len(precise.step_times_s), precise.timing_stop) == (MIN_STEPS_TO_STOP, "precise")
    # No precision asked: every step.
    full = _timed(num_timed_steps=5)
    assert (len(full.step_times_s), full.timing_stop) == (5, "steps")
    # Behind a leader whose steps took no time at all: three steps, then stopped.
    behind = _timed(num_timed_steps=50, stop_above_step_s=1e-9)
    assert (len(behind.step_times_s), behind.timing_stop) == (MIN_STEPS_TO_STOP, "behind")
    # A memory probe times nothing.
    probe = _timed(num_timed_steps=0)
    assert probe.step_times_s == () and probe.timing_stop == ""


def test_each_step_is_split_into_its_micro_batches_and_its_update() -> None:
    result = _timed(num_timed_steps=4, accumulate_steps=3)
    assert len(result.update_times_s) == len(result.step_times_s) == 4
    assert all(0 < u < t for u, t in zip(result.update_times_s, result.step_times_s,
                                         strict=True))


def test_a_probe_warms_up_on_two_micro_batches_and_times_the_configs_accumulation() -> None:
    # FLOPs are counted on the first warm-up step and scaled to the timed step's micro-batches:
    # a warm-up of 2 then steps of 6 counts what a warm-up of 6 does.
    short = _timed(num_timed_steps=2, accumulate_steps=6, warmup_accumulate_steps=2,
                   count_flops=True)
    full = _timed(num_timed_steps=2, accumulate_steps=6, count_flops=True)
    assert short.flops_per_step and short.flops_per_step == full.flops_per_step
    assert short.samples_per_step == full.samples_per_step == 2 * 6
    assert short.num_optimizer_steps == full.num_optimizer_steps == 2 + 2


def test_an_allocators_out_of_memory_is_said_in_one_clause_with_its_size() -> None:
    # The CPU allocator's own error, raised for real: three lines of source location and
    # error code in a probe's progress line before; one clause now, the size it asked for.
    from autotune.oom_text import oom_clause
    from autotune.trial import _failed

    try:
        torch.empty(2**60, dtype=torch.uint8)
    except RuntimeError as exc:
        raised: BaseException = exc
    result = _failed(classify_exception(raised), raised, {})
    assert result.status == "oom"
    assert result.message == ("out of memory: the CPU allocator could not allocate "
                              "1073741824.00 GiB more")
    # CUDA's, as torch words it (from 2.1): the size asked for and what was free.
    cuda = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 "
        "GiB of which 1.58 GiB is free. Process 2493055 has 12.02 GiB memory in use. Of the "
        "allocated memory 734.07 MiB is allocated by PyTorch, and 33.93 MiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert oom_clause(cuda) == ("CUDA out of memory: could not allocate 1.95 GiB more, "
                                "1.58 GiB free of 14.57 GiB")
    # A workload's own error that mimics the allocator with a number no size_t holds is said
    # as raised (its size would overflow a float).
    mimic = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                         f"{10**400} bytes")
    assert oom_clause(mimic) is None
    assert _failed("oom", mimic, {}).message == f"RuntimeError: {mimic}"
    # Another out-of-memory error, or another error, is said as raised.
    assert oom_clause(MemoryError()) is None
    other = _failed("oom", RuntimeError("std::bad_alloc"), {})
    assert other.message == "RuntimeError: std::bad_alloc"
