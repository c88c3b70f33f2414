"""`autotune verify`: a searched config run as a user's loop runs it (``cfg.apply``,
``cfg.build_optimizer``, ``cfg.compile``, ``cfg.train_step``), in a fresh capped child, its
samples/s and peak, counted as the search counts it, beside what the search reported
(issue 62)."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from autotune import api
from autotune.cli import app
from autotune.config import DeviceInfo, WorkloadSpec
from autotune.errors import ConfigError
from autotune.search import SearchSettings
from autotune.tuned_file import read_tuned
from autotune.units import GIB, MIB, format_bytes
from tests.conftest import ROOT, workload_target
from tests.test_reliability import _no_survivors, _tagged
from tests.tuned_configs import small, subprocess_env, write

runner = CliRunner()
TINY = WorkloadSpec(kind="file", target=workload_target("tiny"))


def _words(text: str) -> str:
    return " ".join(text.split())


def tiny_config(folder: Path, *, peak_mib: int = 40, **changes: object) -> Path:
    """A hand-made CPU autotune.json of the tiny workload: fp32 eager, 2 x 2, a 2 GiB cap, a
    reported peak of ``peak_mib``."""
    base = small(workload=TINY, workload_name="tiny-wide-mlp")
    memory = dataclasses.replace(base.memory, device_total_bytes=2 * GIB, budget_bytes=2 * GIB,
                                 usable_bytes=int(1.8 * GIB), peak_bytes=peak_mib * MIB)
    return write(dataclasses.replace(base, memory=memory, **changes), folder / "autotune.json")


DOC = ROOT / "docs" / "using-the-result.md"
USER_LOOP = """\
import sys
sys.path.insert(0, {tests!r})
from workloads import tiny
workload = tiny()
build_model, make_optimizer = workload.build_model, workload.make_optimizer

def make_micro_batches(micro_batch, accumulate_steps):
    return [workload.make_batch(micro_batch) for _ in range(accumulate_steps)]

"""


def _doc_snippet() -> str:
    """The block of docs/using-the-result.md that counts a peak in the user's own process."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
              if "VmPeak" in b]
    assert len(blocks) == 1
    return blocks[0]


def _within_headroom(measured: int, reported: int, headroom: float) -> bool:
    return abs(measured / reported - 1) <= headroom


