"""Quick checks of the benchmark helpers (the benchmarks themselves are not in the test run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from oracle import naive_micro_batch  # noqa: E402


@pytest.mark.parametrize(("largest_fitting", "expected"), [
    (64, 64), (100, 64), (63, 32), (32, 32), (31, 16), (1, 1), (0, 0),
])
def test_naive_micro_batch_is_target_or_largest_power_of_two(largest_fitting, expected):
    assert naive_micro_batch(64, lambda m: m <= largest_fitting) == expected


def test_naive_micro_batch_for_a_target_that_is_not_a_power_of_two():
    assert naive_micro_batch(48, lambda m: m <= 48) == 48
    assert naive_micro_batch(48, lambda m: m <= 40) == 32


@pytest.mark.subprocess
def test_gpu_suite_dry_run_lists_every_step_within_ten_minutes(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run([str(BENCH / "gpu.sh"), "--dry-run"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"would write to {tmp_path / 'gpu'}"
    names = [line.split()[0] for line in lines[1:-1]]
    assert names == ["search-gpt2", "search-bert", "oracle-bert", "estimate"]
    assert float(lines[-1].split("~")[1].split()[0]) <= 600


@pytest.mark.subprocess
@pytest.mark.slow
def test_gpu_suite_rehearses_every_step_on_the_cpu(tmp_path):
    """Every step of the GPU suite runs its real code (tiny models, CPU): a GPU call is scarce,
    so the suite must not first meet a Python error there."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run([str(BENCH / "gpu.sh"), "--rehearse"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-rehearsal" / "gpu_suite.json").read_text())
    assert data["rehearsal"] is True
    steps = data["steps"]
    assert list(steps) == ["search-gpt2", "search-bert", "oracle-bert", "estimate"]
    assert all("error" not in res for res in steps.values()), steps
    assert steps["search-bert"]["tuned"].startswith("fp32/off/")
    assert steps["oracle-bert"]["pick_quality"] is not None
    assert all(row["status"] == "ok" for row in steps["estimate"]["rows"])
    markdown = (tmp_path / "gpu-rehearsal" / "gpu_suite.md").read_text()
    assert markdown.startswith("# GPU benchmarks: CPU rehearsal (no GPU figures)")
