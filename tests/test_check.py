"""`autotune check` and `autotune estimate` as a CI machine runs them: a measured step under
the budget's cap, workload paths that travel with a checkout, the kernels of the device the
estimate is for, and a measured peak never hidden by a lower estimate."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune import api
from autotune.cli import app
from autotune.knobs import Knobs
from autotune.units import GIB, MIB
from tests.tuned_configs import make_tuned, subprocess_env, write

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


# ----------------------------------------------------------------------------------------------
# A workload file travels with its autotune.json (issue 45, item 2).

WORKLOAD_FILE = Path(__file__).resolve().parents[1] / "examples" / "my_workload.py"


def project(folder: Path, *, sub: str = "model.py") -> Path:
    """A small project: a workload file (``sub``, under ``folder``) and a CPU autotune.json
    naming it the way ``--workload`` does (an absolute path)."""
    (folder / sub).parent.mkdir(parents=True, exist_ok=True)
    (folder / sub).write_text(WORKLOAD_FILE.read_text())
    spec = api.workload_spec(workload=f"{folder / sub}:workload")
    return cpu_config(folder, workload=spec, workload_name="mlp-classifier")


def stored_target(path: Path) -> str:
    import json

    return json.loads(path.read_text())["workload"]["target"]


@pytest.mark.subprocess
def test_a_moved_checkout_is_checked_with_its_own_workload_file(tmp_path: Path,
                                                               monkeypatch) -> None:
    """The defect: autotune.json kept the workload file's absolute path, so after a CI
    checkout (the folder elsewhere) `check --estimate` exited 2 naming a --workload never
    passed."""
    project(tmp_path / "A")
    (tmp_path / "A").rename(tmp_path / "B")
    monkeypatch.chdir(tmp_path)  # neither folder: nothing resolves from the working directory
    result = runner.invoke(app, ["check", "B/autotune.json", "--estimate"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("fits: ")


def test_the_path_is_stored_relative_and_read_from_the_configs_folder(tmp_path: Path,
                                                                      monkeypatch) -> None:
    from autotune.tuned_file import read_tuned

    path = project(tmp_path / "A", sub="models/net.py")
    assert stored_target(path) == "models/net.py:workload"
    (tmp_path / "A").rename(tmp_path / "B")
    monkeypatch.chdir(tmp_path / "B" / "models")
    assert read_tuned(tmp_path / "B" / "autotune.json").workload.target == (
        f"{tmp_path / 'B' / 'models' / 'net.py'}:workload")


@settings(max_examples=25, deadline=None)
@given(parts=st.lists(st.text(st.characters(  # control characters: refused (test_cli)
    codec="utf-8", exclude_characters="/\\:\0", exclude_categories=("Cc", "Zl", "Zp")),
    min_size=1, max_size=8).filter(lambda t: t not in (".", "..")), max_size=3))
def test_any_folder_under_the_config_travels_with_it(tmp_path_factory, parts) -> None:
    from autotune.tuned_file import read_tuned

    top = tmp_path_factory.mktemp("move")
    sub = Path(*parts, "net.py").as_posix()
    project(top / "A", sub=sub)
    (top / "A").rename(top / "B")
    assert read_tuned(top / "B" / "autotune.json").workload.target == (
        f"{top / 'B' / sub}:workload")


def test_a_file_elsewhere_in_the_checkout_is_relative_outside_it_absolute(
        tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    (tmp_path / "repo" / "src" / "model.py").write_text(WORKLOAD_FILE.read_text())
    (tmp_path / "repo" / "ci").mkdir()
    inside = cpu_config(tmp_path / "repo" / "ci", workload=api.workload_spec(
        workload=f"{tmp_path / 'repo' / 'src' / 'model.py'}:workload"))
    assert stored_target(inside) == "../src/model.py:workload"

    outside = cpu_config(tmp_path / "repo" / "ci", name="outside.json",
                         workload=api.workload_spec(workload=f"{WORKLOAD_FILE}:workload"))
    assert stored_target(outside) == f"{WORKLOAD_FILE}:workload"  # not in the checkout


def test_an_older_file_with_an_absolute_path_still_reads(tmp_path: Path) -> None:
    import json

    from autotune.tuned_file import read_tuned

    path = project(tmp_path / "A")
    data = json.loads(path.read_text())
    data["workload"]["target"] = f"{tmp_path / 'A' / 'model.py'}:workload"
    path.write_text(json.dumps(data))
    assert read_tuned(path).workload.target == f"{tmp_path / 'A' / 'model.py'}:workload"


def test_a_missing_workload_file_names_the_field_and_the_override(tmp_path: Path) -> None:
    path = project(tmp_path / "A")
    (tmp_path / "A" / "model.py").unlink()
    result = runner.invoke(app, ["check", str(path), "--estimate"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"workload.target in {path} names the workload file {tmp_path / 'A' / 'model.py'}" \
        in text
    assert "pass --workload path/to/file.py:factory" in text
    assert "(from --workload" not in text


# ----------------------------------------------------------------------------------------------
# examples/ci/memory-check.yml runs as written in a fresh repository (issue 45, item 2).

WORKFLOW = Path(__file__).resolve().parents[1] / "examples" / "ci" / "memory-check.yml"
MEMORY_TEST = '''
from autotune.testing import assert_fits


def test_the_model_fits_a_small_machine():
    assert_fits("model.py:workload", micro_batch=8, device_memory="1GiB", kernels="cpu")
'''


def run_steps(checkout: Path, only: str = "") -> dict[str, subprocess.CompletedProcess[str] | str]:
    """Each ``run:`` step of the workflow (with ``only``: those whose command has it) in
    ``checkout`` as GitHub's runner runs it (bash -e, the workflow's and the step's env), by
    the command it runs; a step that needs the network (pip installs) is the reason it was
    not run."""
    import os
    import sys

    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    env = {**subprocess_env(), "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                        os.environ["PATH"]])}
    env.update({k: str(v) for k, v in workflow.get("env", {}).items() if "${{" not in str(v)})
    done: dict[str, subprocess.CompletedProcess[str] | str] = {}
    for step in workflow["jobs"]["memory-check"]["steps"]:
        if "run" not in step or only not in step["run"]:
            continue
        if "pip install" in step["run"]:
            done[step["run"]] = "skipped: pip installs from the network (this checkout is " \
                                "already installed here)"
            continue
        done[step["run"]] = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=checkout, env={**env, **step.get("env", {})}, capture_output=True, text=True,
            timeout=600)
    return done


def step_of(steps: dict[str, subprocess.CompletedProcess[str] | str],
            command: str) -> subprocess.CompletedProcess[str]:
    """The run of the one step whose command has ``command`` in it."""
    [run] = [s for text, s in steps.items() if command in text]
    assert not isinstance(run, str), run
    return run


@pytest.mark.subprocess
@pytest.mark.slow  # 33 s; the default run keeps assert_fits (test_estimate.py) and check's verdicts
def test_the_github_actions_example_runs_as_written_in_a_fresh_repository(
        tmp_path: Path) -> None:
    """The defect: it installed `torch-autotune` (not on the package index), its check could
    not find the workload file of a checkout, and its tests were a file the user had to copy
    first. Here: a repository searched in one folder, checked out in another."""
    project(tmp_path / "searched")
    checkout = tmp_path / "checkout"
    (tmp_path / "searched").rename(checkout)
    (checkout / ".git").mkdir()

    steps = run_steps(checkout)
    install = [s for text, s in steps.items() if "pip install" in text]
    assert install and all(isinstance(s, str) and s.startswith("skipped") for s in install)
    assert all(source not in text for text in steps for source in ("torch-autotune", "examples/"))
    check, tests = step_of(steps, "autotune check"), step_of(steps, "-m pytest")
    assert check.returncode == 0 and check.stdout.startswith("fits: "), check.stderr
    assert tests.returncode == 0 and "no tests/test_memory_fits.py" in tests.stdout

    (checkout / "tests").mkdir()
    (checkout / "tests" / "test_memory_fits.py").write_text(MEMORY_TEST)
    tests = step_of(run_steps(checkout, only="-m pytest"), "-m pytest")
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr


# ----------------------------------------------------------------------------------------------
# estimate models the kernels of the device it is for, and its exit code is its verdict
# (issue 45, item 3).

SMALL_CNN = f"{Path(__file__).resolve().parents[1] / 'benchmarks' / 'workloads.py'}:small_cnn"


def estimate_cli(*args: str):
    return runner.invoke(app, ["estimate", "--workload", SMALL_CNN, "--micro-batch", "4",
                               *args])


# slow: the everyday run keeps the device and kernels an estimate answers for
# (test_estimate_says_the_device_it_answers_for_and_agrees_with_assert_fits)
@pytest.mark.slow
@pytest.mark.subprocess
def test_estimate_on_a_machine_without_cuda_models_cpu_kernels_and_says_so() -> None:
    """The defect: on a CPU CI machine the default modelled CUDA's kernels (micro-batch 16
    "fit" at 756 MiB where CPU kernels need 948 MiB), and nothing said which. The kernels
    follow the device the estimate is for: --device, by default this machine's."""
    import json

    import torch

    here = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU CI machine: cpu
    default = estimate_cli("--device-memory", "1GiB")
    assert default.exit_code == 0, default.output
    assert f"kernels modelled: {here}: " in default.output
    gpu = estimate_cli("--device", "cuda:1", "--device-memory", "1GiB", "--json")
    assert json.loads(gpu.stdout)["estimate"]["kernels"] == "cuda"
    forced = estimate_cli("--device", "cuda", "--kernels", "cpu", "--device-memory", "1GiB")
    assert "kernels modelled: cpu" in forced.output
    bad = estimate_cli("--device", "tpu")
    assert bad.exit_code == 2 and "--device tpu: " in bad.output


