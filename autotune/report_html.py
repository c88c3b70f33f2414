"""``autotune.html``: the search as one self-contained page of plots. No torch import here.

Four plots, drawn with plotly (its JavaScript inlined once, so the page opens offline): memory
against micro-batch per knob class with the line that predicted each boundary, the throughput
of every timed candidate with its spread, the search's timeline, and the compile break-even;
above them the tuned config and why it won, as the terminal prints it.

Every text taken from the file (workload name, reasons, skipped sentences) is HTML-escaped: a
file is data, and its text must never run as the page's code. The page reports its own
failures: a script error, or a plot that did not draw, shows in a red box at the top (and in
the ``data-`` attributes a browser test reads).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path

from autotune.errors import MissingDependencyError
from autotune.files import check_output, write_json_atomic
from autotune.knobs import Knobs
from autotune.report import baseline_note, not_reached_line, peak_unverified_line, summary_lines
from autotune.report_plots import (
    Drawn,
    break_even_plot,
    memory_plot,
    throughput_plot,
    timeline_plot,
)
from autotune.schema import TunedConfig
from autotune.units import format_bytes


def render_html(config: TunedConfig) -> str:
    """The page for a tuned config: summary, the four plots, the skipped candidates.

    Raises:
        MissingDependencyError: plotly is not installed.
    """
    try:
        import plotly.offline
    except ImportError as exc:
        raise MissingDependencyError(
            f"autotune.html needs plotly ({exc}): pip install plotly, then `autotune report "
            "autotune.json` writes it") from exc
    c = config
    title = (f"autotune search — {c.workload_name or c.workload.label()} on {c.device.name} "
             f"({c.device.device}), target batch {c.target_batch}")
    sections = [
        _summary(c),
        _section("memory", "1. Memory against micro-batch, per knob class", memory_plot(c)),
        _section("throughput", "2. Throughput of every timed candidate", throughput_plot(c),
                 _not_timed(c)),
        _section("timeline", "3. Where the search's time went", timeline_plot(c),
                 _stored_runs(c)),
        _section("break-even", "4. Compile break-even", break_even_plot(c)),
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"autotune-config\" content=\"{_e(_identity(c))}\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style>"
        f"<script>{_PAGE_SCRIPT}</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head>\n<body>"
        "<div id=\"autotune-errors\" role=\"alert\" data-error-count=\"0\" hidden></div>"
        "<noscript><p class=\"warn\">The plots need JavaScript; the tables below do not."
        "</p></noscript>"
        f"<h1>{_e(title)}</h1>\n" + "\n".join(sections) + "\n</body></html>\n")


def write_html(config: TunedConfig, path: str | Path, *, force: bool = False) -> Path:
    """Write ``autotune.html`` for a tuned config, atomically.

    Args:
        config: the tuned config (``autotune.tuned_file.read_tuned`` reads one from a file).
        path: the page's path.
        force: overwrite an existing file (a page written for this same config is
            overwritten without it: ``autotune report`` right after a search).

    Returns:
        The path written.

    Raises:
        OutputExistsError: ``path`` exists, is not this config's page and ``force`` is False
            (the file is left as it is).
        ConfigError: the folder is not writable.
        MissingDependencyError: plotly is not installed.
    """
    path = Path(path)
    force = force or is_page_of(path, config)
    check_output(path, force=force)  # before rendering: say so at once
    write_json_atomic(path, render_html(config), force=force)
    return path


def is_page_of(path: Path, config: TunedConfig) -> bool:
    """Whether ``path`` is an ``autotune.html`` written for this very config (the same search:
    its ``created_at`` and workload fingerprint, in the page's ``autotune-config`` meta tag)."""
    if not path.is_file():  # never opened: a FIFO there would wait for a writer forever
        return False
    try:
        with path.open("rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return f"<meta name=\"autotune-config\" content=\"{_e(_identity(config))}\">" in head


def _identity(config: TunedConfig) -> str:
    return f"{config.created_at} {config.workload_fingerprint}"


# ----------------------------------------------------------------------------------------------
# The page around the plots.


def _e(text: object) -> str:
    """Text from the file, safe in HTML and in plotly's labels (which read entities back)."""
    return html.escape(str(text), quote=True)


def _section(name: str, heading: str, drawn: Drawn, *after: str) -> str:
    """A heading, the plot (or why there is none) and the sentences under it, and tables."""
    return (f"<section id=\"{name}\"><h2>{_e(heading)}</h2>{_plot(name, drawn)}"
            + "".join(after) + "</section>")


def _summary(c: TunedConfig) -> str:
    """Item 5: the tuned config, the device and versions, and why it won (the terminal's lines)."""
    knobs = ", ".join(f"{f.name}={getattr(c.knobs, f.name)}" for f in fields(Knobs))
    rows = [
        ("tuned", f"micro_batch={c.micro_batch} x accumulate_steps={c.accumulate_steps} x "
                  f"world_size={c.world_size} = {c.effective_batch()} samples per step"),
        ("knobs", knobs + (", compile_dynamic=True" if c.compile_dynamic else "")),
        ("throughput", "-" if c.samples_per_s is None else (
            f"{c.samples_per_s:,.1f} samples/s"
            + (f", {c.speedup:.2f}x the baseline's {c.baseline_samples_per_s:,.1f}"
               + baseline_note(c) if c.speedup and c.baseline_samples_per_s else ""))),
        ("device", f"{c.device.name} ({c.device.device}), "
                   f"{format_bytes(c.device.total_memory_bytes)}"),
        ("versions", f"autotune {c.autotune_version}, torch {c.device.torch_version or '-'}, "
                     f"CUDA {c.device.cuda_version or '-'}; schema {c.schema}"),
        ("workload", f"{c.workload_name} ({c.workload.label()}, fingerprint "
                     f"{c.workload_fingerprint})"),
        ("written", c.created_at),
    ]
    if c.cost is not None:
        rows.append(("search", c.cost.describe()))
    if c.compile_artifacts is not None:
        rows.append(("first launch", f"compiled artifacts {c.compile_artifacts.describe()}"))
    banner = "".join(f"<p class=\"warn\">{_e(text)}</p>" for text in (
        c.stopped_early() if c.interrupted else "", not_reached_line(c),
        peak_unverified_line(c)) if text)
    return ("<section id=\"summary\"><h2>The tuned config</h2>" + banner
            + f"<p class=\"why\"><b>Why it won:</b> {_e(c.reason or '-')}</p>"
            + _table(None, rows)
            + "<h3>As in the terminal</h3><ul class=\"lines\">"
            + "".join(f"<li>{_e(line)}</li>" for line in summary_lines(c)) + "</ul></section>")


def _table(header: Sequence[str] | None, rows: Iterable[Sequence[object]]) -> str:
    head = ("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>") if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0}
"""Every plot's legend: one row above the plot area (the top margin grows to hold it)."""


def _plot(name: str, drawn: Drawn) -> str:
    """One plotly figure in its container (``data-plot``), drawn by the plotly.js inlined once
    in the head; once drawn, ``autotuneRendered`` records its size there."""
    import plotly.io

    if drawn.figure is None:
        return "".join(f"<p class=\"note\">Nothing to draw: {_e(n)}</p>" for n in drawn.notes)
    # The legend above the plot: below it, it lands on the x axis's title in a short plot
    # (the timeline's height grows with its runs; plotly places a legend at a share of it).
    drawn.figure.update_layout(template="plotly_white", legend=LEGEND,
                               margin={"l": 70, "r": 30, "t": 40, "b": 60})
    body = plotly.io.to_html(drawn.figure, full_html=False, include_plotlyjs=False,
                             div_id=f"plot-{name}", post_script='autotuneRendered("{plot_id}")',
                             config={"displaylogo": False, "responsive": True})
    return (f"<div class=\"plot\" data-plot=\"{name}\">{body}</div>"
            + "".join(f"<p class=\"note\">{_e(n)}</p>" for n in drawn.notes if n))


def _not_timed(c: TunedConfig) -> str:
    """The candidates that ran without a throughput, and those never run, with the reason."""
    failed = [(t.label(), t.verdict, t.reason or "-") for t in c.trials if not t.samples_per_s]
    out = ""
    if failed:
        out += "<h3>Ran, not timed</h3>" + _table(("candidate", "outcome", "why"), failed)
    rechecks = [s.sentence() for s in c.skips if s.rule == "recheck" or (
        s.rule == "note" and s.text.startswith("re-check of "))]  # a schema 2 file: no rules
    skipped = [s for s in c.skipped if s not in rechecks]
    if skipped:
        out += ("<h3>Not measured, with the measured reason</h3><ul class=\"lines\">"
                + "".join(f"<li>{_e(s)}</li>" for s in skipped) + "</ul>")
    if rechecks:
        out += ("<h3>Re-checked: stored runs measured again</h3><ul class=\"lines\">"
                + "".join(f"<li>{_e(s)}</li>" for s in rechecks) + "</ul>")
    return out


def _stored_runs(c: TunedConfig) -> str:
    stored = [r for r in c.runs if r.stored_at is not None]
    if not stored:
        return ""
    return ("<h3>Reused from the study store</h3>" + _table(
        ("run", "kind", "candidate", "status", "peak", "measured at"),
        [(f"#{r.number}", r.kind, r.label(), r.status, format_bytes(r.peak_bytes), r.stored_at)
         for r in stored]))


# ----------------------------------------------------------------------------------------------
# The page's own CSS and script.

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:0 auto;
padding:1em 2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em}h3{font-size:1em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}
.note{color:#555;font-size:.9em;margin:.3em 0}.lines{font-size:.9em}
.why{font-size:1.05em}.warn,#autotune-errors{background:#fde8e8;border:1px solid #d62728;
padding:.5em 1em}.plot{min-height:200px}
"""

_PAGE_SCRIPT = """
window.autotuneErrors = [];
function autotuneShowErrors() {
  var box = document.getElementById('autotune-errors');
  if (!box) { return; }
  box.textContent = '';
  window.autotuneErrors.forEach(function (message) {
    var line = document.createElement('p');
    line.textContent = message;
    box.appendChild(line);
  });
  box.setAttribute('data-error-count', String(window.autotuneErrors.length));
  box.hidden = window.autotuneErrors.length === 0;
}
function autotuneReport(message) {
  window.autotuneErrors.push('a plot failed to render: ' + message);
  autotuneShowErrors();
}
window.addEventListener('error', function (event) {
  autotuneReport(event.message || String(event.error || event));
});
window.addEventListener('unhandledrejection', function (event) {
  var reason = event.reason;
  autotuneReport((reason && reason.message) || String(reason));
});
function autotuneRendered(id) {
  var div = document.getElementById(id);
  var holder = div && div.closest('[data-plot]');
  var svg = div && div.querySelector('svg.main-svg');
  var size = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  if (!holder) { return; }
  holder.setAttribute('data-svg-width', String(Math.round(size.width)));
  holder.setAttribute('data-svg-height', String(Math.round(size.height)));
  holder.setAttribute('data-overlaps', autotuneOverlaps(div).join(' '));
  holder.setAttribute('data-rendered', 'yes');
}
function autotuneOverlaps(div) {
  // The legend's box against the axis titles' boxes: the names of those it covers.
  var legend = div.querySelector('g.legend');
  if (!legend) { return []; }
  var box = legend.getBoundingClientRect();
  var hit = [];
  div.querySelectorAll('text.xtitle, text.ytitle').forEach(function (title) {
    var t = title.getBoundingClientRect();
    if (t.width && box.width && t.left < box.right && box.left < t.right
        && t.top < box.bottom && box.top < t.bottom) {
      hit.push(title.getAttribute('class'));
    }
  });
  return hit;
}
document.addEventListener('DOMContentLoaded', autotuneShowErrors);
window.addEventListener('load', function () {
  setTimeout(function () {
    document.querySelectorAll('[data-plot]').forEach(function (holder) {
      if (holder.getAttribute('data-rendered') !== 'yes') {
        autotuneReport('the ' + holder.getAttribute('data-plot') + ' plot did not draw');
      }
    });
  }, 3000);
});
"""
