"""The local study store: a repeated search reuses its runs and re-checks the leaders; a
changed budget, ``--fresh``, ``--no-cache``, a damaged store and two searches at once.

The scripted device of tests/scripted.py stands in for the runner (each test has a store of
its own: conftest's ``AUTOTUNE_CACHE_DIR``).
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.search import SearchSettings, list_studies, run_search, store_path, tuned_config
from autotune.units import MIB
from tests.scripted import CLASSES, VALUES, KnobDevice, ScriptedDevice, by_class, plan
from tests.scripted import SETTINGS as IN_MEMORY

SETTINGS = replace(IN_MEMORY, cache=True)
"""The scripted tests' settings, with the local study store these tests are about."""

SPEEDS = by_class(100, 150, 160, 200, 300, 290)
"""bf16/default leads bf16/max-autotune by 3%: a close race, re-measured."""
CLEAR = by_class(100, 150, 160, 200, 300, 200)
"""bf16/default leads by 50%: a clear lead, not re-measured by a first search."""


def search(device: ScriptedDevice, settings: SearchSettings = SETTINGS, report=None):
    return run_search(report or plan(), CLASSES, settings, run=device)


def winner(outcome) -> str:
    config = tuned_config(plan(), outcome, SETTINGS)
    return f"{config.knobs.label()}/{config.micro_batch}"


def test_a_repeated_search_reuses_every_run_and_re_checks_only_the_two_leaders() -> None:
    first = ScriptedDevice(CLEAR)
    one = search(first)
    assert not any("re-check" in s for s in one.skipped)
    again = ScriptedDevice(CLEAR)
    two = search(again)
    # Nothing probed or timed again: only the leader and the runner-up, once each, in full.
    assert again.runs() == ["bf16/default/32", "bf16/off/32"]
    # Timed until their medians are known (no stop for being behind: a re-check, not a race).
    assert all(s.timing_precision == SETTINGS.rank_precision and s.stop_above_step_s is None
               for s in again.specs)
    assert winner(two) == winner(one) == "bf16/default/32"
    assert two.num_runs == 2 and two.cost is not None and two.cost.num_runs == 2
    # The report's record: the first search's runs come first, stamped; then the re-checks.
    stored = [r for r in two.runs if r.stored_at]
    assert len(stored) == one.num_runs
    assert [r.kind for r in two.runs if not r.stored_at] == ["re-measure", "re-measure"]
    assert sum("re-check of" in s and "within the noise" in s for s in two.skipped) == 2
    assert two.study is not None and two.study.storage == f"sqlite:///{store_path()}"


def test_a_repeat_re_checks_a_stored_leader_that_no_other_run_timed_in_full() -> None:
    """One micro-batch per class and every other class stopped early behind fp32 eager: the
    first search has no race to re-measure, but its repeat does not let the stored leader
    pick alone (the slow CLI repeat test met this on a loaded machine): it re-checks it
    beside the best of those stopped early, both in full."""
    speeds = by_class(300, 20, 10, 30, 10, 10)
    settings = replace(SETTINGS, micro_batches_per_class=1)
    first = ScriptedDevice(speeds)
    one = search(first, settings)
    config = tuned_config(plan(), one, settings)
    assert [t.verdict for t in config.trials if t.verdict not in ("oom", "winner")] == [
        "slower"] * 4
    assert not any(s.startswith("no re-measurement") for s in one.skipped)
    again = ScriptedDevice(speeds)
    two = search(again, settings)
    assert again.runs() == ["fp32/off/32", "bf16/off/32"]
    assert all(s.timing_precision == SETTINGS.rank_precision and s.stop_above_step_s is None
               for s in again.specs)
    assert sum(s.startswith("re-check of") for s in two.skipped) == 2
    assert winner(two) == winner(one) == "fp32/off/32"


