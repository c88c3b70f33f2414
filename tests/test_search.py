"""autotune search: real end-to-end searches on a tiny CPU workload, resume, refusal, Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import api
from autotune.cli import app
from autotune.config import Knobs, ProbeReport, TrialSpec, WorkloadSpec
from autotune.device import describe_device
from autotune.errors import ConfigError
from autotune.runner import run_isolated
from autotune.schema import SCHEMA_VERSION
from autotune.search import CONSTRAINT, SearchSettings, run_search
from autotune.tuned_file import read_tuned

ROOT = Path(__file__).resolve().parent.parent
TINY = WorkloadSpec(kind="file", target=str(ROOT / "tests" / "workloads.py") + ":tiny")
FAST = SearchSettings(num_timed_steps=3, min_timed_s=0.2, micro_batches_per_class=2, num_confirm=1)
FP32_EAGER = Knobs(precision="fp32", compile_mode="off")


class Recorder:
    """Runs specs with the real isolated runner and remembers them."""

    def __init__(self) -> None:
        self.specs: list[TrialSpec] = []

    def __call__(self, spec: TrialSpec):
        self.specs.append(spec)
        return run_isolated(spec)


@pytest.mark.subprocess
@pytest.mark.slow
def test_search_eager_and_compiled_writes_a_consistent_config(tmp_path: Path) -> None:
    result = api.search(TINY, target_batch=8, device="cpu", memory_budget="4GiB",
                        precisions=["fp32"], compile_modes=["off", "default"], out=tmp_path,
                        settings=FAST)
    config = read_tuned(tmp_path / "autotune.json")
    assert config == result.config
    assert config.schema == SCHEMA_VERSION
    assert config.micro_batch * config.accumulate_steps * config.world_size == 8
    assert config.workload_fingerprint and config.workload_name == "tiny-wide-mlp"
    # Both classes, and any knob value probed above its leader (e.g. fp32/off+opt=fused): which
    # one is the search's path, timing-dependent.
    probed = set(config.memory.max_micro_batch)
    assert {"fp32/off", "fp32/default"} <= probed
    assert {label.split("+")[0] for label in probed} == {"fp32/off", "fp32/default"}
    trials = config.trials
    assert trials[0].is_baseline and trials[0].precision == "fp32"
    assert trials[0].compile_mode == "off"
    winners = [t for t in trials if t.verdict == "winner"]
    assert len(winners) == 1
    feasible = [t for t in trials if t.verdict in ("winner", "ok")]
    fastest = max(feasible, key=lambda t: t.samples_per_s)
    if winners[0] is not fastest:  # two run back to back in rounds: ahead in most of them
        shares = winners[0].round_shares
        assert shares and sum(s > 1 for s in shares) > len(shares) / 2, (winners, fastest)
    assert (config.micro_batch, config.precision, config.compile_mode) == (
        winners[0].micro_batch, winners[0].precision, winners[0].compile_mode)
    compiled = [t for t in trials if t.compile_mode == "default" and t.verdict != "oom"]
    assert compiled and all(t.num_graphs and t.num_graphs >= 1 for t in compiled)
    assert all(t.num_timed_steps >= 3 for t in feasible)
    assert config.speedup == pytest.approx(winners[0].samples_per_s / trials[0].samples_per_s)
    assert config.reason.startswith(f"{winners[0].label()} won at ")
    assert "runner-up" in config.reason
    # Model FLOPs: counted once on the baseline's step (the test MLP's matmuls: forward 2,
    # backward 3, each 2 x 8 x 4096 FLOPs per row of 128), applied to every trial's samples/s.
    assert config.flops_per_sample == 5 * 2 * 8 * 4096 * 128
    for t in feasible:
        assert t.tflops_per_s == pytest.approx(config.flops_per_sample * t.samples_per_s / 1e12)
    assert config.mfu is None and all(t.mfu is None for t in trials)  # no known CPU peak


def _plan(target_batch: int, budget_bytes: int) -> ProbeReport:
    return ProbeReport(workload=TINY, device=describe_device("cpu"), target_batch=target_batch,
                       world_size=1, headroom=0.1, budget_bytes=budget_bytes, probes=())


@pytest.mark.subprocess
@pytest.mark.slow
def test_probes_that_oom_are_recorded_infeasible(tmp_path: Path) -> None:
    # Under a real 60 MiB cap the probe's first run (micro-batch 16) runs out of memory: the
    # study records it as a constraint violation, the fitting ones as feasible.
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    settings = dataclasses.replace(FAST, num_confirm=0, storage=storage, study_name="oom")
    outcome = run_search(_plan(16, 60 * 1024**2), [FP32_EAGER], settings)
    by_mb = {r.micro_batch: r for r in outcome.records}
    fits = outcome.probes[0].max_micro_batch
    assert 0 < fits < 16
    assert by_mb[16].verdict == "oom"
    assert by_mb[fits].verdict in ("ok", "slower") and by_mb[fits].is_baseline
    study = optuna.load_study(study_name="oom", storage=storage)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    constraints = {t.user_attrs["candidate"]: t.constraints[CONSTRAINT] for t in trials}
    assert constraints["fp32/off/16"] > 0
    assert constraints[f"fp32/off/{fits}"] == 0
    assert len(trials) == len(outcome.records)
    # Bisection points measured memory only: pruned trials, not records.
    probes = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert all(t.user_attrs["kind"] == "probe" for t in probes)
    assert len(study.trials) == outcome.num_runs == len(trials) + len(probes)


# slow: the everyday run keeps the store's reuse of every run (test_store.py) and the README's
# PostgreSQL resume (test_storage.py)
@pytest.mark.slow
@pytest.mark.subprocess
def test_resume_from_storage_reuses_completed_runs(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, num_confirm=0, storage=f"sqlite:///{tmp_path}/s.db",
                                   study_name="resume")
    first, second = Recorder(), Recorder()
    done = run_search(_plan(4, 2 * 1024**3), [FP32_EAGER], settings, run=first)
    again = run_search(_plan(4, 2 * 1024**3), [FP32_EAGER], settings, run=second)
    assert len(first.specs) == len(done.records) >= 2
    assert second.specs == []  # probes too: every run is in the study
    assert again.num_runs == 0
    assert [r.median_step_s for r in again.records] == [r.median_step_s for r in done.records]
    assert again.probes == done.probes


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_study_of_another_search_is_refused(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, num_confirm=0, storage=f"sqlite:///{tmp_path}/s.db",
                                   study_name="x")
    run_search(_plan(2, 2 * 1024**3), [FP32_EAGER], settings)
    with pytest.raises(ConfigError, match="refusing to mix"):
        run_search(_plan(4, 2 * 1024**3), [FP32_EAGER], settings)


runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, list(args))


def _err(result) -> str:
    return result.output + (getattr(result, "stderr", "") or "")


@pytest.mark.parametrize(("args", "expected"), [
    (["--precisions", "fp64"], "unknown precision"),
    (["--compile-modes", "turbo"], "unknown precision or compile mode"),
    (["--storage", "nosuchdb://nowhere"], "cannot open --storage"),
    (["--time-budget", "soon"], "cannot read the duration"),
    (["--micro-batches", "many"], "--micro-batches must be a number"),
])
def test_search_bad_input_exits_2(args: list[str], expected: str, tmp_path: Path) -> None:
    result = _cli("search", "--workload", TINY.target, "--target-batch", "2", "--device", "cpu",
                  "--out", str(tmp_path), *args)
    assert result.exit_code == 2, _err(result)
    assert expected in _err(result)
    assert not (tmp_path / "autotune.json").exists()


def test_search_refuses_to_overwrite_and_unwritable_out(tmp_path: Path) -> None:
    (tmp_path / "autotune.json").write_text("{}")
    result = _cli("search", "--target-batch", "2", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--force" in _err(result)
    assert (tmp_path / "autotune.json").read_text() == "{}"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _cli("search", "--target-batch", "2", "--out", str(blocker / "sub"))
    assert result.exit_code == 2
    assert f"{blocker} is a file, not a folder; choose another --out folder" in _err(result)


@pytest.mark.subprocess
def test_a_search_ended_by_max_trials_says_so_not_interrupted(tmp_path: Path) -> None:
    result = _cli("search", "--workload", TINY.target, "--target-batch", "2", "--device",
                  "cpu", "--precisions", "fp32", "--compile-modes", "off", "--max-trials", "2",
                  "--no-cache", "--out", str(tmp_path))
    assert result.exit_code == 0, _err(result)
    said = " ".join(_err(result).split())
    assert "note: --max-trials reached (2 child runs): best so far" in said
    # The terminal's skip lines are cut between words at 80 columns; the file has them whole.
    assert "calibration: no estimator calibration: the search stopped early:" in said
    assert "interrupted" not in said
    config = read_tuned(tmp_path / "autotune.json")
    assert any(s.text.startswith("no estimator calibration: the search stopped early: "
                                 "--max-trials reached") for s in config.skips), config.skips
    assert config.interrupted and config.stopped_by == "--max-trials reached (2 child runs)"
    for written in ("train_autotuned.py", "autotune.html"):
        text = " ".join((tmp_path / written).read_text().replace("#", " ").split())
        assert "The search stopped early (--max-trials reached (2 child runs))" in text, written
        assert "was interrupted" not in text, written


# slow: a search interrupted mid-trial; the everyday run keeps a signal in the window where the
# outputs are written (test_signals.py), the slow set Ctrl-C twice and SIGTERM on a whole search
# (test_reliability.py)
@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_keeps_and_writes_the_best_so_far(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "autotune.cli", "search", "--workload", TINY.target,
           "--target-batch", "8", "--device", "cpu", "--memory-budget", "2GiB",
           "--precisions", "fp32", "--compile-modes", "off", "--micro-batches", "all",
           "--timed-steps", "20", "--out", str(tmp_path)]  # trials long enough to interrupt
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default; a CI job started
    # in the background inherits SIGINT ignored (then Python never raises KeyboardInterrupt).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # wait until the first trial has finished
        if line.startswith("trial ") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert (tmp_path / "autotune.json").is_file(), stdout + stderr
    config = read_tuned(tmp_path / "autotune.json")
    assert config.interrupted
    assert any(t.verdict == "winner" for t in config.trials)
    assert "interrupted (Ctrl-C)" in stdout
    json.loads((tmp_path / "autotune.json").read_text())


@pytest.mark.subprocess
def test_a_run_whose_folder_is_removed_is_a_crash_and_the_search_keeps_its_runs(
        tmp_path: Path) -> None:
    """A $TMPDIR cleaner removes a child's folder mid-run (at micro-batch 1 here, after 2 was
    measured): that run is a crash said in one line, and the search goes on to its winner
    with every run it measured."""
    spec = WorkloadSpec(kind="file", target=str(ROOT / "tests" / "workloads.py")
                        + ":removes_its_folder")
    result = api.search(spec, target_batch=2, device="cpu", memory_budget="2GiB",
                        precisions=["fp32"], compile_modes=["off"],
                        knob_values={"optimizer_impl": ["default"]}, out=tmp_path,
                        settings=dataclasses.replace(FAST, num_confirm=0))
    config = read_tuned(tmp_path / "autotune.json")
    [lost] = [t for t in config.trials if t.micro_batch == 1]
    assert lost.verdict == "crash"
    assert re.fullmatch(r"the child's temporary folder \S+/autotune-child-\w+ was removed while "
                        r"it ran \(a \$TMPDIR cleaner, another job\?\): its result and output "
                        r"are lost", lost.reason), lost.reason
    assert (config.micro_batch, config.accumulate_steps) == (2, 1)
    assert result.config.trials == config.trials
    assert [r.status for r in config.runs if r.micro_batch == 2] == ["ok"]
    assert (tmp_path / "train_autotuned.py").is_file()


@pytest.mark.subprocess
def test_allow_inexact_tunes_the_nearest_exact_batch_and_reports_it(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, micro_batches_per_class=1, num_confirm=0)
    result = api.search(TINY, target_batch=8, world_size=3, device="cpu", memory_budget="2GiB",
                        precisions=["fp32"], compile_modes=["off"], out=tmp_path,
                        settings=settings, allow_inexact=True)
    config = read_tuned(tmp_path / "autotune.json")
    assert (config.target_batch, config.requested_batch) == (9, 8)
    assert config.micro_batch * config.accumulate_steps * 3 == 9
    from autotune.report import search_footer

    assert "asked for 8: +1 samples, +12.5%" in search_footer(result)[0]


@pytest.mark.subprocess
@pytest.mark.slow
def test_train_steps_objective_minimizes_time_to_train(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, train_steps=500, num_confirm=0)
    api.search(TINY, target_batch=4, device="cpu", memory_budget="2GiB", precisions=["fp32"],
               compile_modes=["off"], out=tmp_path, settings=settings)
    config = read_tuned(tmp_path / "autotune.json")
    assert (config.objective, config.train_steps) == ("time_to_train", 500)
    ran = [t for t in config.trials if t.verdict in ("winner", "ok")]
    for t in ran:
        assert t.time_to_train_s == pytest.approx(500 * t.median_step_s + (t.compile_s or 0.0))
    winner = next(t for t in config.trials if t.verdict == "winner")
    assert winner.time_to_train_s == min(t.time_to_train_s for t in ran)


def test_a_partly_compiled_trial_is_reported_as_such() -> None:
    from autotune.report import search_footer
    from autotune.schema import SearchResult
    from tests.tuned_configs import make_tuned

    config = make_tuned()
    trials = tuple(dataclasses.replace(t, num_graphs=3, num_graph_breaks=2)
                   if t.verdict == "winner" else t for t in config.trials)
    lines = search_footer(SearchResult(config=dataclasses.replace(config, trials=trials),
                                       path=None, probe=None))  # type: ignore[arg-type]
    assert "bf16/default 16x4: partly compiled: 2 graph break(s), 3 graph(s)" in "\n".join(lines)
    assert not any("partly compiled" in line for line in search_footer(SearchResult(
        config=config, path=None, probe=None)))  # type: ignore[arg-type]


def test_the_report_states_compute_and_mfu_when_the_peak_is_known() -> None:
    from autotune.datasheets import peak_tflops
    from autotune.report import search_footer
    from autotune.schema import SearchResult
    from tests.tuned_configs import make_tuned

    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA L40S", "fp32") == 91.6
    assert peak_tflops("AMD EPYC 7B13", "fp32") is None
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("NVIDIA L40", "bf16") is None  # not an L4
    config = make_tuned()
    trials = tuple(dataclasses.replace(t, tflops_per_s=123.7, mfu=0.125)
                   if t.verdict == "winner" else t for t in config.trials)
    gpu = dataclasses.replace(config.device, name="NVIDIA H100 80GB HBM3", device="cuda:0")
    lines = search_footer(SearchResult(config=dataclasses.replace(
        config, trials=trials, device=gpu, flops_per_sample=2.5e9, mfu=0.125), path=None,
        probe=None))  # type: ignore[arg-type]
    assert ("compute: 2.5 GFLOP per sample (model FLOPs of forward and backward, counted on "
            "the baseline's step); the winner runs 124 TFLOP/s, MFU 12.5% of this device's "
            "dense bf16 peak") in lines


@pytest.mark.subprocess
@pytest.mark.slow
def test_numerics_guard_compares_on_the_trials_own_batches(tmp_path: Path) -> None:
    # tiny's batches are random draws, so each micro-batch split sees other samples: the guard
    # must compare each trial with fp32 eager on its own batches, not with the baseline's.
    settings = dataclasses.replace(FAST, micro_batches_per_class=0, num_confirm=0)
    api.search(TINY, target_batch=8, device="cpu", memory_budget="2GiB", precisions=["fp32"],
               compile_modes=["off"], knob_values={"optimizer_impl": ["default"]},
               out=tmp_path / "fp32", settings=settings)
    config = read_tuned(tmp_path / "fp32" / "autotune.json")
    assert len(config.trials) == 4  # fp32 eager at 1, 2, 4 and 8
    assert not [t.reason for t in config.trials if t.verdict == "numerics"]

    wrong = WorkloadSpec(kind="file", target=str(ROOT / "tests" / "workloads.py") +
                         ":wrong_in_bf16")
    result = api.search(wrong, target_batch=4, device="cpu", memory_budget="2GiB",
                        precisions=["fp32", "bf16"], compile_modes=["off"],
                        out=tmp_path / "bf16",
                        settings=dataclasses.replace(FAST, micro_batches_per_class=1,
                                                     num_confirm=0))
    bf16 = [t for t in result.config.trials if t.precision == "bf16"]
    assert bf16 and all(t.verdict == "numerics" for t in bf16)
    assert "50.0% from fp32 eager's" in bf16[0].reason and "on the same batches" in bf16[0].reason
    assert result.config.precision == "fp32"


@pytest.mark.subprocess
@pytest.mark.slow
def test_checkpointing_raises_the_largest_micro_batch_under_a_real_cap(tmp_path: Path) -> None:
    # deep-mlp: 6 residual blocks, about 6.5 MiB a sample without checkpointing and 1.4 MiB
    # with it (measured). Under an 80 MiB cap (72 MiB usable) fp32 eager fits 8 of the 32;
    # the knob stage probes checkpointing because memory binds, and it fits all 32.
    deep = WorkloadSpec(kind="file", target=str(ROOT / "tests" / "workloads.py") + ":deep")
    settings = dataclasses.replace(FAST, num_confirm=0, micro_batches_per_class=1)
    result = api.search(
        deep, target_batch=32, device="cpu", memory_budget="80MiB", precisions=["fp32"],
        compile_modes=["off"], knob_values={"checkpointing": ["off", "blocks"],
                                            "optimizer_impl": ["default"]},
        out=tmp_path, settings=settings)
    largest = {p.knobs.label(): p.max_micro_batch for p in result.probe.probes}
    assert largest["fp32/off"] == 8
    assert largest["fp32/off+ckpt=blocks"] == 32
    config = read_tuned(tmp_path / "autotune.json")
    assert config.memory.max_micro_batch == largest
    timed = {t.label(): t for t in config.trials}
    assert timed["fp32/off+ckpt=blocks 32x1"].verdict in ("winner", "ok", "slower")
    assert timed["fp32/off 8x4"].is_baseline
    # Whichever won, it ran under the cap with its own knobs, and the script applies them.
    winner = next(t for t in config.trials if t.verdict == "winner")
    assert (config.knobs, config.micro_batch) == (winner.knobs, winner.micro_batch)
    assert config.memory.peak_bytes <= config.memory.usable_bytes
    script = (tmp_path / "train_autotuned.py").read_text()
    assert f'checkpointing = "{config.knobs.checkpointing}"' in script


@pytest.mark.subprocess
@pytest.mark.slow  # three real searches, about a minute: the scripted resume test covers the logic
def test_a_repeated_cli_search_reuses_the_store_and_re_checks_the_leaders(
        tmp_path: Path) -> None:
    args = ["search", "--workload", TINY.target, "--target-batch", "8", "--device", "cpu",
            "--memory-budget", "4GiB", "--precisions", "fp32,bf16", "--compile-modes", "off",
            "--timed-steps", "3", "--micro-batches", "1"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "one")])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, [*args, "--out", str(tmp_path / "two")])
    assert again.exit_code == 0, again.output
    one, two = (read_tuned(tmp_path / d / "autotune.json") for d in ("one", "two"))
    fresh_runs = [r for r in two.runs if r.stored_at is None]
    # Nothing the first search ran is run afresh but to re-check it: a candidate it timed is
    # answered from the store, never timed again as a trial, and never probed. (The store
    # answered each candidate with its better run, whose CPU peak differs by a few 100 KiB
    # from the run the first search read at that point, and a value that "peaked above" its
    # setting was timed one micro-batch down: 2 searches in 7 on a loaded 2-core machine.
    # Each answers with its first run now, 0 new trials in 8 repeats: test_store.py's
    # test_a_repeat_reads_a_stored_run_as_the_first_search_read_it_until_its_re_check. A
    # re-check that finds a stored run stale can still move the race to a candidate never
    # timed in full, so a trial stays allowed here.)
    ran_first = {(r.knobs.label(), r.micro_batch) for r in one.runs}
    new_trials = {(r.knobs.label(), r.micro_batch) for r in fresh_runs if r.kind == "trial"}
    assert not new_trials & ran_first, fresh_runs
    assert {r.kind for r in fresh_runs} <= {"re-measure", "trial"}, fresh_runs
    # The leaders re-checked (a pick whose fresh run drops behind a stored third hands the
    # re-check on: ``race.recheck_stored_pick``), raced back to back where their stored and
    # fresh runs drifted apart by more than their gap: never a probe or a screen, and fewer
    # runs than the first search made.
    # (How many leaders this takes depends on this machine's noise between the two searches:
    # every one re-checked must have been timed ok by the first search, or timed now.)
    checked = {(r.knobs.label(), r.micro_batch) for r in fresh_runs if r.kind == "re-measure"}
    timed_ok = {(t.knobs.label(), t.micro_batch) for t in one.trials if t.samples_per_s}
    assert checked and checked <= timed_ok | new_trials, fresh_runs
    assert len(fresh_runs) < len(one.runs), fresh_runs
    assert two.cost is not None
    assert two.cost.num_runs == len(fresh_runs)
    assert len([r for r in two.runs if r.stored_at]) == len(one.runs)
    assert "study store: reused" in again.output
    # Each re-check is said with its figures (the terminal shows the first of them; the file
    # keeps them all).
    assert any(s.rule == "recheck" for s in two.skips), two.skips
    # The estimator's figures for the calibration are kept in the study too.
    base = "fp32/off"  # calibrated in every search (the winner's class may differ)
    assert base in two.memory.calibration
    # The estimate is the stored one; the measured peak is a run of that config (which of its
    # runs the repeated search keeps may differ: a CPU peak moves by a few 100 KiB per run).
    measured = ("measured_peak_bytes", "growth_measured_peak_bytes")
    assert {k: v for k, v in two.memory.calibration[base].items() if k not in measured} == \
        {k: v for k, v in one.memory.calibration[base].items() if k not in measured}
    m = two.memory.calibration[base]["micro_batch"]
    assert two.memory.calibration[base]["measured_peak_bytes"] in {
        r.peak_bytes for r in two.runs if r.knobs.label() == base and r.micro_batch == m}
    assert two.study is not None
    kept = optuna.load_study(study_name=two.study.name, storage=two.study.storage).user_attrs
    assert any(k.startswith("estimate:fp32/off:") for k in kept)
    # Readable in optuna-dashboard; no compile seconds for eager runs (a warm-up is no compile).
    trials = optuna.load_study(study_name=two.study.name, storage=two.study.storage).trials
    timed = [t for t in trials if t.user_attrs.get("status") == "ok"
             and t.user_attrs.get("kind") != "probe"]
    assert timed and all("samples_per_s" in t.user_attrs and "compile_s" not in t.user_attrs
                         for t in timed)
    # --no-cache: every run again, nothing reused.
    cold = runner.invoke(app, [*args, "--out", str(tmp_path / "three"), "--no-cache"])
    assert cold.exit_code == 0, cold.output
    three = read_tuned(tmp_path / "three" / "autotune.json")
    assert not any(r.stored_at for r in three.runs) and three.study is not None
    assert three.study.storage == ""
