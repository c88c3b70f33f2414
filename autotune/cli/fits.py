"""``autotune estimate`` and ``check``: what fits without a search (issue 5): a step's memory
estimated without a GPU, and whether a tuned config still fits its device.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from autotune.cli.options import (
    HeadroomOpt,
    JsonOpt,
    ModelOpt,
    SeqLenOpt,
    TimeoutOpt,
    WorkloadOpt,
    WorldOpt,
    seconds,
)
from autotune.cli.output import err, exits, out
from autotune.knobs import Knobs
from autotune.names import FLAGS
from autotune.units import MAX_BATCH


class PrecisionChoice(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class KernelsChoice(str, Enum):
    cuda = "cuda"
    cpu = "cpu"


def estimate(
    micro_batch: Annotated[int, typer.Option(
        "--micro-batch", min=1, max=MAX_BATCH, help="Micro-batch.")] = 8,
    device_memory: Annotated[str, typer.Option(
        "--device-memory", help="The device's memory, e.g. 24GiB or 80GB.")] = "24GiB",
    precision: Annotated[PrecisionChoice, typer.Option("--precision")] = PrecisionChoice.fp32,
    checkpointing: Annotated[str, typer.Option(
        "--checkpointing", help="off, blocks or alternate: trace the step checkpointed "
        "(budget-0.5, the compiler's recompute, is traced as off, and said so).")] = "off",
    strategy: Annotated[str, typer.Option(
        "--strategy", help="none, ddp, ddp-bucket-view, fsdp or fsdp-no-reshard: trace one rank "
        "of a --world-size job (a fake process group in one process).")] = "none",
    optimizer_impl: Annotated[str, typer.Option(
        "--optimizer-impl", help="default, for-loop, foreach or fused.")] = "default",
    memory_format: Annotated[str, typer.Option(
        "--memory-format", help="contiguous or channels_last.")] = "contiguous",
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = 0.1,
    target_batch: Annotated[Optional[int], typer.Option(
        "--target-batch", min=1, max=MAX_BATCH,
        help="List the (micro-batch, accumulation) pairs that fit.")
    ] = None,
    world_size: WorldOpt = 1,
    device: Annotated[Optional[str], typer.Option(
        "--device", help="The device the estimate is for (it need not be here): cpu, cuda or "
        "cuda:N; its kernels are modelled. Default: cuda when this machine has it, else cpu.")
    ] = None,
    kernels: Annotated[Optional[KernelsChoice], typer.Option(
        "--kernels", help="Whose kernels to model: cuda (fused attention) or cpu. Default: "
        "--device's.")] = None,
    timeout: TimeoutOpt = "10m",
    json_out: JsonOpt = False,
) -> None:
    """Estimate one training step's memory without a GPU or weights, and what fits: exit 0
    when --micro-batch fits, 1 when it does not, 2 on bad input or a broken workload."""
    with exits():
        from autotune import api, report, report_estimate

        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len, name=FLAGS)
        with err.status(Text("tracing the training step under fake tensors...")):
            result = api.estimate(
                spec, micro_batch=micro_batch, device_memory=device_memory,
                knobs=Knobs.checked(precision=precision.value, checkpointing=checkpointing,
                                    optimizer_impl=optimizer_impl, memory_format=memory_format,
                                    strategy=strategy),
                headroom=headroom, target_batch=target_batch, world_size=world_size,
                kernels=kernels.value if kernels else None, device=device,
                any_micro_batch=True, timeout_s=seconds(timeout, "--timeout"), name=FLAGS)
        if json_out:
            print(report.to_json(result))
        else:
            for line in report_estimate.estimate_lines(result):
                out.print(line, highlight=False)
        if not result.fits():
            raise typer.Exit(1)


def check(
    path: Annotated[Path, typer.Argument(help="The autotune.json to check.")] = Path(
        "autotune.json"),
    measure: Annotated[Optional[bool], typer.Option(
        "--measure/--estimate",
        help="Run a real short step on the GPU, or use the fake-tensor estimator "
             "(default: measure when a CUDA device is here, else estimate).")] = None,
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="Use this path/to/file.py:factory instead of the one in the file "
                           "(e.g. after moving it).")] = None,
    timeout: TimeoutOpt = "10m",
    memory_budget: Annotated[Optional[str], typer.Option(
        "--memory-budget", "--device-memory",
        help="Check against this memory instead of the file's budget, e.g. 16GiB or 50% of "
             "the device it was tuned on (at most that device's memory): does it fit a "
             "smaller device?")] = None,
) -> None:
    """Exit 0 if the tuned config still fits its device memory (or --memory-budget), 1 if
    not, 2 on bad input or a broken workload."""
    with exits():
        from autotune import api

        spec = api.workload_spec(workload=workload, name=FLAGS) if workload is not None else None
        with err.status(Text("checking the tuned config's memory...")):
            result = api.check(path, measure=measure, workload=spec,
                               timeout_s=seconds(timeout, "--timeout"),
                               memory_budget=memory_budget, name=FLAGS)
        out.print(result.message, highlight=False, markup=False)
        if not result.fits:
            raise typer.Exit(1)