def test_a_stale_stored_leader_is_replaced_by_its_fresh_run_and_loses() -> None:
    search(ScriptedDevice(SPEEDS))
    # The machine changed: bf16/default now runs 40% slower than its stored timing.
    slower = ScriptedDevice({**SPEEDS, "bf16/default": 180})
    two = search(slower)
    assert "bf16/default/32" in slower.runs()
    assert any(s.startswith("re-check of bf16/default/32 (stored run): 300.0 samples/s "
                            "stored, 180.0 now, slower beyond the noise") for s in two.skipped)
    assert winner(two) == "bf16/max-autotune/32"


def test_fresh_measures_everything_again_and_no_cache_keeps_nothing() -> None:
    first = ScriptedDevice(SPEEDS)
    search(first)
    fresh = ScriptedDevice(SPEEDS)
    search(fresh, replace(SETTINGS, fresh=True))
    assert fresh.runs() == first.runs()
    _, studies = list_studies()
    assert [s.num_runs for s in studies] == [len(first.specs)]  # replaced, not added to
    store_path().unlink()
    memory_only = ScriptedDevice(SPEEDS)
    outcome = search(memory_only, replace(SETTINGS, cache=False))
    assert not store_path().exists()
    assert outcome.study is not None and outcome.study.storage == ""


@dataclass
class PeakRisesOnceMore(KnobDevice):
    """A knob device on which ``risen``'s candidates (``label/micro_batch``) peak that many
    MiB higher from their second timed run on: a CPU allocator's peak moves between runs."""

    risen: dict[str, float] = field(default_factory=dict)
    timed_runs: dict[str, int] = field(default_factory=dict)

    def __call__(self, spec):
        result = super().__call__(spec)
        key = f"{spec.knobs.label()}/{spec.micro_batch}"
        if spec.num_timed_steps and result.ok:
            self.timed_runs[key] = self.timed_runs.get(key, 0) + 1
            if self.timed_runs[key] >= 2 and key in self.risen:
                return replace(result, peak_bytes=result.peak_bytes + int(self.risen[key] * MIB))
        return result


def test_a_repeat_reads_a_stored_run_as_the_first_search_read_it_until_its_re_check() -> None:
    """The fused optimizer at 32 first peaked 1 MiB below fp32 eager there (its temporaries
    are smaller) and ran 1.02x it; the first search re-measured it, and that run peaked
    4 MiB above. Read at its first ask as the better of its runs with the larger peak, the
    repeat saw "peaked above its setting, not faster beyond the noise" where the first
    search had not, and timed fused at 16, which the first search never ran (the slow CLI
    repeat's flake: 2 searches in 7). Each stored candidate now answers its first ask with
    its first run; its later runs join at its re-check or as the search ends."""
    def device() -> PeakRisesOnceMore:
        return PeakRisesOnceMore(by_class(100, 90, 90, 95, 90, 90),
                                 impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 1.0,
                                             "fused": 1.02},
                                 impl_saves_mib={"fused": 1.0},
                                 risen={"fp32/off+opt=fused/32": 5.0})
    first = device()
    one = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=first)
    assert [f"{s.knobs.label()}/{s.micro_batch}" for s in first.specs].count(
        "fp32/off+opt=fused/32") == 2  # timed, then re-measured: the second peaked higher
    again = device()
    two = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=again)
    ran_first = {f"{s.knobs.label()}/{s.micro_batch}" for s in first.specs}
    assert [f"{s.knobs.label()}/{s.micro_batch}" for s in again.specs
            if f"{s.knobs.label()}/{s.micro_batch}" not in ran_first] == []
    assert not any("peaked above" in s for s in two.skipped)
    assert winner(two) == winner(one)
    # Every stored run is in the record as the search ends: the re-measured peak too.
    records = {f"{r.knobs.label()}/{r.micro_batch}": r for r in two.records}
    fused = records["fp32/off+opt=fused/32"]
    assert fused.num_runs == 3  # two stored, one re-check
    assert fused.peak_bytes == max(r.peak_bytes for r in two.runs
                                   if (r.knobs.label(), r.micro_batch) ==
                                   ("fp32/off+opt=fused", 32))


