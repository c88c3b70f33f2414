"""``autotune estimate`` and ``check`` for people: the step's memory at its peak and what
fits (issue 5). No torch import here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.estimate.fits import EstimateReport


def estimate_lines(report: EstimateReport) -> list[str]:
    """The estimate as lines for people: breakdown at the peak, then what fits."""
    step = report.estimate
    kernels = ("cuda: fused attention, an optimizer left to choose as foreach; --device cpu "
               "for a CPU's" if step.kernels == "cuda" else
               "cpu: what a CPU runs, as traced; --device cuda for a GPU's")
    strategy = step.knobs.strategy
    rank = (f", per rank of {step.world_size} ({strategy})" if strategy != "none" else "")
    where = (f" for {report.device} ({'--device' if report.device_given else 'this machine'})"
             if report.device else "")  # whose memory --device-memory is
    lines = [
        f"{report.workload_name}: micro-batch {step.micro_batch}{where}, {step.knobs.label()} "
        f"traced eager{rank} ({step.num_parameters / 1e6:.1f}M parameters; fake-tensor trace "
        f"of the training step, 2 accumulated micro-batches + optimizer step, "
        f"{step.trace_s:.1f} s)",
        f"kernels modelled: {kernels}",
    ]
    grads = "grads + buckets" if strategy.startswith("ddp") else "gradients"
    rows = [("parameters", step.parameters_bytes), (grads, step.gradients_bytes),
            ("optimizer state", step.optimizer_bytes), ("activations", step.activations_bytes),
            ("temporaries", step.temporaries_bytes), ("inputs", step.inputs_bytes)]
    if report.calibration is not None:
        rows.append(("measured beyond", report.peak_bytes() - step.peak_bytes))
    lines += [f"  {name:<16}{format_bytes(value):>12}" for name, value in rows]
    lines.append(f"  {'peak':<16}{format_bytes(report.peak_bytes()):>12}  "
                 f"(during {step.peak_phase})")
    budget = (f"{report.device or 'device'} memory {format_bytes(report.device_memory_bytes)} - "
              f"{report.headroom:.0%} headroom = {format_bytes(report.usable_bytes)} usable")
    verdict = "fits" if report.fits() else (
        f"does NOT fit (over by "
        f"{format_bytes(report.peak_bytes() - report.usable_bytes)})")
    lines.append(f"{budget}: micro-batch {step.micro_batch} {verdict}")
    if report.max_micro_batch:
        per_device = (report.target_batch or 0) // report.world_size
        peak = f"peak {format_bytes(report.max_peak_bytes)}"
        lines.append(f"largest micro-batch that fits: {report.max_micro_batch}, " + (
            f"a divisor of the per-device batch {per_device}, {peak}" if report.target_batch
            else f"{peak}; --target-batch lists the divisors of yours that fit"))
        if (report.any_max_micro_batch or 0) > report.max_micro_batch:
            lines.append(f"the largest of any size is {report.any_max_micro_batch}: not a "
                         f"divisor of {per_device}, so no accumulation makes the target batch "
                         "exactly")
    else:
        lines.append("no micro-batch fits, not even 1")
    if report.target_batch is not None:
        pairs = ", ".join(f"{m} x {a}" for m, a in report.pairs) or "none"
        lines.append(f"target batch {report.target_batch} (world size {report.world_size}): "
                     f"micro_batch x accumulate_steps that fit: {pairs}")
    lines += [f"note: {note}" for note in report.notes]
    return lines
