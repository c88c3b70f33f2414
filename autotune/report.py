"""Tables and JSON for people and machines. No torch import here.

Text from the user's side (a workload's name, an error's message, a path) is never read as
Rich markup: every table title and cell here is a ``rich.text.Text`` (styled only by the style
given to it), and the lines are plain strings for a console with markup off
(``autotune.cli.plain_console``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from autotune.config import DeviceInfo, ProbeReport, ProbeStep, format_bytes, to_json_dict
from autotune.device import backend_for
from autotune.knobs import describe
from autotune.schema import SearchResult, TrialRecord, TunedConfig

if TYPE_CHECKING:
    from autotune.estimate import EstimateReport


def env_table(info: DeviceInfo) -> Table:
    """The device facts as a two-column table."""
    table = Table(title=_title("autotune env"), show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    rows = [
        ("device", info.device), ("name", info.name),
        ("total memory", format_bytes(info.total_memory_bytes)),
        ("available memory", format_bytes(info.available_memory_bytes)),
        ("precisions", ", ".join(backend_for(info.device).precisions(info))),
        ("native bf16", "yes" if info.native_bf16 else "no (emulated)"),
        ("compile modes", ", ".join(backend_for(info.device).compile_modes())),
        ("torch", info.torch_version), ("CUDA", info.cuda_version or "-"),
        ("compute capability", info.compute_capability or "-"),
    ]
    for key, value in rows:
        _add_row(table, key, value)
    for note in info.notes:
        _add_row(table, "note", note)
    return table


def probe_table(report: ProbeReport) -> Table:
    """One row per memory class: the largest micro-batch that fits and what it allows."""
    per_device = report.per_device_batch()
    table = Table(title=_title(
        f"Largest micro-batch that fits — {report.workload.label()} on {report.device.name} "
        f"({report.device.device}), target batch {report.target_batch}"
        + (f" over {report.world_size} devices" if report.world_size > 1 else "")))
    for name, justify in [("class", "left"), ("max micro", "right"), ("peak", "right"),
                          ("usable", "right"), ("margin", "right"),
                          ("micro x accumulate", "left"), ("probes", "right")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for probe in report.probes:
        pairs = report.pairs(probe)
        _add_row(
            table,
            probe.knobs.label(),
            str(probe.max_micro_batch) if probe.max_micro_batch else Text("none", style="red"),
            format_bytes(probe.peak_bytes),
            format_bytes(probe.usable_bytes),
            format_bytes(probe.margin_bytes()),
            " ".join(f"{m}x{per_device // m}" for m in reversed([m for m, _ in pairs])) or "-",
            str(probe.num_probes),
        )
    return table


def probe_footer(report: ProbeReport) -> list[str]:
    """Lines under the probe table: budget, cost, allocator and what was skipped."""
    num_probes = sum(p.num_probes for p in report.probes)
    brute = sum(len(p.candidates) for p in report.probes)
    lines = [
        f"budget {format_bytes(report.budget_bytes)}, headroom {report.headroom:.0%}; peak is "
        + ("max_memory_reserved + CUDA context" if report.device.is_cuda else
           "the child's address-space growth over its baseline (what the cap limits)"),
        f"{num_probes} probes in all ({brute} candidates; brute force would run each); "
        f"allocator: {report.allocator}",
    ]
    lines += [f"note: {s}" for s in report.skipped]
    for probe in report.probes:
        lines += [f"note ({probe.knobs.label()}): {n}" for n in probe.notes]
    return lines


def probe_step_line(label: str, step: ProbeStep) -> str:
    """One progress line for a finished probe."""
    verdict = "fits" if step.fits else "does not fit"
    seconds = f", {step.wall_s:.1f} s" if step.wall_s is not None else ""
    return (f"{label:<32} micro-batch {step.micro_batch:>5}: {step.status:<13} "
            f"peak {format_bytes(step.peak_bytes):>10}  {verdict}{seconds}")


def to_json(value: Any) -> str:
    """Any result dataclass as indented JSON."""
    return json.dumps(to_json_dict(value), indent=2)


def search_table(config: TunedConfig) -> Table:
    """Every trial: knobs, outcome, speed, memory and compile cost; the winner marked."""
    table = Table(title=_title(
        f"autotune search — {config.workload_name or config.workload.label()} on "
        f"{config.device.name} ({config.device.device}), target batch {config.target_batch}"))
    columns = [("#", "right"), ("knobs", "left"), ("micro x acc", "right"),
               ("status", "left"), ("ms/step", "right"), ("±", "right"), ("samples/s", "right"),
               ("tokens/s", "right"), ("peak", "right"), ("compile s", "right"),
               ("speedup", "right"), ("runs", "right")]
    flops = any(r.tflops_per_s for r in config.trials)
    mfu = any(r.mfu for r in config.trials)
    if flops:
        columns.append(("TFLOP/s", "right"))
    if mfu:
        columns.append(("MFU", "right"))
    if config.train_steps:
        columns.append((f"train {config.train_steps} steps s", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in config.trials:
        status = Text(r.verdict, style="bold green" if r.verdict == "winner" else "")
        if r.is_baseline:
            status.append(" (baseline)")
        row: list[str | Text] = [str(r.number), r.knobs.label(),
               f"{r.micro_batch}x{r.accumulate_steps}", status,
               _num(r.median_step_s, 1000, ".1f"), _num(r.halfwidth, 100, ".0f", "%"),
               _num(r.samples_per_s, 1, ",.1f"),
               _num(r.tokens_per_s, 1, ",.0f"), format_bytes(r.peak_bytes),
               _num(r.compile_s if r.knobs.compile_mode != "off" else None, 1, ".1f"),
               _num(r.speedup, 1, ".2f", "x"), str(r.num_runs)]
        if flops:
            row.append(_num(r.tflops_per_s, 1, ".3g"))
        if mfu:
            row.append(_num(r.mfu, 100, ".1f", "%"))
        if config.train_steps:
            row.append(_num(r.time_to_train_s, 1, ",.1f"))
        _add_row(table, *row, style="bold" if r.verdict == "winner" else None)
    return table


def _title(text: str) -> Text:
    """A table's title, printed as typed (never read as markup)."""
    return Text(text, style="table.title")