class AnyBudget(ScriptedDevice):
    """The scripted device, run under another search budget (its memory stays the same)."""

    def __call__(self, spec):
        return super().__call__(replace(spec, memory_budget_bytes=plan().budget_bytes))


def test_the_store_is_reused_within_5_percent_of_the_budget_and_not_beyond() -> None:
    search(ScriptedDevice(SPEEDS))
    near = AnyBudget(SPEEDS)
    search(near, report=replace(plan(), budget_bytes=plan().budget_bytes - 20 * MIB))
    assert len(near.specs) <= 3  # re-checks only
    far = AnyBudget(SPEEDS)
    outcome = search(far, report=replace(plan(), budget_bytes=plan().budget_bytes - 100 * MIB))
    assert far.specs[0].micro_batch == 64 and len(far.specs) > 3  # probed from scratch
    assert outcome.study is not None
    assert outcome.study.note == ("stored runs not reused: the memory budget moved from "
                                  "1,000 MiB to 900 MiB (more than 5%); this search's replace "
                                  "them")


def test_a_damaged_store_is_moved_aside_kept_and_a_fresh_one_started() -> None:
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database \x00\xff" * 100)
    device = ScriptedDevice(SPEEDS)
    outcome = search(device)
    aside = list(path.parent.glob("studies.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"not a database \x00\xff" * 100
    assert outcome.study is not None and outcome.study.note.startswith(
        f"study store {path} was damaged (not an SQLite database): moved to {aside[0].name}")
    # The fresh store works: a repeat reuses it.
    again = ScriptedDevice(SPEEDS)
    search(again)
    assert len(again.specs) <= 3


def test_an_optuna_store_with_broken_tables_is_moved_aside() -> None:
    search(ScriptedDevice(SPEEDS))
    path = store_path()
    with sqlite3.connect(path) as db:  # Optuna's store (version_info), a table broken
        db.execute("pragma foreign_keys = off")
        db.execute("drop table studies")
        db.execute("create table studies (nonsense text)")
    outcome = search(ScriptedDevice(SPEEDS))
    assert outcome.study is not None and "was damaged" in outcome.study.note
    assert outcome.study.storage == f"sqlite:///{path}"
    assert len(list(path.parent.glob("studies.db.corrupt-*"))) == 1


def test_a_cache_folder_that_cannot_be_made_runs_in_memory_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(blocker / "cache"))
    outcome = search(ScriptedDevice(SPEEDS))
    assert outcome.study is not None and outcome.study.storage == ""
    assert outcome.study.note.startswith("study store not used: ")
    assert "AUTOTUNE_CACHE_DIR" in outcome.study.note
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("value, message", [
    ("", "AUTOTUNE_CACHE_DIR is set but empty"),
    ("{file}", "is a file, not a folder"),
])
def test_a_cache_dir_naming_nothing_usable_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", value.format(file=tmp_path / "f"))
    with pytest.raises(ConfigError) as info:
        search(ScriptedDevice(SPEEDS))
    assert message in str(info.value)


def test_the_store_records_readable_attributes_for_optuna_dashboard() -> None:
    search(ScriptedDevice(SPEEDS))
    _, [stored] = list_studies()
    study = optuna.load_study(study_name=stored.name, storage=f"sqlite:///{store_path()}")
    timed = [t for t in study.trials
             if t.user_attrs.get("kind") == "trial" and t.user_attrs["status"] == "ok"]
    assert timed and all({"samples_per_s", "peak_MiB", "median_step_s", "status"}
                         <= set(t.user_attrs) for t in timed)
    assert stored.key["target_batch"] == "64" and stored.key["space"]["classes"]


def test_cache_list_and_clear_show_and_remove_the_store() -> None:
    runner = CliRunner()
    empty = runner.invoke(app, ["cache", "list"])
    assert empty.exit_code == 0 and "no stored studies" in empty.output
    search(ScriptedDevice(SPEEDS))
    listed = runner.invoke(app, ["cache", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert '"target_batch": "64"' in listed.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and not store_path().exists()


def test_cache_list_of_a_damaged_store_exits_2_saying_how_to_clear_it() -> None:
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("create table studies (nonsense text)")
    result = CliRunner().invoke(app, ["cache", "list"])
    assert result.exit_code == 2
    assert f"cannot read the study store {path}" in result.output
    assert "autotune cache clear" in result.output


def test_fresh_with_storage_is_refused() -> None:
    result = CliRunner().invoke(app, ["search", "--fresh", "--storage", "sqlite:///x.db"])
    assert result.exit_code == 2
    assert "--fresh applies to the local study store" in result.output


def _search_in_child(queue: multiprocessing.Queue, speeds: dict[str, float]) -> None:
    class Slow(ScriptedDevice):
        def __call__(self, spec):
            import time

            time.sleep(0.05)  # let the two searches' runs interleave
            return super().__call__(spec)

    device = Slow(speeds)
    outcome = run_search(plan(), CLASSES, SETTINGS, run=device)
    queue.put((outcome.num_runs, winner(outcome)))


@pytest.mark.subprocess
def test_two_searches_at_once_on_one_key_lose_no_run_and_agree() -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_search_in_child, args=(queue, SPEEDS)) for _ in range(2)]
    for child in children:
        child.start()
    results = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert {w for _, w in results} == {"bf16/default/32"}
    _, [stored] = list_studies()
    study = optuna.load_study(study_name=stored.name, storage=f"sqlite:///{store_path()}")
    states = [t.state for t in study.trials]
    # Every run of both searches is in the study, each complete or pruned (a probe): none
    # failed, none handed to the other search, none lost.
    assert len(states) == sum(n for n, _ in results)
    assert set(states) <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert os.environ["AUTOTUNE_CACHE_DIR"] in str(store_path())


def test_a_repeat_of_a_three_way_race_re_checks_only_the_two_leaders() -> None:
    close = by_class(100, 150, 160, 295, 300, 290)
    first = ScriptedDevice(close)
    one = search(first)
    # the baseline's early one (this machine's noise: rule ``noise``), the leader and 2
    # contenders
    assert sum(r.kind == "re-measure" for r in one.runs) == 4
    again = ScriptedDevice(close)
    search(again)
    assert len(again.specs) == 2 and again.runs()[0] == "bf16/default/32"


def test_an_interrupted_search_keeps_every_run_it_finished_for_the_next() -> None:
    class CtrlC(ScriptedDevice):
        def __call__(self, spec):
            if len(self.specs) == 5:
                raise KeyboardInterrupt
            return super().__call__(spec)

    cut = CtrlC(SPEEDS)
    stopped = search(cut)
    assert stopped.interrupted and str(stopped.stop_reason).startswith("interrupted (Ctrl-C)")
    done = cut.runs()[:5]
    again = ScriptedDevice(SPEEDS)
    two = search(again)
    assert not set(done) & set(again.runs()[:len(again.runs()) - 2])  # none run twice
    assert len([r for r in two.runs if r.stored_at]) == 5
    assert not two.interrupted


def test_a_repeat_says_each_stored_result_before_it_re_checks() -> None:
    one = search(ScriptedDevice(SPEEDS))
    said: list[tuple[str, str, bool]] = []
    run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS),
               on_trial=lambda n, stage, c, rec: said.append((stage, c.key(), rec is None)))
    stored = [key for stage, key, _ in said if stage == "stored"]
    assert sorted(stored) == sorted(f"{r.knobs.label()}/{r.micro_batch}" for r in one.records)
    assert [stage for stage, _, _ in said][:len(stored)] == ["stored"] * len(stored)
    assert {stage for stage, _, _ in said[len(stored):]} == {"confirm"}


