"""Text from the user's side reaches the terminal as typed, on every printing path.

A workload's name, a workload's exception message, a rank's gloo line such as
``[/__w/pytorch/.../pair.cc:553] Connection closed by peer``, a cache folder or a study name
is never read as Rich markup (``[/]`` raised ``MarkupError``: exit 3; ``[rank1]`` vanished) nor
as an emoji code (``:smile:``). Each path prints through the console the CLI builds
(``cli.output.plain_console``), recorded here.
"""

from __future__ import annotations

import dataclasses
import io
import textwrap
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

from autotune import report, report_estimate, report_progress
from autotune.cli import app
from autotune.cli import output as cli
from autotune.config import MemoryProbe, ProbeReport, ProbeStep, StopReason, WorkloadSpec
from autotune.errors import ConfigError, WorkloadError
from autotune.estimate.fits import EstimateReport
from autotune.estimate.trace import StepEstimate
from autotune.knobs import Knobs
from autotune.schema import SearchResult, StudyRecord, TrialRecord, notes
from autotune.search._store import StoredStudy
from tests.tuned_configs import CPU, make_tuned

MIB = 1 << 20
GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection " \
       "closed by peer [127.0.0.1]:34567"
HOSTILE = [GLOO, "[/]", "[rank1]", "[c10d]", ":smile:", "[bold red]x[/bold red]", "\\[/]",
           "[link=file:///etc]x[/link]", "[/red]", "[", "]", "{task.description}", "%s"]

texts = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet="[]/:\\{}%@#=.-_ ab1", min_size=1, max_size=40),
    st.lists(st.sampled_from(HOSTILE + ["a", " ", "/", ":"]), min_size=1, max_size=6).map(
        "".join),
).filter(lambda t: t.strip())


def _console() -> tuple[Console, io.StringIO]:
    """The CLI's console, wide enough that no cell wraps, writing into a buffer."""
    buffer = io.StringIO()
    return cli.plain_console(file=buffer, width=100_000), buffer


def _printed(*renderables: object) -> str:
    console, buffer = _console()
    for renderable in renderables:
        console.print(renderable)
    return buffer.getvalue()


def _shows(output: str, text: str) -> bool:
    """``text`` is in ``output`` as typed (a table's title wraps at the table's width:
    whitespace aside)."""
    return "".join(text.split()) in "".join(output.split())


def _probe_report(text: str) -> ProbeReport:
    knobs = Knobs()
    probe = MemoryProbe(
        knobs=knobs, max_micro_batch=0, peak_bytes=None, budget_bytes=100 * MIB,
        usable_bytes=90 * MIB, candidates=(1, 2),
        steps=(ProbeStep(micro_batch=1, status="error", peak_bytes=None, fits=False,
                         message=text),), notes=(text,))
    return ProbeReport(
        workload=WorkloadSpec(kind="file", target=f"{text}.py:f"),
        device=dataclasses.replace(CPU, name=text), target_batch=2, world_size=1,
        headroom=0.1, budget_bytes=100 * MIB, probes=(probe,), skipped=(text,))


def _search_result(text: str) -> SearchResult:
    base = make_tuned()
    failed = TrialRecord(number=4, micro_batch=16, accumulate_steps=4, knobs=Knobs(),
                         verdict="workload_error", reason=text)
    config = dataclasses.replace(
        base, workload_name=text, trials=(*base.trials, failed), skips=notes(text),
        reason=text, interrupted=True,
        study=StudyRecord(storage=f"sqlite:///{text}/studies.db", name=text, note=text))
    return SearchResult(config=config, path=Path(text) / "autotune.json",
                        probe=_probe_report(text), stop_reason=StopReason("time-budget", text))


def _estimate(text: str) -> EstimateReport:
    step = StepEstimate(
        micro_batch=1, knobs=Knobs(), kernels="cpu", peak_bytes=MIB, parameters_bytes=MIB,
        gradients_bytes=0, optimizer_bytes=0, inputs_bytes=0, activations_bytes=0,
        temporaries_bytes=0, peak_phase="forward", num_parameters=10, trace_s=0.1)
    return EstimateReport(workload_name=text, estimate=step, device_memory_bytes=8 * MIB,
                          headroom=0.1, usable_bytes=7 * MIB, max_micro_batch=1,
                          max_peak_bytes=MIB, target_batch=2, pairs=((1, 2),), notes=(text,))


