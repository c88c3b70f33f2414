"""``autotune.html`` (``autotune.report_html``, ``autotune.report_plots``) and ``autotune report``.

The page is checked three ways: its figures' data (what each plot draws), its text (escaped,
self-contained), and, where Chromium is installed, in a real browser (no script error, every
plot drawn with a size).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.api.deliver import write_outputs
from autotune.boundary import Point, fit_line
from autotune.cli import app
from autotune.errors import MissingDependencyError, OutputExistsError
from autotune.knobs import Knobs
from autotune.report_html import _plot, render_html, write_html
from autotune.report_plots import break_even_plot, memory_plot, throughput_plot, timeline_plot
from autotune.schema import RunRecord, SearchCost, TunedConfig, notes
from autotune.serialize import to_json_dict
from autotune.tuned_file import read_tuned
from tests.conftest import workload_target
from tests.tuned_configs import REPO, GiB, make_tuned, subprocess_env, write

sys.path.insert(0, str(REPO / "benchmarks"))
from html_screenshot import browser, page_state, screenshot

MiB = 1 << 20
FP32, BF16C = Knobs(), Knobs(precision="bf16", compile_mode="default")

try:
    runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
except TypeError:
    runner = CliRunner()


def _run(number: int, kind: str, knobs: Knobs, micro_batch: int, peak_mib: float | None,
         start_s: float, *, status: str = "ok", fits: bool = True, wall_s: float = 5.0,
         compile_s: float | None = None, timed_s: float = 0.0,
         stored_at: str | None = None) -> RunRecord:
    return RunRecord(number=number, kind=kind, knobs=knobs, micro_batch=micro_batch,  # type: ignore[arg-type]
                     status=status, fits=fits,  # type: ignore[arg-type]
                     peak_bytes=None if peak_mib is None else int(peak_mib * MiB),
                     start_s=start_s, wall_s=wall_s, compile_s=compile_s, timed_s=timed_s,
                     stored_at=stored_at)


def searched(**overrides) -> TunedConfig:
    """``make_tuned``'s result with what a real search adds: every run (probes, an OOM, a
    re-measurement, one reused from the study store), spreads, step times and the cost."""
    config = make_tuned()
    trials = tuple(replace(t, halfwidth=0.04, wall_s=6.0, timed_s=1.5, peak_bytes=int(
        (900 if t.knobs.precision == "fp32" else 600) * MiB * t.micro_batch / 32),
        median_step_s=t.median_step_s or 64 / (t.samples_per_s or 1)) for t in config.trials)
    runs = (
        _run(0, "trial", FP32, 16, 480, 0.0, stored_at="2026-11-21T09:00:00+00:00"),
        _run(1, "trial", FP32, 64, 1750, 0.0, timed_s=1.5, wall_s=6.0),
        _run(2, "probe", Knobs(compile_mode="default"), 64, None, 6.0, status="oom",
             fits=False, wall_s=3.0),
        _run(3, "trial", Knobs(compile_mode="default"), 32, 950, 9.0, compile_s=8.0,
             timed_s=1.5, wall_s=14.0),
        _run(4, "trial", Knobs(precision="bf16"), 16, 310, 23.0, timed_s=1.0),
        _run(5, "probe", BF16C, 64, 1900, 28.0, fits=False, compile_s=9.0, wall_s=12.0),
        _run(6, "trial", BF16C, 16, 330, 40.0, compile_s=7.5, timed_s=1.5, wall_s=12.0),
        _run(7, "re-measure", BF16C, 16, 330, 52.0, compile_s=0.5, timed_s=3.0, wall_s=6.0),
    )
    values = dict(
        trials=trials, runs=runs, skips=notes("fp16 skipped: not supported on Test CPU (cpu)"),
        cost=SearchCost(num_runs=8, child_s=64.0, compile_s=25.0, num_compiled_runs=4,
                        timed_s=10.0),
        memory=replace(config.memory, peak_bytes=330 * MiB))
    values.update(overrides)
    return replace(config, **values)


def _schema_1(config: TunedConfig) -> dict:
    """The JSON a schema 1 autotune wrote: precision and compile mode at the top and in each
    trial, no other knob, no runs, no cost, the skips as sentences."""
    data = to_json_dict(config)
    data.pop("runs"), data.pop("cost")
    data["skipped"] = [s["text"] for s in data.pop("skips")]

    def moved(holder: dict) -> dict:
        knobs = holder.pop("knobs")
        return {**holder, "precision": knobs["precision"], "compile_mode": knobs["compile_mode"]}

    return {**moved(data), "schema": 1, "trials": [moved(t) for t in data["trials"]]}


# ----------------------------------------------------------------------------------------------
# What each plot draws.


def test_memory_plot_draws_every_peak_the_fitted_line_the_budget_and_the_oom() -> None:
    config = searched()
    fig = memory_plot(config).figure
    traces = {t.name: t for t in fig.data}
    fp32 = traces["fp32/off: fits"]  # the stored run's peak is drawn with this search's
    assert sorted(fp32.x) == [16, 64] and sorted(fp32.y) == [480 / 1024, 1750 / 1024]  # GiB
    slope, intercept = fit_line([Point(micro_batch=16, peak_bytes=480 * MiB, fits=True),
                                 Point(micro_batch=64, peak_bytes=1750 * MiB, fits=True)])
    line = traces["fp32/off: fitted line"]
    assert line.y[0] == pytest.approx((slope * line.x[0] + intercept) / GiB)
    assert line.y[-1] == pytest.approx((slope * line.x[-1] + intercept) / GiB)
    oom = traces["fp32/default: out of memory (drawn at the budget)"]
    assert list(oom.x) == [64] and list(oom.y) == [2.0]  # the budget, in GiB
    assert list(traces["bf16/default: over the usable line"].x) == [64]
    budget = next(t for n, t in traces.items() if n.startswith("budget"))
    usable = next(t for n, t in traces.items() if n.startswith("usable"))
    assert budget.y[0] == 2.0 and usable.y[0] == pytest.approx(1.8)
    chosen = next(t for n, t in traces.items() if n.startswith("chosen"))
    assert list(chosen.x) == [16] and list(chosen.y) == [330 / 1024]
    assert fig.layout.yaxis.type != "log"


def test_memory_plot_turns_logarithmic_when_the_budget_dwarfs_the_peaks() -> None:
    config = searched()
    config = replace(config, memory=replace(config.memory, budget_bytes=400 * GiB,
                                            usable_bytes=360 * GiB))
    drawn = memory_plot(config)
    assert drawn.figure.layout.yaxis.type == "log"
    assert any("logarithmic" in note for note in drawn.notes)


def test_throughput_plot_marks_winner_and_baseline_with_error_bars() -> None:
    config = searched()
    fig = throughput_plot(config).figure
    traces = {t.name: t for t in fig.data}
    assert set(traces) == {"winner", "baseline", "ran, lost", "stopped early (clearly slower)"}
    winner = traces["winner"]
    assert list(winner.x) == [1210.0] and winner.orientation == "h"
    assert winner.error_x.array[0] == pytest.approx(1210.0 * 0.04)
    assert list(winner.y[0]) == ["bf16/default"] and list(winner.y[1]) == ["#3 16x4"]
    assert list(traces["baseline"].y[0]) == ["fp32/off"]
    assert fig.layout.shapes[0].x0 == 800.0  # the baseline's line
    noisy = throughput_plot(replace(config, trials=tuple(
        replace(t, halfwidth=3.0) for t in config.trials)))
    bar = noisy.figure.data[0]
    assert bar.error_x.arrayminus[0] == bar.x[0] < bar.error_x.array[0]  # never below 0
    assert noisy.figure.layout.xaxis.range[1] == pytest.approx(1.05 * 1.5 * 1210.0)
    assert "cut at the axis's end" in noisy.notes[0]


def test_timeline_bars_add_up_to_each_run_and_leave_out_stored_runs() -> None:
    config = searched()
    fig = timeline_plot(config).figure
    other, compile_, timed = fig.data
    assert [t.name for t in fig.data] == ["start-up, warm-up and memory steps", "compile",
                                          "timed steps"]
    assert len(other.y) == 7 and not any("#0 " in y for y in other.y)  # #0 came from the store
    for i, run in enumerate(config.runs[1:]):
        assert other.x[i] + compile_.x[i] + timed.x[i] == pytest.approx(run.wall_s)
        assert other.base[i] == run.start_s
        assert compile_.base[i] == pytest.approx(run.start_s + other.x[i])
    assert list(other.marker.pattern.shape).count(".") == 2  # the two probes
    page = render_html(config)
    assert "Reused from the study store" in page and "2026-11-21T09:00:00+00:00" in page


def test_timeline_says_a_run_cut_by_the_budget_and_keeps_its_legend_off_the_axis() -> None:
    """Issue 62: the run ``--time-budget`` cut short was labelled ``(timeout)``, as a
    candidate that hangs is; and the legend (a share of the plot's height below it) sat on the
    x axis's title in a short timeline. The cut run says so; every plot's legend is a row
    above its plot area (the browser test measures the boxes)."""
    runs = searched().runs
    cut = replace(runs[4], status="timeout", cut=True, peak_bytes=None)
    hung = replace(runs[5], status="timeout")
    config = searched(runs=(*runs[:4], cut, hung))
    names = list(timeline_plot(config).figure.data[0].y)
    assert names[-2:] == ["#4 trial bf16/off 16 (cut by the budget)",
                          "#5 probe bf16/default 64 (timeout)"]
    page = render_html(config)
    for plot in (memory_plot, throughput_plot, timeline_plot, break_even_plot):
        drawn = plot(config)
        assert drawn.figure is not None
        _plot(plot.__name__, drawn)  # the page's layout, as the page draws it
        legend = drawn.figure.layout.legend
        assert legend.yanchor == "bottom" and legend.y >= 1 and legend.orientation == "h"
    assert "(cut by the budget)" in page


def test_break_even_plot_crosses_at_the_break_even_step() -> None:
    config = searched()
    fig = break_even_plot(config).figure
    baseline, winner = fig.data
    assert baseline.y[0] == 0 and winner.y[0] == pytest.approx(12.3)  # the winner's compile
    slope = lambda t: (t.y[1] - t.y[0]) / (t.x[1] - t.x[0])  # noqa: E731
    crossing = (winner.y[0] - baseline.y[0]) / (slope(baseline) - slope(winner))
    assert crossing == pytest.approx(12.3 / (0.08 - 0.053))
    assert fig.layout.shapes[0].x0 == config.break_even_steps
    eager = break_even_plot(replace(config, break_even_steps=None, trials=tuple(
        replace(t, knobs=t.knobs.with_(compile_mode="off")) for t in config.trials)))
    assert eager.notes == ("The winner runs eager: no compile time to pay back.",)


# ----------------------------------------------------------------------------------------------
# The page.


def test_page_is_self_contained_with_four_plots_and_the_summary() -> None:
    import plotly.offline

    config = searched()
    page = render_html(config)
    for name in ("memory", "throughput", "timeline", "break-even"):
        assert page.count(f'data-plot="{name}"') == 1, name
    assert page.count(plotly.offline.get_plotlyjs()[:2000]) == 1  # inlined once
    assert "<script src" not in page and "<link" not in page  # nothing fetched at view time
    assert config.reason in page and "Test CPU" in page and "torch 2.13.0" in page
    assert "fp16 skipped: not supported on Test CPU (cpu)" in page  # the measured reason
    assert "compile pays for itself after 456 optimizer steps" in page  # the terminal's line
    assert "8 child runs, 64 s (compile 25 s, timed steps 10 s" in page


def test_text_from_the_file_is_escaped() -> None:
    evil = '<script>alert("x")</script>'
    config = searched(workload_name=evil, reason=f"won: <img src=x onerror=alert(1)> {evil}",
                      skips=notes(f"skipped {evil}"))
    trials = tuple(replace(t, reason=evil) for t in config.trials)
    page = render_html(replace(config, trials=trials))
    assert "<script>alert" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_schema_1_file_renders(tmp_path: Path) -> None:
    """An old file has no runs and no cost: the memory plot takes the trials' peaks and the
    timeline lays the trials end to end, each saying so."""
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps(_schema_1(searched())))
    config = read_tuned(path)
    assert config.runs == () and config.cost is None
    page = render_html(config)
    for name in ("memory", "throughput", "timeline", "break-even"):
        assert f'data-plot="{name}"' in page, name
    assert "the trials&#x27; peaks only, no probes" in page
    assert "the trials are laid end to end" in page


def test_write_html_never_replaces_a_file_without_force(tmp_path: Path) -> None:
    path = tmp_path / "autotune.html"
    path.write_text("mine")
    with pytest.raises(OutputExistsError):
        write_html(searched(), path)
    assert path.read_text() == "mine"
    assert write_html(searched(), path, force=True) == path
    assert path.read_text().startswith("<!DOCTYPE html>")


def test_without_plotly_the_report_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly.offline", None)  # import fails
    with pytest.raises(MissingDependencyError, match=r"autotune\.html needs plotly"):
        render_html(searched())
    config_path = write(searched(), tmp_path / "autotune.json")
    result = runner.invoke(app, ["report", str(config_path)])
    assert result.exit_code == 2, result.output
    assert "pip install plotly" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "autotune.html").exists()


# ----------------------------------------------------------------------------------------------
# The search writes it beside autotune.json.


def test_search_outputs_include_the_page(tmp_path: Path) -> None:
    write_outputs(searched(), tmp_path / "autotune.json", tmp_path / "train_autotuned.py",
                  force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "autotune.html", "autotune.json", "train_autotuned.py"]
    assert 'data-plot="memory"' in (tmp_path / "autotune.html").read_text()


def test_a_page_that_cannot_be_rendered_costs_neither_config_nor_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.api.deliver as deliver

    def missing(_config: TunedConfig) -> str:
        raise MissingDependencyError("autotune.html needs plotly (No module named 'plotly')")

    monkeypatch.setattr(deliver, "render_html", missing)
    with pytest.warns(UserWarning) as caught:
        write_outputs(searched(), tmp_path / "autotune.json", tmp_path / "train_autotuned.py",
                      force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json", "train_autotuned.py"]
    message = str(caught[0].message)
    assert f"{tmp_path / 'autotune.html'} not written: MissingDependencyError" in message
    assert f"`autotune report {tmp_path / 'autotune.json'}` writes the page" in message


def test_a_page_written_meanwhile_is_kept_and_this_searchs_goes_beside_it(
        tmp_path: Path) -> None:
    (tmp_path / "autotune.html").write_text("another search's")
    with pytest.raises(OutputExistsError) as info:
        write_outputs(searched(), tmp_path / "autotune.json", tmp_path / "train_autotuned.py",
                      force=False)
    assert (tmp_path / "autotune.html").read_text() == "another search's"
    assert (tmp_path / "autotune-2.html").read_text().startswith("<!DOCTYPE html>")
    assert f"This search's report is in {tmp_path / 'autotune-2.html'}" in str(info.value)
    assert (tmp_path / "autotune.json").is_file() and (tmp_path / "train_autotuned.py").is_file()


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_real_search_writes_the_page_of_its_own_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, [
        "search", "--workload", workload_target("tiny"), "--target-batch", "2", "--device",
        "cpu", "--precisions", "fp32", "--compile-modes", "off", "--timed-steps", "3",
        "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    config = read_tuned(tmp_path / "autotune.json")
    page = (tmp_path / "autotune.html").read_text()
    assert f"and {tmp_path / 'autotune.html'} (open it in a browser" in " ".join(
        result.stdout.split())
    assert html.escape(config.reason) in page and 'data-plot="timeline"' in page
    bars = timeline_plot(config).figure.data[0].y  # every run of this search on the timeline
    assert config.runs and [y.split(" (")[0] for y in bars] == [
        f"#{r.number} {r.kind} {r.label()}" for r in config.runs]


def test_search_refuses_up_front_when_the_page_exists(tmp_path: Path) -> None:
    (tmp_path / "autotune.html").write_text("mine")
    result = runner.invoke(app, ["search", "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "autotune.html already exists and was not overwritten" in " ".join(
        result.stderr.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.html"]


# ----------------------------------------------------------------------------------------------
# autotune report.


def test_report_writes_the_page_beside_the_config(tmp_path: Path) -> None:
    config_path = write(searched(), tmp_path / "autotune.json")
    result = runner.invoke(app, ["report", str(config_path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'autotune.html'}" in result.stderr
    assert (tmp_path / "autotune.html").read_text().startswith("<!DOCTYPE html>")
    out = tmp_path / "elsewhere" / "page.html"
    result = runner.invoke(app, ["report", str(config_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_report_of_a_truncated_config_exits_2_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps(to_json_dict(searched()), indent=2)[:2000])
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert f"error: {path} is not valid JSON" in message and "Traceback" not in message
    assert not (tmp_path / "autotune.html").exists()


def test_report_never_overwrites_a_page_without_force(tmp_path: Path) -> None:
    config_path = write(searched(), tmp_path / "autotune.json")
    page = tmp_path / "autotune.html"
    page.write_text("mine")
    result = runner.invoke(app, ["report", str(config_path)])
    assert result.exit_code == 2, result.output
    assert "already exists and was not overwritten: pass --force" in " ".join(
        result.stderr.split())
    assert page.read_text() == "mine"
    result = runner.invoke(app, ["report", str(config_path), "--force"])
    assert result.exit_code == 0, result.output
    assert page.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.subprocess
def test_report_command_runs_as_installed(tmp_path: Path) -> None:
    """The real command, in its own process: a schema 1 file, the page written, no torch."""
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps(_schema_1(searched())))
    code = ("import sys, autotune.cli; sys.argv = ['autotune', 'report', sys.argv[1]]\n"
            "try:\n    autotune.cli.main()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wrote {tmp_path / 'autotune.html'}" in done.stderr
    assert "no torch" in done.stdout  # `autotune report` stays light: it never loads torch
    assert (tmp_path / "autotune.html").stat().st_size > 1_000_000  # plotly.js inlined


# ----------------------------------------------------------------------------------------------
# In a real browser.

needs_browser = pytest.mark.skipif(
    browser() is None, reason="no chromium, chromium-browser or google-chrome on PATH: "
                              "install one (apt-get install chromium) to run the browser test")


# slow: a real browser; the everyday run keeps the page's HTML, script and data checked in this
# process
@pytest.mark.slow
@pytest.mark.subprocess
@needs_browser
def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = write_html(searched(workload_name='<script>alert("x")</script>'),
                      tmp_path / "autotune.html")
    state = page_state(page)
    assert state.error_count == 0, state.errors
    assert set(state.plots) == {"memory", "throughput", "timeline", "break-even"}
    for name, attrs in state.plots.items():
        assert attrs.get("data-rendered") == "yes", (name, attrs)
        assert int(attrs["data-svg-width"]) > 0 and int(attrs["data-svg-height"]) > 0, name
        assert attrs.get("data-overlaps") == "", (name, attrs)  # no axis title under a legend
    png = screenshot(page, tmp_path / "autotune_html.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


# slow: a real browser; the everyday run keeps the page's HTML, script and data checked in this
# process
@pytest.mark.slow
@pytest.mark.subprocess
@needs_browser
def test_page_shows_its_own_script_errors_and_undrawn_plots(tmp_path: Path) -> None:
    """What the browser test relies on: a broken page says so (a plot that throws, and one
    that never draws)."""
    html_text, count = re.subn(r'Plotly\.newPlot\((\s*"plot-memory")',
                               r"Plotly.noSuchFunction(\1", render_html(searched()))
    assert count == 1
    page = tmp_path / "broken.html"
    page.write_text(html_text)
    state = page_state(page)
    assert state.error_count and state.error_count >= 2, state
    assert any("Plotly.noSuchFunction is not a function" in e for e in state.errors), state
    assert any("the memory plot did not draw" in e for e in state.errors), state
    assert state.plots["memory"].get("data-rendered") is None
    assert state.plots["throughput"].get("data-rendered") == "yes"


def test_re_checks_of_stored_runs_are_listed_apart_from_what_was_not_measured() -> None:
    recheck = ("re-check of bf16/default/32 (stored run): 300.0 samples/s stored, 180.0 now, "
               "slower beyond the noise (5%): the fresh run counts")
    page = render_html(searched(skips=notes("bf16/max-autotune not tried: behind", recheck)))
    not_measured = page.split("Not measured, with the measured reason", 1)[1]
    skipped_part, rechecked = not_measured.split("Re-checked: stored runs measured again", 1)
    assert html.escape(recheck) not in skipped_part
    assert html.escape(recheck) in rechecked.split("</ul>", 1)[0]


def test_timeline_draws_one_lane_per_slot_of_a_parallel_search() -> None:
    runs = searched().runs
    slots = ("cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:0")
    config = searched(runs=(runs[0], *(replace(r, slot=s) for r, s in zip(
        runs[1:6], slots[1:], strict=True)), replace(runs[6], slot="cuda:1")))
    drawn = timeline_plot(config)
    bars = drawn.figure.data[0]
    assert list(bars.y) == ["cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert bars.hovertext[3].startswith("#4 trial bf16/off 16 [cuda:1]: ")
    assert "One lane per slot of 2" in " ".join(drawn.notes)
    assert timeline_plot(searched()).figure.data[0].y[0] == "#1 trial fp32/off 64"


def test_timeline_of_a_joined_node_names_the_node_in_each_lane_and_bar() -> None:
    """--join (issue 60): the node that ran each run, host:pid as its claim names it, beside
    its slot; without slots one lane for the node."""
    runs = searched().runs
    node = "node5:4121"
    drawn = timeline_plot(searched(runs=tuple(replace(r, node=node) for r in runs)))
    bars = drawn.figure.data[0]
    assert set(bars.y) == {node}
    assert bars.hovertext[0].startswith(f"#1 trial fp32/off 64 [{node}]: ")
    assert "One lane per node and slot of 1 that ran children (--join)" in " ".join(drawn.notes)
    both = timeline_plot(searched(runs=tuple(replace(r, node=node, slot="cuda:1")
                                             for r in runs)))
    assert set(both.figure.data[0].y) == {f"{node} cuda:1"}