class Fingerprinted(ScriptedDevice):
    """The scripted device, reporting the model's fingerprint as a real child does."""

    fingerprint: str = "model-a"

    def __call__(self, spec):
        return replace(super().__call__(spec), workload_fingerprint=self.fingerprint)


def test_a_re_check_that_finds_another_model_measures_everything_again() -> None:
    first = Fingerprinted(SPEEDS)
    search(first)
    edited = Fingerprinted(SPEEDS)
    edited.fingerprint = "model-b"  # e.g. a module the workload imports changed its shapes
    outcome = search(edited)
    # One re-check found the change; then every candidate ran again, none from the store.
    assert edited.runs()[1:] == first.runs()
    assert not any(r.stored_at for r in outcome.runs)
    assert len(outcome.runs) == outcome.num_runs == len(first.specs) + 1
    assert outcome.study is not None and "the workload changed since they were measured" in (
        outcome.study.note)
    _, [stored] = list_studies()
    assert stored.num_runs == len(first.specs)  # the stale runs were replaced


def test_a_stored_timing_never_picks_alone_after_the_leaders_re_checks_drop_them() -> None:
    """Issue 45 (6): the two leaders' re-checks both run slower than stored (the fresh runs
    count), which leaves a third candidate, timed only by the first search, on top at its
    stored figure. It is re-checked before it can be picked: its fresh run counts too."""
    first = by_class(100, 150, 160, 280, 300, 290)
    search(ScriptedDevice(first))
    changed = ScriptedDevice(by_class(100, 150, 160, 150, 210, 200))
    two = search(changed)
    assert changed.runs()[:2] == ["bf16/default/32", "bf16/max-autotune/32"]
    assert "bf16/off/32" in changed.runs()  # re-checked, not picked on 280 stored
    assert any(s.startswith("re-check of bf16/off/32 (stored run): 280.0 samples/s stored, "
                            "150.0 now") for s in two.skipped)
    assert winner(two) == "bf16/default/32"
    config = tuned_config(plan(), two, SETTINGS)
    assert config.samples_per_s is not None and config.samples_per_s < 250  # a fresh figure