@settings(max_examples=60, deadline=None)
@given(text=texts)
def test_user_text_prints_as_typed_on_every_path(text: str) -> None:
    result = _search_result(text)
    probe = _probe_report(text)
    paths = {
        "trial line": [report_progress.trial_line(result.config.trials[-1], "stage")],
        "probe step line": [report_progress.probe_step_line(text, probe.probes[0].steps[0])],
        "probe table": [report.probe_table(probe)],
        "probe footer": report.probe_footer(probe),
        "search table": [report.search_table(result.config)],
        "search footer": report.search_footer(result),
        "estimate lines": report_estimate.estimate_lines(_estimate(text)),
        "check message": [text],
        "cache list": [report.cache_table(Path(text), [StoredStudy(
            text, {"workload": text, "target_batch": 8, "device": text}, 3, None)])],
    }
    for path, renderables in paths.items():
        output = _printed(*renderables)
        assert _shows(output, text), (path, text, output)


@settings(max_examples=30, deadline=None)
@given(text=texts)
def test_an_error_message_prints_as_typed_with_its_exit_code(text: str) -> None:
    console, buffer = _console()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "err", console)
        for error in (ConfigError(text), WorkloadError(text)):
            with pytest.raises(typer.Exit) as exit_info, cli.exits():
                raise error
            assert exit_info.value.exit_code == error.exit_code == 2
    assert buffer.getvalue().count(f"error: {text}\n") == 2, buffer.getvalue()


@settings(max_examples=30, deadline=None)
@given(text=texts)
def test_a_progress_description_prints_as_typed(text: str) -> None:
    console, buffer = _console()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "err", console)
        with cli.progress_bar() as progress:
            progress.add_task(text, total=None)
            console.print(progress)  # what the live display draws
    assert _shows(buffer.getvalue(), text), buffer.getvalue()


def test_autotunes_own_styles_stay() -> None:
    """Styling comes from the ``Text`` autotune builds: the winner is bold green, a class
    that fits nothing says ``none`` in red, the error prefix is bold red."""
    table = report.search_table(make_tuned())
    status = table.columns[3]._cells[3]  # wraps between its words (report_width.Pieces)
    assert str(status) == "winner" and status.style == "bold green"
    none = report.probe_table(_probe_report("x")).columns[1]._cells[0]
    assert isinstance(none, Text) and none.plain == "none" and str(none.style) == "red"


# ----------------------------------------------------------------------------------------------
# The whole command, its workload's text included.

try:
    runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
except TypeError:
    runner = CliRunner()

FAST = ["--device", "cpu", "--precisions", "fp32", "--compile-modes", "off", "--target-batch",
        "1"]
NAME = "odd [/] name [rank1] [c10d] :smile:"
FOLDER = "w [/c10d] [rank1] :smile:"  # [/c10d]: a closing tag spanning two folders


def _workload_file(tmp_path: Path) -> Path:
    """A workload file in a folder whose name has brackets; its workload's name has them."""
    path = tmp_path / FOLDER / "hostile.py"
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent(f'''
        import torch
        from torch import nn

        from autotune import Workload


        def _batch(micro_batch):
            return torch.randn(micro_batch, 4), torch.randn(micro_batch, 1)


        def _loss(model, batch):
            x, y = batch
            return nn.functional.mse_loss(model(x), y)


        def named():
            return Workload(name={NAME!r}, build_model=lambda: nn.Linear(4, 1),
                            make_batch=_batch, loss=_loss)


        def fails():
            def loss(model, batch):
                raise RuntimeError({GLOO + " [/]"!r})

            return Workload(name={NAME!r}, build_model=lambda: nn.Linear(4, 1),
                            make_batch=_batch, loss=loss)
        '''))
    return path


# slow: the everyday run keeps a workload name and path with brackets, printed
# as typed
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_workload_error_with_brackets_exits_2_and_prints_as_typed(tmp_path: Path) -> None:
    workload = f"{_workload_file(tmp_path)}:fails"
    for command in (["search", "--out", str(tmp_path / "out")], ["probe"]):
        result = runner.invoke(app, [*command, *FAST, "--workload", workload])
        assert result.exit_code == 2, result.output
        assert f"RuntimeError: {GLOO} [/]" in result.stderr
        assert "internal error" not in result.stderr


@pytest.mark.subprocess
def test_a_workload_name_and_path_with_brackets_print_as_typed(tmp_path: Path) -> None:
    workload = f"{_workload_file(tmp_path)}:named"
    probe = runner.invoke(app, ["probe", *FAST, "--workload", workload])
    assert probe.exit_code == 0, probe.output
    assert _shows(probe.stdout, workload)  # the probe table's title
    out = tmp_path / FOLDER / "out"
    search = runner.invoke(app, ["search", *FAST, "--workload", workload, "--out", str(out),
                                     "--max-trials", "2", "--no-cache"])
    assert search.exit_code == 0, search.output
    assert _shows(search.stdout, f"autotune search — {NAME} on")  # the search table's title
    assert _shows(search.stdout, f"wrote {out / 'autotune.json'}")

