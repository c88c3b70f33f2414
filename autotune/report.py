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
from typing import Any

from rich.table import Table
from rich.text import Text

from autotune.config import DeviceInfo, ProbeReport
from autotune.device import backend_for
from autotune.knob_rules import describe
from autotune.report_skips import skipped_lines
from autotune.report_width import (
    Pieces,
    abbreviate,
    column_widths,
    label_pieces,
    legend_line,
    shorten,
)
from autotune.schema import SearchResult, TunedConfig
from autotune.serialize import to_json_dict
from autotune.units import accumulate_steps, format_bytes


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


def to_json(value: Any) -> str:
    """Any result dataclass as indented JSON."""
    return json.dumps(to_json_dict(value), indent=2)


FULL_TABLE_WIDTH = 150
"""A console narrower than this gets the search table without its low-value columns (ms/step
beside samples/s, ±, tokens/s, compile s, runs, TFLOP/s): ``--json`` and ``autotune.html``
hold them all."""

_NARROW_DROPS = frozenset({"ms/step", "±", "tokens/s", "compile s", "runs", "TFLOP/s"})
NARROW_WIDTH = 120
"""A console narrower than this also goes without the MFU column (the footer's ``compute:``
says it) and, where the objective is time to train, the speedup (of samples/s); the long knob
values are abbreviated by a legend under the table: at 80 columns its knob labels wrap
between their parts, never inside a word."""


def search_table(config: TunedConfig, width: int | None = None) -> Table:
    """Every trial: knobs, outcome, speed, memory and compile cost; the winner marked.

    ``width``: the console's columns; under ``FULL_TABLE_WIDTH`` the low-value columns are
    left out (``_NARROW_DROPS``), under ``NARROW_WIDTH`` the MFU too and the long knob
    values are abbreviated (the legend is the table's caption). A knobs label too long for
    its column wraps between its parts (``report_width.Pieces``), never inside a word."""
    narrow = width is not None and width < NARROW_WIDTH
    legend = abbreviate(r.knobs.label() for r in config.trials) if narrow else {}
    table = Table(title=_title(
        f"autotune search — {config.workload_name or config.workload.label()} on "
        f"{config.device.name} ({config.device.device}), target batch {config.target_batch}"),
        caption=Text(legend_line(legend, width or NARROW_WIDTH)) if legend else None,
        caption_justify="left")
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
    if mfu and not narrow:
        columns.append(("MFU", "right"))
    if config.train_steps:
        columns.append((f"train {config.train_steps} steps s", "right"))
    names = [name for name, _ in columns]
    drops = _NARROW_DROPS | ({"speedup"} if narrow and config.train_steps else set())
    keep = [width is None or width >= FULL_TABLE_WIDTH or name not in drops
            for name in names]
    rows = []
    for r in config.trials:
        status = Pieces(re.split(r"(?<=[_ ])", r.verdict + " (baseline)" * r.is_baseline),
                        style="bold green" if r.verdict == "winner" else "")
        row: list[str | Text | Pieces] = [str(r.number),
               Pieces(shorten(r.knobs.label(), legend) if legend else
                      label_pieces(r.knobs.label())),
               f"{r.micro_batch}x{r.accumulate_steps}", status,
               _num(r.median_step_s, 1000, ".1f"), _num(r.halfwidth, 100, ".0f", "%"),
               _num(r.samples_per_s, 1, ",.1f"),
               _num(r.tokens_per_s, 1, ",.0f"), format_bytes(r.peak_bytes),
               _num(r.compile_s if r.knobs.compiled else None, 1, ".1f"),
               _num(r.speedup, 1, ".2f", "x"), str(r.num_runs)]
        if flops:
            row.append(_num(r.tflops_per_s, 1, ".3g"))
        if mfu and not narrow:
            row.append(_num(r.mfu, 100, ".1f", "%"))
        if config.train_steps:
            row.append(_num(r.time_to_train_s, 1, ",.1f"))
        if "tokens/s" not in names:
            del row[7]
        rows.append(([cell for cell, kept in zip(row, keep, strict=True) if kept],
                     "bold" if r.verdict == "winner" else None))
    kept_columns = [column for column, kept in zip(columns, keep, strict=True) if kept]
    # The knobs and the status wrap between their parts, two headers between words, a
    # figure never; where the table is wider than the console, the knobs take what the
    # others leave (``column_widths``: rich's own collapse breaks parts mid-word).
    wraps = [name in ("knobs", "status", "micro x acc") or name.startswith("train ")
             for name, _ in kept_columns]
    sizes = column_widths([[name, *(row[i] for row, _ in rows)]
                           for i, (name, _) in enumerate(kept_columns)],
                          wraps, width or 10_000, 1)
    for (name, justify), wrap, size in zip(kept_columns, wraps, sizes, strict=True):
        table.add_column(Text(name), justify=justify,  # type: ignore[arg-type]
                         no_wrap=not wrap, width=size)
    for row, style in rows:
        _add_row(table, *row, style=style)
    return table