def test_a_repeat_stopped_before_its_re_checks_says_its_pick_is_a_stored_timing() -> None:
    search(ScriptedDevice(SPEEDS))

    class CtrlC(ScriptedDevice):
        def __call__(self, spec):
            raise KeyboardInterrupt

    two = search(CtrlC(SPEEDS))
    assert two.interrupted
    assert f"{winner(two)}: picked on its stored timing alone (a search before measured it): " \
           "this one stopped before re-checking it" in two.skipped


def test_a_stored_trial_from_before_a_knob_existed_reads_as_that_knob_at_its_default() -> None:
    """A store written by an autotune without ``compile_scope`` and ``shapes`` holds trials
    whose parameters lack them: they ran the whole model compiled at the worst-case shape, so
    they answer for those knobs' defaults instead of being dropped (and re-measured)."""
    import json

    from autotune.config import TrialResult
    from autotune.knobs import Knobs
    from autotune.search._records import Candidate
    from autotune.search._trials import completed
    from autotune.serialize import to_json_dict

    study = optuna.create_study(direction="maximize")
    older = {"precision": "bf16", "compile_mode": "default", "checkpointing": "off",
             "optimizer_impl": "fused", "memory_format": "contiguous", "allocator": "default",
             "strategy": "none", "micro_batch": 32}
    result = TrialResult(status="ok", step_times_s=(0.1,) * 5, samples_per_step=32)
    study.add_trial(optuna.trial.create_trial(
        params=older, value=320.0, user_attrs={"result": json.dumps(to_json_dict(result))},
        distributions={k: optuna.distributions.CategoricalDistribution([v])
                       for k, v in older.items()}))
    done = completed(study)
    key = Candidate(knobs=Knobs(precision="bf16", compile_mode="default",
                                optimizer_impl="fused"), micro_batch=32)
    assert list(done) == [key] and len(done[key]) == 1
    assert (key.knobs.compile_scope, key.knobs.shapes) == ("model", "max")