def _add_row(table: Table, *cells: str | Text, style: str | None = None) -> None:
    """A row whose cells print as typed: each plain string becomes a ``Text``."""
    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells), style=style)


def _num(value: float | None, scale: float, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{fmt}}{suffix}"


def search_footer(result: SearchResult) -> list[str]:
    """Lines under the search table: why the winner won, memory, skipped, failures, file."""
    c = result.config
    lines = summary_lines(c)
    lines += [f"{r.label()}: {r.verdict}: {r.reason}" for r in c.trials
              if r.verdict not in ("winner", "ok") and r.reason]
    lines += [f"{r.label()}: partly compiled: {r.num_graph_breaks} graph break(s), "
              f"{r.num_graphs} graph(s); eager code runs between them (TORCH_LOGS=graph_breaks "
              "shows where)" for r in c.trials
              if r.knobs.compile_mode != "off" and r.num_graph_breaks
              and r.verdict in ("winner", "ok")]
    lines += [s if s.startswith("re-check of ") else f"skipped: {s}" for s in c.skipped]
    if c.cost is not None:
        lines.append(f"search: {c.cost.describe()}")
    lines += study_lines(c)
    if c.interrupted:
        lines.append(f"note: {result.stop_reason}")
    if result.path is not None:
        page = result.path.with_suffix(".html")  # not written when it could not be rendered
        lines.append(f"wrote {result.path}"
                     + (f", {result.path.with_name('train_autotuned.py')} and {page} (open it "
                        "in a browser: the search's plots)" if page.exists() else
                        f" and {result.path.with_name('train_autotuned.py')}"))
    return lines