def _title(text: str) -> Text:
    """A table's title, printed as typed (never read as markup)."""
    return Text(text, style="table.title")


def _add_row(table: Table, *cells: str | Text | Pieces, style: str | None = None) -> None:
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


def short_reason(c: TunedConfig) -> str:
    """``TunedConfig.reason`` for the terminal, in at most two short sentences: what won and
    by how much over the baseline, then the runner-up (the full reason is in the file and
    the page)."""
    winner = next((r for r in c.trials if r.verdict == "winner"), None)
    if winner is None or not winner.samples_per_s:
        return c.reason.partition(";")[0]
    text = f"{winner.label()} won at {winner.samples_per_s:,.1f} samples/s"
    if winner.is_baseline:
        text += f" (the baseline{baseline_note(c)}: nothing tried beat it)"
    elif winner.speedup:
        text += f", {winner.speedup:.2f}x the baseline{baseline_note(c)}"
    others = [r for r in c.trials if r.verdict == "ok" and r.samples_per_s]
    if not others:
        return text + "."
    runner_up = max(others, key=lambda r: r.samples_per_s or 0.0)
    paired = next((r for r in others if r.round_shares), None)
    if c.runner_up == "rounds" and paired is not None:  # the one the rounds decided against
        runner_up = paired
    ratio = (runner_up.samples_per_s or 0.0) / winner.samples_per_s
    return f"{text}. Runner-up {runner_up.label()} at {ratio:.2f}x{_STANDING[c.runner_up]}."


_STANDING = {"behind": " (behind, beyond the noise)",
             "behind-once": " (behind, beyond each run's spread: one of them ran once)",
             "within-noise": " (within the noise: either would do)",
             "rounds": " (rounds run back to back decided)", "": ""}
"""``TunedConfig.runner_up`` in the terminal's ``why:``: the search's interval comparison
said it (never words found in the reason)."""


def baseline_note(c: TunedConfig) -> str:
    """Which baseline the speedups are against, said after "the baseline" where it pads each
    batch to its own longest sample as a collate does (a workload that declares lengths:
    against padding to the worst case, a speedup is one over a loop nobody writes); else
    ""."""
    base = next((r for r in c.trials if r.is_baseline), None)
    if base is None or base.knobs.shapes != "longest":
        return ""
    return ", eager with each batch padded to its longest sample"


def not_reached_line(c: TunedConfig) -> str:
    """What a search stopped early never began ("" when it ran to its end)."""
    if not c.not_reached:
        return ""
    return ("not reached before the search stopped: " + "; ".join(c.not_reached)
            + " (a larger --time-budget or --max-trials reaches them)")


def peak_unverified_line(c: TunedConfig) -> str:
    """Where the search did not check the winner's fit as a first launch
    (``MemoryRecord.peak_verified`` false): that its peak is unverified, why, and what
    measures it; "" otherwise."""
    mem = c.memory
    if mem.peak_verified is not False:
        return ""
    return (f"peak unverified: {mem.peak_unverified or 'not checked as a first launch'}; "
            "`autotune verify` measures a first launch of it")


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
    if unverified := peak_unverified_line(c):  # a first launch may peak higher: beside it
        lines.append(unverified)
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
               else f"{c.break_even_steps:,.0f} optimizer steps")
            + f" against the baseline{baseline_note(c)}")
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
