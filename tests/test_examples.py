"""Every file in examples/ runs, at tiny sizes, against an autotune.json made here (no search)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.builtin_workloads import load_workload
from autotune.config import WorkloadSpec
from autotune.workload import Workload, check_batch
from tests.tuned_configs import REPO, my_workload_spec, small, subprocess_env, write

EXAMPLES = REPO / "examples"


def run_example(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd,
                            capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_every_example_is_tested_and_documented() -> None:
    tested = {"my_workload.py", "train_plain.py", "train_hf_trainer.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
    readme = (EXAMPLES / "README.md").read_text()
    assert all(name in readme for name in tested)


def test_my_workload_loads_the_cli_way() -> None:
    workload = load_workload(my_workload_spec())
    assert isinstance(workload, Workload)
    batch = workload.make_batch(3)
    check_batch(batch, 3, workload.name)
    loss = workload.compute_loss(workload.build_model(), batch)
    assert loss.shape == () and torch.isfinite(loss)


@pytest.mark.subprocess
def test_train_plain(tmp_path: Path) -> None:
    config = write(small(workload=my_workload_spec()), tmp_path / "autotune.json")
    result = run_example("train_plain.py", "--config", str(config), "--steps", "2",
                         "--checkpoint", "ck.pt", cwd=tmp_path)
    assert "step 2/2" in result.stdout
    assert torch.load(tmp_path / "ck.pt").keys() == load_workload(
        my_workload_spec()).build_model().state_dict().keys()


@pytest.mark.subprocess
@pytest.mark.slow  # a new interpreter to see autotune.load's refusal, which runs everyday in
# test_usage.py::test_load_checks_world_size
def test_train_plain_refuses_another_world_size(tmp_path: Path) -> None:
    config = write(small(workload=my_workload_spec()), tmp_path / "autotune.json")
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_plain.py"), "--config",
                             str(config), "--steps", "1"], cwd=tmp_path, capture_output=True,
                            text=True, env={**subprocess_env(), "WORLD_SIZE": "2"}, timeout=300)
    assert result.returncode != 0 and "tuned for 1 device" in result.stderr


# slow: the everyday run keeps examples/train_plain.py and a real Trainer built
# from the config (test_compile_scope.py, test_compile_shapes.py)
@pytest.mark.slow
@pytest.mark.subprocess
def test_train_hf_trainer(tmp_path: Path) -> None:
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers.Trainer needs accelerate (pip install -e .[dev])")
    config = write(small(workload=WorkloadSpec(kind="hf", target="tiny-gpt2", seq_len=32),
                         workload_name="tiny-gpt2 (causal-lm, seq 32)"),
                   tmp_path / "autotune.json")
    result = run_example("train_hf_trainer.py", "--config", str(config), "--steps", "2",
                         "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert "trained 2 steps" in result.stdout
