"""The four figures of ``autotune.html``, as plotly figures with the sentences under them.

Memory against micro-batch per knob class (every measured peak, the least-squares line that
predicted each boundary, the budget and the usable line, the chosen micro-batch, the OOMs),
the throughput of every timed candidate with its 95% interval, the search's timeline (each
child run's start-up, compile and timed steps), and the compile break-even. Plotly is imported
inside each function: importing this module stays light. No torch import here.

Text from the file goes into the figures HTML-escaped: plotly draws a subset of HTML in its
labels, and reads entities back, so ``&lt;`` shows as ``<`` and never becomes markup.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from autotune.boundary import Point, fit_line
from autotune.schema import RunRecord, TrialRecord, TunedConfig
from autotune.units import format_bytes

GiB = 1 << 30
MiB = 1 << 20
LOG_SCALE_RATIO = 8.0
"""The memory plot's y axis turns logarithmic when the budget is this many times the largest
peak: on a linear axis the measured points would lie flat on the floor."""
COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692",
          "#b6e880", "#ff97ff", "#fecb52")
"""One colour per knob class, in order of appearance (plotly's default sequence)."""


@dataclass(frozen=True, kw_only=True)
class Drawn:
    """One plot of the page: its figure, or why there is none."""

    figure: Any | None
    """A ``plotly.graph_objects.Figure``; None when there is nothing to draw."""
    notes: tuple[str, ...] = ()
    """Sentences under the plot (plain text, escaped by the page); without a figure, the
    first says why there is nothing to draw."""


def _e(text: object) -> str:
    """Text from the file, as plotly's labels take it: HTML-escaped."""
    return html.escape(str(text), quote=True)


def _class_colors(c: TunedConfig) -> dict[str, str]:
    """A colour per knob class, the baseline's first, in the order the search met them."""
    order: dict[str, None] = {}
    for item in (*[t for t in c.trials if t.is_baseline], *c.runs, *c.trials):
        order.setdefault(item.knobs.label(), None)
    for label in c.memory.max_micro_batch:
        order.setdefault(label, None)
    return {label: COLORS[i % len(COLORS)] for i, label in enumerate(order)}


# ----------------------------------------------------------------------------------------------
# 1. Memory against micro-batch.


@dataclass(frozen=True, kw_only=True)
class _Measured:
    """One measured (or out-of-memory) micro-batch of a class, for the memory plot."""

    label: str
    micro_batch: int
    peak_bytes: int | None
    fits: bool
    status: str
    what: str
    """E.g. ``#3 probe`` or ``#0 trial, reused from the study store (measured at ...)``."""


def _measured(c: TunedConfig) -> list[_Measured]:
    """Every run's peak; a file without runs (before they were recorded): the trials'."""
    if c.runs:
        return [_Measured(label=r.knobs.label(), micro_batch=r.micro_batch,
                          peak_bytes=r.peak_bytes, fits=r.fits, status=r.status,
                          what=f"#{r.number} {r.kind}" + (
                              f", reused from the study store (measured at {r.stored_at})"
                              if r.stored_at else ", cut by the budget" if r.cut else ""))
                for r in c.runs]
    usable = c.memory.usable_bytes
    return [_Measured(label=t.knobs.label(), micro_batch=t.micro_batch, peak_bytes=t.peak_bytes,
                      fits=t.peak_bytes is not None and t.peak_bytes <= usable
                      and t.verdict not in ("oom", "over_budget"),
                      status=t.verdict if t.verdict in ("oom", "crash", "timeout") else "ok",
                      what=f"trial #{t.number}")
            for t in c.trials]


def memory_plot(c: TunedConfig) -> Drawn:
    """Peak memory against micro-batch, a colour per knob class: each run's peak (fits, over
    the usable line, failed), each OOM at the budget, the probe's fitted line per class, the
    budget and usable lines, the chosen micro-batch as a star. Log scale when the budget
    dwarfs the peaks (``LOG_SCALE_RATIO``)."""
    import plotly.graph_objects as go

    points = _measured(c)
    peaks = [p.peak_bytes for p in points if p.peak_bytes is not None and p.status == "ok"]
    if not peaks and not any(p.status == "oom" for p in points):
        return Drawn(figure=None, notes=("no run of this search measured a peak",))
    mem = c.memory
    top = max(peaks, default=mem.usable_bytes)
    unit, scale = ("GiB", GiB) if top >= GiB else ("MiB", MiB)
    log = mem.budget_bytes > LOG_SCALE_RATIO * top
    x_max = max([p.micro_batch for p in points] + [c.target_batch // c.world_size])
    colors = _class_colors(c)
    fig = go.Figure()
    for label, color in colors.items():
        mine = [p for p in points if p.label == label]
        if not mine:
            continue
        ran = [p for p in mine if p.status == "ok" and p.peak_bytes is not None]
        failed = [p for p in mine if p.status not in ("ok", "oom") and p.peak_bytes is not None]
        for group, name, symbol, y_of in (
                ([p for p in ran if p.fits], "fits", "circle", lambda p: p.peak_bytes),
                ([p for p in ran if not p.fits], "over the usable line", "circle-open",
                 lambda p: p.peak_bytes),
                ([p for p in mine if p.status == "oom"], "out of memory (drawn at the budget)",
                 "x-thin-open", lambda _p: mem.budget_bytes),
                (failed, "failed (peak where it stopped)", "diamond-open",
                 lambda p: p.peak_bytes)):
            if group:
                fig.add_scatter(
                    x=[p.micro_batch for p in group], y=[y_of(p) / scale for p in group],
                    mode="markers", name=f"{_e(label)}: {name}", legendgroup=label,
                    marker={"color": color, "symbol": symbol, "size": 10,
                            "line": {"width": 2, "color": color}},
                    hovertext=[_e(f"{label} micro-batch {p.micro_batch}: {p.status}, peak "
                                  f"{format_bytes(p.peak_bytes)} ({p.what})") for p in group],
                    hoverinfo="text")
        # The probe's own line: only a complete run's peak is on it.
        line = fit_line([Point(micro_batch=p.micro_batch, fits=p.fits,
                               peak_bytes=p.peak_bytes if p.status == "ok" else None)
                         for p in mine])
        if line is not None:
            slope, intercept = line
            xs = [1 + (x_max - 1) * i / 50 for i in range(51)]
            fig.add_scatter(x=xs, y=[(slope * x + intercept) / scale for x in xs], mode="lines",
                            name=f"{_e(label)}: fitted line", legendgroup=label,
                            line={"color": color, "dash": "dot", "width": 1.5},
                            hovertext=_e(f"{label}: {format_bytes(slope)} per sample + "
                                         f"{format_bytes(intercept)}"), hoverinfo="text")
    for value, name, dash, color in (
            (mem.budget_bytes, "budget", "solid", "#d62728"),
            (mem.usable_bytes, f"usable (budget minus {mem.headroom:.0%} headroom)", "dash",
             "#ff7f0e")):
        fig.add_scatter(x=[1, x_max], y=[value / scale] * 2, mode="lines",
                        name=f"{name} {format_bytes(value)}",
                        line={"color": color, "dash": dash, "width": 2}, hoverinfo="name")
    chosen = mem.peak_bytes or next((t.peak_bytes for t in c.trials if t.verdict == "winner"),
                                    None)
    if chosen is not None:
        fig.add_scatter(x=[c.micro_batch], y=[chosen / scale], mode="markers+text",
                        name=_e(f"chosen: {c.knobs.label()} micro-batch {c.micro_batch}"),
                        text=["chosen"], textposition="top center",
                        marker={"symbol": "star", "size": 18, "color": "#2ca02c",
                                "line": {"width": 1, "color": "black"}},
                        hovertext=_e(f"chosen: {c.knobs.label()} micro-batch {c.micro_batch}, "
                                     f"peak {format_bytes(chosen)}"), hoverinfo="text")
    fig.update_layout(height=520, xaxis_title="micro-batch (samples per device)",
                      yaxis_title=f"peak memory ({unit})" + (", log scale" if log else ""))
    if log:
        fig.update_yaxes(type="log")
    fig.update_xaxes(rangemode="tozero")
    notes = [f"The y axis is logarithmic: the budget ({format_bytes(mem.budget_bytes)}) is "
             f"{mem.budget_bytes / top:,.0f}x the largest peak." if log else "",
             "Dotted: the least-squares line through a class's peaks, which predicted its "
             "boundary (a class with one micro-batch measured has none)."
             f" Peak = {mem.peak_definition or 'as measured'}.",
             "Measured before this file recorded every run: the trials' peaks only, no probes."
             if not c.runs else ""]
    return Drawn(figure=fig, notes=tuple(notes))


# ----------------------------------------------------------------------------------------------
# 2. Throughput.


def _role(t: TrialRecord) -> str:
    if t.verdict == "winner":
        return "winner"
    if t.is_baseline:
        return "baseline"
    return {"ok": "ran, lost", "slower": "stopped early (clearly slower)"}.get(
        t.verdict, "disqualified")


_ROLE_COLORS = {"winner": "#2ca02c", "baseline": "#7f7f7f", "ran, lost": "#636efa",
                "stopped early (clearly slower)": "#a6b3f5", "disqualified": "#d62728"}


def throughput_plot(c: TunedConfig) -> Drawn:
    """Samples/s of every timed candidate, grouped by knob class, with its 95% interval as an
    error bar, coloured by role (winner, baseline, lost, stopped early, disqualified), and the
    baseline's speed as a line."""
    import plotly.graph_objects as go

    colors = list(_class_colors(c))
    timed = sorted((t for t in c.trials if t.samples_per_s),
                   key=lambda t: (colors.index(t.knobs.label()), -t.micro_batch, t.number))
    if not timed:
        return Drawn(figure=None, notes=("no candidate was timed",))
    fig = go.Figure()
    for role, color in _ROLE_COLORS.items():
        mine = [t for t in timed if _role(t) == role]
        if not mine:
            continue
        spread = [(t.samples_per_s or 0.0) * (t.halfwidth or 0.0) for t in mine]
        fig.add_bar(
            y=[[_e(t.knobs.label()) for t in mine],
               [f"#{t.number} {t.micro_batch}x{t.accumulate_steps}" for t in mine]],
            x=[t.samples_per_s for t in mine], orientation="h", name=role, marker_color=color,
            error_x={"type": "data", "visible": True, "array": spread,  # never below 0
                     "arrayminus": [min(e, t.samples_per_s or 0.0) for e, t in zip(
                         spread, mine, strict=True)]},
            text=[f"{t.speedup:.2f}x" if t.speedup else "" for t in mine],
            textposition="inside", insidetextanchor="start", hoverinfo="text", hovertext=[_e(
                f"{t.label()}: {t.verdict}{' (baseline)' if t.is_baseline else ''}, "
                f"{t.samples_per_s:,.1f} samples/s"
                + (f" ± {t.halfwidth:.0%}" if t.halfwidth is not None else "")
                + (f", {t.median_step_s * 1000:,.1f} ms/step" if t.median_step_s else "")
                + f", peak {format_bytes(t.peak_bytes)}"
                + (f", compile {t.compile_s:.1f} s" if t.compile_s and
                   t.knobs.compiled else "")
                + (f"; {t.reason}" if t.reason else "")) for t in mine])
    if c.baseline_samples_per_s:
        fig.add_vline(x=c.baseline_samples_per_s, line_dash="dash", line_color="#7f7f7f",
                      annotation_text="baseline", annotation_position="top")
    # An interval wider than half its value (a noisy run) would squeeze every bar into a
    # corner: the axis ends there, and the hover text says the whole interval.
    end = 1.05 * max((t.samples_per_s or 0.0) * (1 + min(t.halfwidth or 0.0, 0.5))
                     for t in timed)
    cut = any((t.halfwidth or 0.0) > 0.5 for t in timed)
    fig.update_layout(height=180 + 26 * len(timed), barmode="overlay",
                      xaxis={"title": "samples/s", "range": [0, end]},
                      yaxis={"autorange": "reversed"})
    return Drawn(figure=fig, notes=(
        "Error bars: the 95% interval of each candidate's median step time, as samples/s; "
        "inside each bar its speed over the baseline's."
        + (" An interval wider than half its value is cut at the axis's end (hover over the "
           "bar for its width)." if cut else ""),))


# ----------------------------------------------------------------------------------------------
# 3. Timeline.


def _timeline_runs(c: TunedConfig) -> tuple[list[RunRecord], str]:
    """This search's runs; for a file without them, its trials laid end to end."""
    if c.runs:
        return [r for r in c.runs if r.stored_at is None and r.wall_s is not None], ""
    runs, start = [], 0.0
    for t in sorted(c.trials, key=lambda t: t.number):
        if t.wall_s is None:
            continue
        runs.append(RunRecord(number=t.number, kind="trial", knobs=t.knobs,
                              micro_batch=t.micro_batch,
                              status="oom" if t.verdict == "oom" else "ok",
                              peak_bytes=t.peak_bytes, start_s=start, wall_s=t.wall_s,
                              compile_s=t.compile_s if t.knobs.compiled else None,
                              timed_s=t.timed_s or 0.0))
        start += t.wall_s
    return runs, ("This file does not record when each run started (it predates run records): "
                  "the trials are laid end to end, and the memory probes are missing.")


def timeline_plot(c: TunedConfig) -> Drawn:
    """Each child run of this search as a bar from its start (seconds after the search
    started): start-up and warm-up, then compile, then timed steps; probes dotted,
    re-measurements hatched. Runs reused from the study store are not on it."""
    import plotly.graph_objects as go

    runs, note = _timeline_runs(c)
    if not runs:
        return Drawn(figure=None, notes=("every run was reused from the study store" if c.runs
                                         else "this file records no run times",))
    names = [_e(f"#{r.number} {r.kind} {r.label()}" + (f" [{r.where()}]" if r.where() else "")
                + (" (cut by the budget)" if r.cut else "" if r.status == "ok"
                   else f" ({r.status})")) for r in runs]
    # A parallel search (``--parallel``) or a node of a joined study (``--join``): one lane per
    # slot and node, each run a bar in its lane (a slot runs one at a time); else one row per
    # run.
    lanes = sorted({r.where() for r in runs if r.where()})
    rows = [_e(r.where() or "one at a time") for r in runs] if lanes else names
    parts = []
    for r in runs:
        wall = r.wall_s or 0.0
        compile_s = min(r.compile_s or 0.0, wall)
        timed = min(r.timed_s, wall - compile_s)
        parts.append((wall - compile_s - timed, compile_s, timed))
    pattern = {"probe": ".", "trial": "", "re-measure": "/"}
    fig = go.Figure()
    offsets = [r.start_s for r in runs]
    for i, (name, color) in enumerate((
            ("start-up, warm-up and memory steps", "#c7c7c7"), ("compile", "#ff7f0e"),
            ("timed steps", "#1f77b4"))):
        fig.add_bar(y=rows, x=[p[i] for p in parts], base=list(offsets), orientation="h",
                    name=name, marker={"color": color,
                                       "pattern": {"shape": [pattern[r.kind] for r in runs]}},
                    hovertext=[f"{n}: {name} {p[i]:.1f} s (run {r.wall_s or 0:.1f} s)"
                               for n, p, r in zip(names, parts, runs, strict=True)],
                    hoverinfo="text")
        offsets = [o + p[i] for o, p in zip(offsets, parts, strict=True)]
    fig.update_layout(height=160 + (40 * len(set(rows)) if lanes else 24 * len(runs)),
                      barmode="overlay", xaxis_title="seconds since the search started",
                      yaxis={"autorange": "reversed", "type": "category"})
    notes = [note, "Dotted bars: memory probes; hatched: re-measurements of a close race."]
    if lanes:
        joined = any(r.node for r in runs)
        notes.append(f"One lane per {'node and ' if joined else ''}slot of {len(lanes)} that ran "
                     f"children{'' if joined else ' at once'} "
                     f"({'--join' if joined else '--parallel'}): hover a bar for its run.")
    if c.cost is not None:
        notes.append(f"In all: {c.cost.describe()}.")
    return Drawn(figure=fig, notes=tuple(notes))


# ----------------------------------------------------------------------------------------------
# 4. Compile break-even.


def break_even_plot(c: TunedConfig) -> Drawn:
    """Seconds to train N optimizer steps, compile included, for the winner and the baseline
    (compile + N x median step), with the break-even step count and ``--train-steps``."""
    import plotly.graph_objects as go

    winner = next((t for t in c.trials if t.verdict == "winner"), None)
    baseline = next((t for t in c.trials if t.is_baseline), None)
    if winner is None or baseline is None or not winner.median_step_s or \
            not baseline.median_step_s:
        return Drawn(figure=None, notes=(
            "the winner's or the baseline's step time is not in the file",))
    be = c.break_even_steps
    end = max(2.5 * be if be is not None and math.isfinite(be) else 100.0,
              1.1 * (c.train_steps or 0), 10.0)
    end = float(_round_up(end))
    fig = go.Figure()
    for t, name, color in ((baseline, "baseline", "#7f7f7f"), (winner, "winner", "#2ca02c")):
        compile_s = (t.compile_s or 0.0) if t.knobs.compiled else 0.0
        fig.add_scatter(x=[0, end], y=[compile_s, compile_s + end * t.median_step_s],
                        mode="lines", line={"color": color, "width": 3},
                        name=_e(f"{name} {t.label()}: {compile_s:.1f} s compile + "
                                f"{t.median_step_s * 1000:,.1f} ms/step"))
    if be is not None and math.isfinite(be):
        fig.add_vline(x=be, line_dash="dash", line_color="black",
                      annotation_text=f"break-even: {be:,.0f} steps")
    if c.train_steps:
        fig.add_vline(x=c.train_steps, line_dash="dot", line_color="#9467bd",
                      annotation_text=f"--train-steps {c.train_steps}",
                      annotation_position="bottom right")
    fig.update_layout(height=440, xaxis_title="optimizer steps trained",
                      yaxis_title="seconds, compile included")
    note = ("The winner runs eager: no compile time to pay back." if winner.knobs.compile_mode
            == "off" else "The compiled winner is not faster per step: its compile never pays "
            "back." if be is not None and not math.isfinite(be) else
            f"The compiled winner has paid back its compile time after {be:,.0f} optimizer "
            "steps; before that the baseline is done sooner." if be is not None else "")
    return Drawn(figure=fig, notes=(note,))


def _round_up(value: float) -> int:
    """1, 2 or 5 times a power of ten, at least ``value``: a round end for an axis."""
    power = 10 ** math.floor(math.log10(value))
    return next(int(m * power) for m in (1, 2, 5, 10) if m * power >= value)