@pytest.mark.subprocess
def test_a_searched_config_in_a_users_loop_peaks_as_the_search_reported(tmp_path: Path) -> None:
    """A real tiny search, then its config in a user's loop: the documented few lines in a
    process of their own (the user's), and ``autotune verify`` (the library path in a fresh
    capped child). Each peak, counted as the search counts it, is the reported one within the
    config's headroom; verify says the samples/s, both ratios and the verdict (exit 0)."""
    result = api.search(TINY, target_batch=4, device="cpu", memory_budget="2GiB",
                        precisions=["fp32"], compile_modes=["off"], out=tmp_path,
                        settings=SearchSettings(num_timed_steps=3, min_timed_s=0.1,
                                                micro_batches_per_class=1, num_confirm=0))
    path = tmp_path / "autotune.json"
    config = read_tuned(path)
    reported, headroom = result.config.memory.peak_bytes, config.memory.headroom
    assert config.memory.peak_verified is True  # eager: nothing to check as a first launch

    env = {**subprocess_env(), "MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"}
    mine = subprocess.run(
        [sys.executable, "-c", USER_LOOP.format(tests=str(ROOT / "tests")) + _doc_snippet()],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert mine.returncode == 0, mine.stderr
    said = re.fullmatch(r"[\d.]+ samples/s\npeak ([\d.]+) MiB\n", mine.stdout)
    assert said is not None, mine.stdout
    own_peak = int(float(said.group(1)) * MIB)
    assert _within_headroom(own_peak, reported, headroom), (own_peak, reported)

    found = api.verify(path, num_timed_steps=3)
    assert found.reported_peak_bytes == reported and found.peak_bytes is not None
    assert _within_headroom(found.peak_bytes, reported, headroom), found.lines
    assert found.as_reported and found.limit_bytes == int(reported * (1 + headroom))
    assert found.samples_per_s and found.reported_samples_per_s == config.samples_per_s
    assert len(found.run.result.step_times_s) == 3

    cli = runner.invoke(app, ["verify", str(path), "--steps", "3"])
    assert cli.exit_code == 0, cli.output
    text = _words(cli.output)
    assert f"{path}: {config.knobs.label()} {config.micro_batch}x{config.accumulate_steps} on " \
        "cpu, run as " \
        "your loop runs it (cfg.apply, cfg.build_optimizer, cfg.compile, cfg.train_step)" in text
    assert re.search(r"samples/s: [\d,.]+ measured \(median of 3 timed steps\), "
                     + re.escape(f"{config.samples_per_s:,.1f} reported: ") + r"[\d.]+x", text)
    assert re.search(r"peak: [\d.]+ MiB measured, "
                     + re.escape(f"{format_bytes(reported)} reported: ") + r"[\d.]+x", text)
    assert "the peak counts the process's address-space high-water mark (VmPeak" in text
    assert (f"as reported: the peak is within {format_bytes(int(reported * 1.1))} (the reported "
            f"{format_bytes(reported)} plus its 10% headroom), margin ") in text


@pytest.mark.subprocess
def test_a_peak_over_the_reported_one_plus_headroom_is_not_as_reported(tmp_path: Path) -> None:
    """The file reports 1 MiB, far below what the tiny model's step takes: exit 1, though the
    loop is well within the budget (the verdict is the report's, not only the budget's)."""
    path = tiny_config(tmp_path, peak_mib=1)
    found = api.verify(path, num_timed_steps=2)
    assert not found.as_reported and found.peak_bytes is not None
    assert found.peak_bytes < found.usable_bytes  # within the budget less headroom
    cli = runner.invoke(app, ["verify", str(path), "--steps", "2"])
    assert cli.exit_code == 1, cli.output
    text = _words(cli.output)
    assert "1.00 MiB reported: " in text
    over = re.search(r"not as reported: the peak is over 1\.10 MiB \(the reported 1\.00 MiB plus "
                     r"its 10% headroom\) by ([\d.]+) MiB$", text)
    assert over is not None, text
    assert float(over.group(1)) > 5


@pytest.mark.subprocess
def test_a_loop_that_runs_out_of_memory_under_the_cap_is_not_as_reported(tmp_path: Path) -> None:
    path = tiny_config(tmp_path)
    config = read_tuned(path)
    memory = dataclasses.replace(config.memory, budget_bytes=8 * MIB, usable_bytes=7 * MIB,
                                 peak_bytes=6 * MIB)
    path = write(dataclasses.replace(config, memory=memory), tmp_path / "tight.json")
    cli = runner.invoke(app, ["verify", str(path), "--steps", "2"])
    assert cli.exit_code == 1, cli.output
    text = _words(cli.output)
    assert "peak: over the 8.00 MiB cap (the loop ran out of memory" in text
    assert "6.00 MiB reported" in text
    assert text.endswith("not as reported: over 6.60 MiB (the reported 6.00 MiB plus its 10% "
                         "headroom) (the loop ran out of memory under its 8.00 MiB cap)")


UNCHECKED = ("not checked as a first launch compiles it (its runs loaded its graphs from "
             "inductor's cache, which lowers the peak): --time-budget reached during a run of "
             "fp32/default 8 (stopped): best so far")


def test_an_unverified_peak_is_said_in_the_file_the_footer_the_page_and_check(
        tmp_path: Path) -> None:
    """A compiled CPU winner whose first-launch check a limit cut: ``memory.peak_verified``
    false in autotune.json (read back as written), and every place that shows its peak says
    it is unverified, why, and what measures it."""
    from autotune.builtin_workloads import default_workload
    from autotune.report import summary_lines
    from autotune.report_html import render_html
    from tests.test_check import measured_config

    path = measured_config(tmp_path, 300 * MIB, compile_mode="default")
    config = read_tuned(path)
    assert config.memory.peak_verified is None  # a file from before the field: nothing said
    assert not [line for line in summary_lines(config) if "unverified" in line]
    memory = dataclasses.replace(config.memory, peak_verified=False, peak_unverified=UNCHECKED)
    write(dataclasses.replace(config, memory=memory), path)
    data = json.loads(path.read_text())["memory"]
    assert data["peak_verified"] is False and data["peak_unverified"] == UNCHECKED
    config = read_tuned(path)
    said = (f"peak unverified: {UNCHECKED}; `autotune verify` measures a first launch of it")
    lines = summary_lines(config)  # the head of the search's footer and of the page
    assert lines[lines.index(next(x for x in lines if x.startswith("memory: "))) + 1] == said
    page = render_html(config)
    assert f'<p class="warn">{html.escape(said)}</p>' in page
    result = api.check(path, measure=False, workload=default_workload("cpu"))
    assert result.message.endswith(f"; the search's {said}")


def test_verify_of_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    cli = runner.invoke(app, ["verify", str(tmp_path / "autotune.json")])
    assert cli.exit_code == 2, cli.output
    assert f"{tmp_path / 'autotune.json'} does not exist: run `autotune search` to create it" \
        in _words(cli.output)


@pytest.mark.parametrize(("text", "said"), [
    ('{"schema": 1, "micro', "is not valid JSON (Unterminated string starting at: line 1 "
     "column 15 (char 14)); re-run `autotune search`"),
    ("[1, 2]", "is not an autotune.json file: it holds a JSON array, not a JSON object"),
    ('{"schema": 99}', "has schema 99; this autotune reads schema 1, 2 and 3: upgrade autotune"),
])
def test_verify_of_a_file_that_is_not_an_autotune_json_is_bad_input(
        tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "autotune.json"
    path.write_text(text)
    cli = runner.invoke(app, ["verify", str(path)])
    assert cli.exit_code == 2, cli.output
    assert f"{path} {said}" in _words(cli.output)
    with pytest.raises(ConfigError, match=re.escape(said)):
        api.verify(path)


def test_verify_of_a_bad_field_names_it_and_runs_nothing(tmp_path: Path) -> None:
    path = tiny_config(tmp_path)
    data = json.loads(path.read_text())
    data["memory"]["headroom"] = 1.5
    path.write_text(json.dumps(data))
    cli = runner.invoke(app, ["verify", str(path)])
    assert cli.exit_code == 2, cli.output
    assert (f"{path} is not a valid autotune config (1 problem): memory.headroom: got 1.5: "
            "must be a fraction in [0, 1)") in _words(cli.output)


def test_verify_settings_out_of_range_are_config_errors(tmp_path: Path) -> None:
    path = tiny_config(tmp_path)
    with pytest.raises(ConfigError, match=r"timed steps must be 1 to 10000, got 0; timeout must "
                                          r"be a positive number of seconds, got -1"):
        api.verify(path, num_timed_steps=0, timeout_s=-1)
    cli = runner.invoke(app, ["verify", str(path), "--steps", "0"])
    assert cli.exit_code == 2, cli.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_verify_of_a_file_tuned_on_a_gpu_on_a_machine_without_one_is_bad_input(
        tmp_path: Path) -> None:
    gpu = DeviceInfo(device="cuda:0", name="NVIDIA H200", total_memory_bytes=140 * GIB,
                     available_memory_bytes=140 * GIB, supports_bf16=True, supports_fp16=True,
                     supports_tf32=True)
    path = tiny_config(tmp_path, device=gpu)
    cli = runner.invoke(app, ["verify", str(path)])
    assert cli.exit_code == 2, cli.output
    assert (f"{path} was tuned on cuda:0 (NVIDIA H200) and this machine has no CUDA device: "
            "verify runs the config where it was tuned") in _words(cli.output)


def test_verify_of_a_config_whose_workload_file_is_gone_is_bad_input(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text((ROOT / "tests" / "workloads.py").read_text())
    path = tiny_config(tmp_path, workload=WorkloadSpec(kind="file", target=f"{model}:tiny"))
    model.unlink()
    cli = runner.invoke(app, ["verify", str(path)])
    assert cli.exit_code == 2, cli.output
    text = _words(cli.output)
    assert f"workload.target in {path} names the workload file {model}, which is not here" in text
    assert "pass --workload path/to/file.py:factory" in text


@pytest.mark.subprocess
@pytest.mark.slow  # a new interpreter and its children (15 s): Ctrl-C during a search's child
# runs everyday in test_search.py's test_ctrl_c_keeps_and_writes_the_best_so_far
def test_ctrl_c_during_verify_exits_130_and_leaves_no_child(tmp_path: Path) -> None:
    """The loop's child hangs building its batches; Ctrl-C ends the command, and the child
    (and its fork server) with it."""
    path = tiny_config(tmp_path)
    tag = uuid.uuid4().hex
    env = {**os.environ, "AUTOTUNE_TEST_TAG": tag, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "verify", str(path), "--workload",
         workload_target("hang")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while len(_tagged(tag)) < 3 and time.monotonic() < deadline:  # the CLI, server, child
        time.sleep(0.2)
    time.sleep(1.0)  # the child is in the workload's code
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted (Ctrl-C): nothing written" in _words(stderr)
    _no_survivors(tag)