def summary_lines(c: TunedConfig) -> list[str]:
    """The winner, why it won, its memory, knobs, compute and compile break-even: the head of
    the search's footer, and of ``autotune.html``."""
    mem = c.memory
    lines = [
        f"winner: micro_batch={c.micro_batch} accumulate_steps={c.accumulate_steps} "
        f"(x world {c.world_size} = {c.effective_batch()}) precision={c.precision} "
        f"compile={c.compile_mode}"
        + "".join(f" {name}={getattr(c.knobs, name)}" for name in c.knobs.changed())
        + (f" (asked for {c.requested_batch}: {c.effective_batch() - c.requested_batch:+d} "
           f"samples, {(c.effective_batch() - c.requested_batch) / c.requested_batch:+.1%}, "
           "--allow-inexact)" if c.requested_batch else ""),
        f"why: {c.reason}",
        f"memory: peak {format_bytes(mem.peak_bytes)} of {format_bytes(mem.usable_bytes)} usable "
        f"(budget {format_bytes(mem.budget_bytes)}, headroom {mem.headroom:.0%}); "
        f"peak = {mem.peak_definition}",
    ]
    winner = next((r for r in c.trials if r.verdict == "winner"), None)
    if winner is not None and winner.fragmentation_bytes is not None:
        lines.append(f"fragmentation at the peak (reserved minus allocated): "
                     f"{format_bytes(winner.fragmentation_bytes)}")
    lines += [f"knobs: {line}" for line in describe(c.knobs, c.knobs.changed())]
    if c.flops_per_sample and winner is not None and winner.tflops_per_s:
        lines.append(
            f"compute: {c.flops_per_sample / 1e9:,.3g} GFLOP per sample (model FLOPs of forward "
            f"and backward, counted on the baseline's step); the winner runs "
            f"{winner.tflops_per_s:.3g} TFLOP/s" + (
                f", MFU {winner.mfu:.1%} of this device's dense {c.precision} peak"
                if winner.mfu else f" (MFU: no known {c.precision} peak for {c.device.name})"))
    if c.break_even_steps is not None:
        lines.append(
            "compile pays for itself after "
            + ("never (not faster per step)" if c.break_even_steps == float("inf")
               else f"{c.break_even_steps:,.0f} optimizer steps") + " against the baseline")
    return lines


def trial_line(record: TrialRecord, stage: str = "") -> str:
    """One progress line for a finished run (a probe that fits is also a trial)."""
    speed = f"{record.samples_per_s:,.1f} samples/s" if record.samples_per_s else "-"
    extra = f" ({record.reason})" if record.reason else ""
    wall = f", {record.wall_s:.0f} s" if record.wall_s is not None else ""
    where = f"{stage:<7} " if stage else ""
    return (f"trial {where}{record.label():<36} {record.verdict:<13} {speed:>20}  peak "
            f"{format_bytes(record.peak_bytes):>10}{wall}{extra}")
# ----------------------------------------------------------------------------------------------
# estimate and check (issue 5).


def estimate_lines(report: EstimateReport) -> list[str]:
    """The estimate as lines for people: breakdown at the peak, then what fits."""
    step = report.estimate
    kernels = ("cuda: fused attention, an optimizer left to choose as foreach; --device cpu "
               "for a CPU's" if step.kernels == "cuda" else
               "cpu: what a CPU runs, as traced; --device cuda for a GPU's")
    strategy = step.knobs.strategy
    rank = (f", per rank of {step.world_size} ({strategy})" if strategy != "none" else "")
    lines = [
        f"{report.workload_name}: micro-batch {step.micro_batch}, {step.knobs.label()} traced "
        f"eager{rank} ({step.num_parameters / 1e6:.1f}M parameters; fake-tensor trace of the "
        f"training step, 2 accumulated micro-batches + optimizer step, {step.trace_s:.1f} s)",
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
    budget = (f"device memory {format_bytes(report.device_memory_bytes)} - "
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


def study_lines(c: TunedConfig) -> list[str]:
    """Where the runs are kept, what was reused from it and from when, what the store said."""
    if c.study is None:
        return []
    stored = sorted(r.stored_at for r in c.runs if r.stored_at)
    where = c.study.storage.removeprefix("sqlite:///")
    lines = [f"study store: {c.study.note}"] if c.study.note else []
    if stored:
        when = stored[0] if stored[0] == stored[-1] else f"{stored[0]} to {stored[-1]}"
        lines.append(f"study store: reused {len(stored)} stored run(s) measured {when} "
                     f"({where}, study {c.study.name}); --fresh measures everything again")
    elif where:
        lines.append(f"study store: runs recorded in {where} (study {c.study.name}): a "
                     "repeated search reuses them (--no-cache: keep none)")
    return lines
