"""CUDA paths, on a real GPU (marker ``gpu``: skipped where no CUDA device is visible).

What CPU runs cannot show: the CUDA context counted in the peak, an OOM under the allocator's
per-process fraction, the CUDA-only precisions and CUDA-graph compile mode, and the CLI's
search and ``check --measure`` on the device. ``benchmarks/gpu.sh`` runs these first.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import Knobs, TrialSpec, WorkloadSpec
from autotune.runner import run_isolated
from autotune.units import GIB, MIB
from tests.conftest import workload_target

pytestmark = [pytest.mark.gpu, pytest.mark.subprocess]


def _spec(name: str, micro_batch: int, precision: str = "fp32", compile_mode: str = "off",
          **kwargs: object) -> TrialSpec:
    kwargs.setdefault("timeout_s", 600.0)
    knobs = Knobs(precision=precision, compile_mode=compile_mode)  # type: ignore[arg-type]
    return TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target(name)),
                     device="cuda:0", micro_batch=micro_batch, knobs=knobs,
                     **kwargs)  # type: ignore[arg-type]


def test_the_cuda_context_counts_in_the_peak() -> None:
    result = run_isolated(_spec("tiny", 4, num_warmup_steps=2, num_timed_steps=3,
                                memory_budget_bytes=8 * GIB))
    assert result.status == "ok", result.message
    # A CUDA context with cuBLAS loaded is hundreds of MiB; the tiny model's tensors are a few.
    assert result.context_bytes is not None and result.context_bytes > 64 * MIB, result
    assert result.peak_bytes is not None and result.peak_bytes > result.context_bytes
    assert len(result.step_times_s) == 3


def test_an_oom_under_the_budget_is_an_oom() -> None:
    # 2048 samples of 2 MiB hidden activations (and their gradients) are far over 1 GiB.
    result = run_isolated(_spec("tiny", 2048, memory_budget_bytes=1 * GIB))
    assert result.status == "oom", result.message
    # said in one clause (oom_text.oom_clause): what it could not allocate, and what was free
    assert result.message.startswith("CUDA out of memory: could not allocate "), result.message
    # The allocator stops at the budget less the context; the context may grow a little after.
    assert result.peak_bytes is not None and result.peak_bytes <= 1 * GIB + 64 * MIB, result


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_each_cuda_precision_trains(precision: str) -> None:
    result = run_isolated(_spec("tiny", 4, precision=precision, num_warmup_steps=2,
                                num_timed_steps=3))
    assert result.status == "ok", result.message
    assert result.first_loss is not None and result.reference_loss is not None
    assert abs(result.first_loss - result.reference_loss) <= 0.05 * abs(result.reference_loss)


def test_cuda_graphs_with_accumulation() -> None:
    result = run_isolated(_spec("tiny", 2, accumulate_steps=2, compile_mode="reduce-overhead",
                                num_warmup_steps=3, num_timed_steps=3))
    assert result.status == "ok", result.message
    assert result.num_graphs is not None and result.num_graphs > 0


def test_cuda_graphs_accumulate_the_gradients_one_big_batch_gives() -> None:
    """In process, the library's step on a ``reduce-overhead`` model (CUDA graph replays) over
    three micro-batches hands the optimizer one big eager batch's gradients, at every step
    (warm-up, recording and replays). Without the copy out of the graph's buffer torch raises
    ("accessing tensor output of CUDAGraphs that has been overwritten") or, older, loses the
    first micro-batch's gradients (pytorch/pytorch#169545)."""
    import torch

    from autotune import step
    from tests.one_truth import GradRecorder, full_batch_grads
    from tests.workloads import tiny

    torch.set_float32_matmul_precision("highest")  # no TF32: eager and inductor agree closely
    workload = tiny()
    torch.manual_seed(0)
    model = workload.build_model().to("cuda")
    batches = [tuple(t.to("cuda") for t in workload.make_batch(2)) for _ in range(3)]
    full = full_batch_grads(model, batches, workload.compute_loss)
    model.zero_grad(set_to_none=True)
    compiled = step.compile_model(model, "reduce-overhead")
    for i in range(5):
        recorder = GradRecorder(model)
        step.train_step(compiled, recorder, batches, workload, precision="fp32",
                        device_type="cuda", cuda_graphs=True)
        for name, grad in full.items():
            torch.testing.assert_close(recorder.grads[name], grad, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name, i=i: f"step {i}, {name}: {m}")


def test_search_then_check_on_the_gpu(tmp_path) -> None:
    runner = CliRunner()
    searched = runner.invoke(app, [
        "search", "--target-batch", "16", "--workload", workload_target("tiny"),
        "--device", "cuda", "--precisions", "fp32,bf16", "--compile-modes", "off",
        "--memory-budget", "4GiB", "--timed-steps", "3", "--out", str(tmp_path)])
    assert searched.exit_code == 0, searched.output
    config = json.loads((tmp_path / "autotune.json").read_text())
    assert config["device"]["device"] == "cuda:0"
    assert config["memory"]["peak_bytes"] > 64 * MIB  # the context counts
    checked = runner.invoke(app, ["check", str(tmp_path / "autotune.json"), "--measure"])
    assert checked.exit_code == 0, checked.output