@pytest.mark.subprocess
def test_estimate_exits_1_when_the_asked_micro_batch_does_not_fit() -> None:
    """The defect: "does NOT fit" exited 0, so a CI step could not fail on it."""
    over = estimate_cli("--device-memory", "1MiB", "--kernels", "cpu")
    assert over.exit_code == 1, over.output
    assert "micro-batch 4 does NOT fit" in over.output
    assert estimate_cli("--device-memory", "1MiB", "--kernels", "cpu", "--json").exit_code == 1


@pytest.mark.subprocess
def test_largest_that_fits_is_a_divisor_of_the_target_and_the_raw_maximum_apart() -> None:
    """The defect: "largest that fits: 19" for a target batch of 32."""
    import json

    args = ("--kernels", "cpu", "--target-batch", "32", "--micro-batch", "1")
    probe = json.loads(estimate_cli(*args, "--device-memory", "1GiB", "--json").stdout)
    (m0, peak0), (m1, peak1) = sorted(probe["traced"])[:2]  # the peak grows linearly
    per_sample = (peak1 - peak0) / (m1 - m0)
    # Room for about 20 samples: the largest divisor of 32 is then 16, the raw maximum not.
    memory = str(int((peak0 + (20.5 - m0) * per_sample) / 0.9))
    data = json.loads(estimate_cli(*args, "--device-memory", memory, "--json").stdout)
    best, raw = data["max_micro_batch"], data["any_max_micro_batch"]
    assert 32 % best == 0 and best < raw, data
    assert data["pairs"][-1] == [best, 32 // best]
    text = " ".join(estimate_cli(*args, "--device-memory", memory).output.split())
    assert f"largest micro-batch that fits: {best}, a divisor of the per-device batch 32" \
        in text
    assert f"the largest of any size is {raw}" in text


# ----------------------------------------------------------------------------------------------
# check never goes by an estimate below a peak the same file measured (issue 45, item 4).


def paren_depth(text: str) -> int:
    depth = most = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        most = max(most, depth)
    return most


def measured_config(folder: Path, measured: int | None, *, budget: int = 4 * GIB,
                    name: str = "autotune.json", **knobs: object) -> Path:
    """A CPU config at micro-batch 8 whose winning trial peaked at ``measured``."""
    from autotune.schema import TrialRecord

    tuned = Knobs().with_(**knobs)
    trials = () if measured is None else (TrialRecord(
        number=0, micro_batch=8, accumulate_steps=4, knobs=tuned, verdict="winner",
        peak_bytes=measured, samples_per_s=100.0),)
    return cpu_config(folder, budget=budget, name=name, knobs=tuned, trials=trials)


def test_a_measured_peak_above_the_estimate_decides_and_is_shown_beside_it(
        tmp_path: Path) -> None:
    """The defect: "peak 183.24 MiB (eager estimate, uncorrected)" passed a config whose run
    in the same file had peaked at 206.78 MiB."""
    from autotune.builtin_workloads import default_workload
    from autotune.estimate.trace import estimate_step
    from autotune.units import format_bytes

    workload = default_workload("cpu")
    estimated = api.check(measured_config(tmp_path, None, name="plain.json"), measure=False,
                          workload=workload).peak_bytes
    measured = estimated + 50 * MIB
    budget = int((estimated + 25 * MIB) / 0.9)  # the estimate fits, the measured peak not
    result = api.check(measured_config(tmp_path, measured, budget=budget), measure=False,
                       workload=workload)
    assert not result.fits and result.peak_bytes == measured, result.message
    assert (f"(fp32/off): peak {format_bytes(measured)} as the search measured this config, "
            f"above {format_bytes(estimated)} by the eager estimate, uncorrected;"
            in result.message)
    # What would fit is corrected by the measurement too, never the estimate's alone.
    suggested = int(result.message.split("largest that fits: micro-batch ")[1].split()[0])
    assert estimate_step(workload, suggested, kernels="cpu").peak_bytes + 50 * MIB <= (
        result.usable_bytes), result.message

    roomy = api.check(measured_config(tmp_path, measured, name="roomy.json"), measure=False,
                      workload=workload)
    assert roomy.fits and roomy.peak_bytes == measured


def test_check_messages_are_one_clause_without_nested_parentheses(tmp_path: Path) -> None:
    from autotune.builtin_workloads import default_workload

    workload = default_workload("cpu")
    cases = [dict(measured=None), dict(measured=1), dict(measured=None, compile_mode="default"),
             dict(measured=1, compile_mode="default"), dict(measured=10 * GIB),
             dict(measured=None, checkpointing="blocks", budget=MIB)]
    for i, case in enumerate(cases):
        path = measured_config(tmp_path, name=f"{i}.json", **case)  # type: ignore[arg-type]
        message = api.check(path, measure=False, workload=workload).message
        assert paren_depth(message) <= 1, message
        assert message.count("peak ") >= 1 and "headroom" in message, message
    low = {"fp32/off": {"measured_peak_bytes": 1, "estimate_bytes": 100 * MIB, "micro_batch": 8}}
    path = cpu_config(tmp_path, name="cal.json")
    import json

    data = json.loads(path.read_text())
    data["memory"]["calibration"] = low
    path.write_text(json.dumps(data))
    message = api.check(path, measure=False, workload=workload).message
    assert "implausible" in message and paren_depth(message) <= 1, message


# ----------------------------------------------------------------------------------------------
# What the first hour met (issue 62): the device an estimate answers for, said; check asked
# about a smaller device.

@pytest.mark.subprocess
def test_check_asks_about_a_smaller_budget_and_validates_it_as_search_does(
        tmp_path: Path) -> None:
    """The defect: `check` had no way to ask whether the config fits a smaller device (the
    user edited the JSON). --memory-budget (or --device-memory) replaces the file's budget:
    exit 1 where the config does not fit it, 2 for a budget search would refuse."""
    path = cpu_config(tmp_path, micro_batch=16, budget=4 * GIB)
    own = runner.invoke(app, ["check", str(path), "--estimate"])
    assert own.exit_code == 0, own.output
    for option in ("--memory-budget", "--device-memory"):
        small = runner.invoke(app, ["check", str(path), "--estimate", option, "60MiB"])
        assert small.exit_code == 1, small.output
        assert "usable 54.00 MiB, the 60.00 MiB budget asked (--memory-budget 60MiB) less 10% " \
            "headroom" in " ".join(small.output.split()), small.output
    half = runner.invoke(app, ["check", str(path), "--estimate", "--memory-budget", "50%"])
    assert half.exit_code == 0 and "the 2.00 GiB budget asked" in half.output, half.output
    for bad, words in (("8GiB", "--memory-budget 8GiB (8.00 GiB) is more than cpu has (4.00 "
                                "GiB)"),
                       ("lots", "'lots'"), ("0%", "is not a share between 0% and 100%")):
        refused = runner.invoke(app, ["check", str(path), "--memory-budget", bad])
        assert refused.exit_code == 2 and words in " ".join(refused.output.split()), (
            bad, refused.output)


@pytest.mark.subprocess
def test_estimate_says_the_device_it_answers_for_and_agrees_with_assert_fits() -> None:
    """The defect: README's `estimate` line answered for this CPU machine's memory (exit 1:
    "does NOT fit" 24 GiB) where examples/ci's assert_fits, for a GPU, passed; nothing but a
    kernels line said which device. The first line and the verdict name it (and whence), the
    README's line asks for CUDA as assert_fits does, and the two give one figure."""
    import json

    import torch

    from autotune.testing import assert_fits
    from tests.test_readme import README, autotune_commands

    here = "cuda:0" if torch.cuda.is_available() else "cpu"
    default = estimate_cli("--device-memory", "1GiB")
    first, *_ = default.output.splitlines()
    assert first.startswith(f"small-cnn: micro-batch 4 for {here} (this machine), fp32/off")
    assert f"{here} memory 1.00 GiB - 10% headroom" in default.output
    gpu = estimate_cli("--device", "cuda", "--device-memory", "1GiB")
    assert gpu.output.startswith("small-cnn: micro-batch 4 for cuda (--device), ")
    assert "cuda memory 1.00 GiB - 10% headroom" in gpu.output
    [readme] = [words for words in autotune_commands(README) if words[0] == "estimate"]
    assert readme[readme.index("--device") + 1] == "cuda", readme
    figure = json.loads(estimate_cli("--device", "cuda", "--device-memory", "1GiB",
                                     "--json").stdout)["estimate"]["peak_bytes"]
    assert assert_fits(SMALL_CNN, micro_batch=4, device_memory="1GiB").peak_bytes == figure
