"""`autotune check` and `autotune estimate` as a CI machine runs them: a measured step under
the budget's cap, workload paths that travel with a checkout, the kernels of the device the
estimate is for, and a measured peak never hidden by a lower estimate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import api
from autotune.cli import app
from autotune.config import GIB, MIB
from autotune.knobs import Knobs
from tests.tuned_configs import make_tuned, write

runner = CliRunner()


def cpu_config(folder: Path, *, micro_batch: int = 8, budget: int = 4 * GIB,
               name: str = "autotune.json", **changes: object) -> Path:
    """A real autotune.json of the built-in CPU workload, fp32 eager, target 32, tuned on the
    CPU with ``budget`` as its cap."""
    base = make_tuned()
    config = dataclasses.replace(
        base, target_batch=32, micro_batch=micro_batch, accumulate_steps=32 // micro_batch,
        knobs=Knobs(), memory=dataclasses.replace(
            base.memory, device_total_bytes=budget, budget_bytes=budget,
            usable_bytes=int(budget * 0.9), calibration={}))
    return write(dataclasses.replace(config, **changes), folder / name)


# ----------------------------------------------------------------------------------------------
# check --measure of a CPU config: the real step runs under the budget's cap (issue 44, item 3).


@pytest.mark.subprocess
def test_check_measure_of_a_cpu_config_runs_under_the_budgets_cap(tmp_path: Path) -> None:
    """The defect: the measured step ran with no cap, so a config far over its budget used
    whatever the machine had (once a 22.8 GB child, ended by the kernel's OOM killer: exit 2).
    Under the cap the step runs out of memory at the budget, and that is exit 1."""
    path = cpu_config(tmp_path, micro_batch=32, budget=24 * MIB)  # 8 alone peaks at ~44 MiB
    result = api.check(path, measure=True)
    assert not result.fits and result.method == "measure"
    assert result.peak_bytes <= result.budget_bytes, result.message  # the cap held
    assert "ran out of memory under the 24.00 MiB cap" in result.message

    cli = runner.invoke(app, ["check", str(path), "--measure"])
    assert cli.exit_code == 1, cli.output
    assert cli.output.startswith("does not fit: micro-batch 32")
