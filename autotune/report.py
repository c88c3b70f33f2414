"""Tables and JSON for people and machines. No torch import here.

Text from the user's side (a workload's name, an error's message, a path) is never read as
Rich markup: every table title and cell here is a ``rich.text.Text`` (styled only by the style
given to it), and the lines are plain strings for a console with markup off
(``autotune.cli.plain_console``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from autotune.config import DeviceInfo, ProbeReport, ProbeStep
from autotune.device import backend_for
from autotune.knobs import describe
from autotune.schema import SearchResult, SkipRecord, TrialRecord, TunedConfig
from autotune.serialize import to_json_dict
from autotune.units import accumulate_steps, format_bytes

if TYPE_CHECKING:
    from autotune.estimate.fits import EstimateReport


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
            " ".join(f"{m}x{accumulate_steps(per_device, m)}"
                     for m in reversed([m for m, _ in pairs])) or "-",
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
    """One progress line for a finished probe: it fits, does not fit (ran over the usable
    budget, or out of memory), or failed otherwise, which says nothing of its memory."""
    verdict = ("fits" if step.fits else "does not fit" if step.status in ("ok", "oom") else
               "no memory verdict")
    seconds = f", {step.wall_s:.1f} s" if step.wall_s is not None else ""
    return (f"{label:<32} micro-batch {step.micro_batch:>5}: {step.status:<13} "
            f"peak {format_bytes(step.peak_bytes):>10}  {verdict}{seconds}")


def to_json(value: Any) -> str:
    """Any result dataclass as indented JSON."""
    return json.dumps(to_json_dict(value), indent=2)


FULL_TABLE_WIDTH = 150
"""A console narrower than this gets the search table without its low-value columns (ms/step
beside samples/s, ±, tokens/s, compile s, runs, TFLOP/s): ``--json`` and ``autotune.html``
hold them all."""

_NARROW_DROPS = frozenset({"ms/step", "±", "tokens/s", "compile s", "runs", "TFLOP/s"})


def search_table(config: TunedConfig, width: int | None = None) -> Table:
    """Every trial: knobs, outcome, speed, memory and compile cost; the winner marked.

    ``width``: the console's columns; under ``FULL_TABLE_WIDTH`` the low-value columns are
    left out (``_NARROW_DROPS``). A knobs label too long for its column wraps, whole: rows
    must stay apart."""
    table = Table(title=_title(
        f"autotune search — {config.workload_name or config.workload.label()} on "
        f"{config.device.name} ({config.device.device}), target batch {config.target_batch}"))
    columns = [("#", "right"), ("knobs", "left"), ("micro x acc", "right"),
               ("status", "left"), ("ms/step", "right"), ("±", "right"), ("samples/s", "right"),
               ("tokens/s", "right"), ("peak", "right"), ("compile s", "right"),
               ("speedup", "right"), ("runs", "right")]
    flops = any(r.tflops_per_s for r in config.trials)
    mfu = any(r.mfu for r in config.trials)
    if not any(r.tokens_per_s for r in config.trials):
        columns.remove(("tokens/s", "right"))
    if flops:
        columns.append(("TFLOP/s", "right"))
    if mfu:
        columns.append(("MFU", "right"))
    if config.train_steps:
        columns.append((f"train {config.train_steps} steps s", "right"))
    names = [name for name, _ in columns]
    keep = [width is None or width >= FULL_TABLE_WIDTH or name not in _NARROW_DROPS
            for name in names]
    for (name, justify), kept in zip(columns, keep, strict=True):
        if kept:
            # Only the knobs and the status wrap (the knobs fold, whole): the figures stay
            # on one line each, so a narrow console takes its columns from the knobs.
            table.add_column(name, justify=justify,  # type: ignore[arg-type]
                             overflow="fold", no_wrap=name not in ("knobs", "status"))
    for r in config.trials:
        status = Text(r.verdict, style="bold green" if r.verdict == "winner" else "")
        if r.is_baseline:
            status.append(" (baseline)")
        row: list[str | Text] = [str(r.number), r.knobs.label(),
               f"{r.micro_batch}x{r.accumulate_steps}", status,
               _num(r.median_step_s, 1000, ".1f"), _num(r.halfwidth, 100, ".0f", "%"),
               _num(r.samples_per_s, 1, ",.1f"),
               _num(r.tokens_per_s, 1, ",.0f"), format_bytes(r.peak_bytes),
               _num(r.compile_s if r.knobs.compiled else None, 1, ".1f"),
               _num(r.speedup, 1, ".2f", "x"), str(r.num_runs)]
        if flops:
            row.append(_num(r.tflops_per_s, 1, ".3g"))
        if mfu:
            row.append(_num(r.mfu, 100, ".1f", "%"))
        if config.train_steps:
            row.append(_num(r.time_to_train_s, 1, ",.1f"))
        if "tokens/s" not in names:
            del row[7]
        row = [cell for cell, kept in zip(row, keep, strict=True) if kept]
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
              if r.knobs.compiled and r.num_graph_breaks
              and r.verdict in ("winner", "ok")]
    page = result.path.with_suffix(".html") if result.path is not None else None
    if page is not None and not page.exists():  # not written when it could not be rendered
        page = None
    lines += skipped_lines(c.skips, page)
    if c.cost is not None:
        lines.append(f"search: {c.cost.describe()}")
    if c.compile_artifacts is not None:  # docs/compile.md
        lines.append(f"first launch: compiled artifacts {c.compile_artifacts.describe()}")
    lines += study_lines(c)
    if c.interrupted:
        lines.append(f"note: {result.stop_reason}")
    if c.not_reached:
        lines.append(not_reached_line(c))
    if result.path is not None:
        script = result.path.with_name("train_autotuned.py")
        lines.append(f"wrote {result.path}"
                     + (f", {script} and {page} (open it in a browser: the search's plots)"
                        if page is not None else f" and {script}"))
        lines.append(f"next: python {script} --steps 100   (train with the tuned config)")
        load = f"autotune.load({json.dumps(str(result.path))})"
        lines.append(f"  or in your own script: cfg = {load}")
    return lines


MAX_SKIPPED_LINES = 4
"""Lines the footer gives the skipped candidates, one per kind (the rest in the page)."""
LINE_WIDTH = 100
_SETTING = re.compile(r"^[\w.-]+/[\w.+=/-]*(?: \d+(?:x\d+)?)?:? ")
_NUMBERS = re.compile(r"\b\d[\d,.]*(?:x\d+)?%?(?:,? (?=\d))?")
_RUNS_MADE = re.compile(r"^re-check of |screened again on |re-measured: |interleaved rounds")


_MADE_RULES = frozenset(("recheck", "rescreen", "within-drift", "rounds", "noise",
                         "re-measure-first", "joint"))
"""Rules whose note says a run was made (a re-check, a re-measure), not one skipped."""


def runs_made(skip: SkipRecord) -> bool:
    """Whether a skip note says a run was made: by its rule, or, for a note of a file that
    recorded no rules (schema 2), by its words."""
    return skip.rule in _MADE_RULES or (skip.rule == "note"
                                        and bool(_RUNS_MADE.search(skip.text)))


def skipped_lines(skips: tuple[SkipRecord, ...], page: Path | None = None) -> list[str]:
    """``TunedConfig.skips`` for the terminal: one short line per rule (``docs/search.md``;
    a note by its words before the first ``:``, the setting and the numbers left out), with a
    count and the first example; the runs that were made (re-checks, re-measures) under their
    own heading, the calibration's notes under theirs; then where the full sentences are. At
    most ``MAX_SKIPPED_LINES`` + 3 lines of ``LINE_WIDTH``. Each sentence is
    ``SkipRecord.sentence`` (``skip_sentences.render``)."""
    made = [s.sentence() for s in skips if runs_made(s)]
    calibration = [s.sentence() for s in skips if s.rule == "calibration"]
    groups: dict[str, list[str]] = {}  # a note of a file without rules: by its words
    for skip in skips:
        if not runs_made(skip) and skip.rule != "calibration":
            kind = skip.rule if skip.rule != "note" else _kind(skip.text)
            groups.setdefault(kind, []).append(skip.sentence())
    kinds = list(groups.items())
    if len(kinds) > MAX_SKIPPED_LINES:
        rest = kinds[MAX_SKIPPED_LINES - 1:]
        kinds = kinds[:MAX_SKIPPED_LINES - 1]
        lines = [_grouped("skipped", kind, found) for kind, found in kinds]
        lines.append(f"skipped: {sum(len(f) for _, f in rest)} more, of {len(rest)} other "
                     "kinds")
    else:
        lines = [_grouped("skipped", kind, found) for kind, found in kinds]
    if made:
        lines.append(_grouped("measured again", "runs", made))
    if calibration:  # what `check` will lack: said apart, never folded into "more"
        lines.append(_grouped("calibration", "", calibration))
    if lines:
        where = f"{page} and autotune.json" if page is not None else "autotune.json"
        lines.append(f"the full reasons: {where} (skipped)")
    return lines


def _kind(line: str) -> str:
    """A skipped sentence's kind: its words before the first ``:``, without the setting it
    names or the numbers in it (``not tried``, ``micro-batches not timed``)."""
    head = _SETTING.sub("", line, count=1).partition(":")[0]
    return " ".join((_NUMBERS.sub("", head) or line.partition(":")[0]).split())


def _grouped(heading: str, kind: str, found: list[str]) -> str:
    """``skipped (3 not tried): <the first>``, on one line cut to ``LINE_WIDTH``."""
    kind = kind if len(kind) <= 40 else kind[:39] + "…"
    count = f" ({len(found)}{' ' + kind if kind else ''})" if len(found) > 1 else ""
    text = f"{heading}{count}: {' '.join(found[0].split())}"
    return text if len(text) <= LINE_WIDTH else text[:LINE_WIDTH - 1] + "…"


def short_reason(c: TunedConfig) -> str:
    """``TunedConfig.reason`` for the terminal, in at most two short sentences: what won and
    by how much over the baseline, then the runner-up (the full reason is in the file and
    the page)."""
    winner = next((r for r in c.trials if r.verdict == "winner"), None)
    if winner is None or not winner.samples_per_s:
        return c.reason.partition(";")[0]
    text = f"{winner.label()} won at {winner.samples_per_s:,.1f} samples/s"
    if winner.is_baseline:
        text += " (the baseline: nothing tried beat it)"
    elif winner.speedup:
        text += f", {winner.speedup:.2f}x the baseline"
    others = [r for r in c.trials if r.verdict == "ok" and r.samples_per_s]
    if not others:
        return text + "."
    runner_up = max(others, key=lambda r: r.samples_per_s or 0.0)
    ratio = (runner_up.samples_per_s or 0.0) / winner.samples_per_s
    sure = (" (within the noise: either would do)" if "within the noise" in c.reason else
            " (rounds run back to back decided)" if winner.round_shares else "")
    return f"{text}. Runner-up {runner_up.label()} at {ratio:.2f}x{sure}."


def not_reached_line(c: TunedConfig) -> str:
    """What a search stopped early never began ("" when it ran to its end)."""
    if not c.not_reached:
        return ""
    return ("not reached before the search stopped: " + "; ".join(c.not_reached)
            + " (a larger --time-budget or --max-trials reaches them)")


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
        f"why: {short_reason(c)}",
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
    elif where and c.study.failed:
        lines.append(f"study store: runs were recorded in {where} (study {c.study.name}) only "
                     "until it failed: a repeated search reuses what it still holds and "
                     "measures the rest again")
    elif where:
        lines.append(f"study store: runs recorded in {where} (study {c.study.name}): a "
                     "repeated search reuses them (--no-cache: keep none)")
    return lines


def start_line(workload: str, device: str | None, target_batch: int) -> str:
    """The search's first line, printed before anything is run."""
    return (f"autotune search: probing the memory of {workload} on "
            f"{device or 'the default device (cuda when available)'} for target batch "
            f"{target_batch} (each run is a fresh child process; this takes minutes)")


def cache_table(path: Path, studies: list[Any]) -> Table:
    """``autotune cache list``'s table: every title and cell a ``Text``, printed as typed."""
    table = Table(title=Text(str(path), style="table.title"))
    for column in ("study", "workload", "target", "device", "budget", "runs", "last run"):
        table.add_column(column, justify="right" if column == "runs" else "left")
    for s in studies:
        key = s.key
        table.add_row(*map(Text, (
            s.name, str(key.get("workload", "?")), str(key.get("target_batch", "?")),
            str(key.get("device", "?")), _mib(key.get("budget_bytes")), str(s.num_runs),
            s.last_run_at or "-")))
    return table


def _mib(value: object) -> str:
    try:
        return f"{int(str(value)) / 2**20:,.0f} MiB"
    except ValueError:
        return "?"
