"""The study store is a cache: its failures cost the cache, never the search.

A store removed or replaced mid-search (``autotune cache clear`` from another shell), a full
disk (SQLite's own SQLITE_FULL, made real with ``PRAGMA max_page_count``), a damaged file, a
folder or another program's SQLite database at its path: the search finishes with its winner
and says once what happened. Real Optuna on real SQLite; the scripted device of
tests/scripted.py stands in for the child runs (each test has a store of its own:
conftest's ``AUTOTUNE_CACHE_DIR``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import sqlite3
import stat
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import WorkloadSpec
from autotune.report import study_lines
from autotune.search import (
    SearchSettings,
    recall,
    remember,
    run_search,
    store_path,
    tuned_config,
)
from autotune.search._ledger import store_trouble
from tests.conftest import workload_target
from tests.scripted import CLASSES, ScriptedDevice, plan
from tests.test_store import SETTINGS, SPEEDS, winner


def search_with(fault: Callable[[], None], after: int = 3):
    """A scripted search whose store meets ``fault`` before its run ``after`` + 1; the
    warnings it gave."""
    device = ScriptedDevice(SPEEDS)

    def run(spec):
        if len(device.specs) == after:
            fault()
        return device(spec)

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        outcome = run_search(plan(), CLASSES, SETTINGS, run=run)
    return outcome, device, [str(w.message) for w in said if "study store" in str(w.message)]


@pytest.mark.subprocess
def test_a_real_search_whose_store_is_cleared_mid_search_writes_every_output(
        tmp_path: Path) -> None:
    """The defect as met: `autotune cache clear` from another shell during a search ended it
    with exit 3 and nothing written."""
    from autotune import api

    def on_trial(n, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if record is not None and store_path().is_file():  # after the first run ended
            clear_from_another_shell()

    tiny = WorkloadSpec(kind="file", target=workload_target("tiny"))
    with pytest.warns(UserWarning, match="study store failed while"):
        api.search(tiny, target_batch=2, device="cpu", memory_budget="2GiB",
                   precisions=["fp32"], compile_modes=["off"], out=tmp_path,
                   on_trial=on_trial,
                   settings=SearchSettings(num_timed_steps=3, min_timed_s=0.1,
                                           micro_batches_per_class=1, num_confirm=0))
    config = json.loads((tmp_path / "autotune.json").read_text())
    assert any(t["verdict"] == "winner" for t in config["trials"])
    assert config["study"]["note"].startswith("failed while ")
    assert (tmp_path / "train_autotuned.py").is_file()
    assert (tmp_path / "autotune.html").is_file()


def clear_from_another_shell() -> None:
    result = CliRunner().invoke(app, ["cache", "clear"])
    assert result.exit_code == 0, result.output


def folder_in_its_place() -> None:
    store_path().unlink()
    store_path().mkdir()


@pytest.mark.parametrize("fault", [clear_from_another_shell, folder_in_its_place])
def test_a_store_removed_or_replaced_mid_search_costs_the_cache_not_the_search(
        fault: Callable[[], None]) -> None:
    outcome, device, said = search_with(fault)
    # The search went on to the end and picked what a search without the fault picks.
    assert not outcome.interrupted and winner(outcome) == "bf16/default/32"
    assert outcome.num_runs == len(device.specs) > 3
    config = tuned_config(plan(), outcome, SETTINGS)
    assert outcome.study is not None and config.study == outcome.study
    note = outcome.study.note
    assert note.startswith("failed while ") and "removed or replaced meanwhile" in note
    assert "the search goes on without it" in note
    assert said == [f"study store {note}"]  # one warning, once
    assert study_lines(config) == [f"study store: {note}", *_recorded_until_it_failed(config)]


def _recorded_until_it_failed(config) -> list[str]:  # type: ignore[no-untyped-def]
    """The footer's line of a store that failed mid-search: never that the runs are recorded
    and reused (those after the failure are not)."""
    return [f"study store: runs were recorded in {store_path()} (study {config.study.name}) "
            "only until it failed: a repeated search reuses what it still holds and measures "
            "the rest again"]


@contextlib.contextmanager
def disk_full_from(armed: list[bool]) -> Iterator[None]:
    """SQLite's real SQLITE_FULL on every connection Optuna checks out while ``armed[0]``:
    ``max_page_count`` caps the file at the pages it has, as a full disk does."""

    def cap(dbapi_connection, record, proxy) -> None:  # type: ignore[no-untyped-def]
        if armed[0] and isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute("PRAGMA max_page_count = 1")

    event.listen(Pool, "checkout", cap)
    try:
        yield
    finally:
        event.remove(Pool, "checkout", cap)


def test_the_local_store_hands_its_commits_to_the_os_and_a_storage_url_keeps_its_own() -> None:
    """The local store is a cache: every connection a search opens on it commits without
    waiting for the disk (``LOCAL_SYNCHRONOUS``); a ``--storage``
    database keeps SQLite's default (FULL, 2)."""
    seen: list[tuple[str, int]] = []

    def read(dbapi_connection, record, proxy) -> None:  # type: ignore[no-untyped-def]
        if isinstance(dbapi_connection, sqlite3.Connection):
            name = dbapi_connection.execute("PRAGMA database_list").fetchone()[2]
            mode = dbapi_connection.execute("PRAGMA synchronous").fetchone()[0]
            seen.append((Path(name).name, mode))

    event.listen(Pool, "checkout", read)
    try:
        search_with(lambda: None)
        own = replace(SETTINGS, cache=False,
                      storage=f"sqlite:///{store_path().parent / 'own.db'}")
        run_search(plan(), CLASSES, own, run=ScriptedDevice(SPEEDS))
    finally:
        event.remove(Pool, "checkout", read)
    assert {mode for name, mode in seen if name == "studies.db"} == {0}, seen
    assert {mode for name, mode in seen if name == "own.db"} == {2}, seen


def test_each_run_is_written_whole_when_it_ends_never_half_told() -> None:
    """A run is one finished trial written in one transaction (parameters, result, state): a
    run in flight is not in the store, so a search killed mid-run, or a store that fails
    between two writes, leaves no trial running forever or told in part."""
    from sqlalchemy.engine import Engine

    commits, at_run, in_flight = [0], [], []

    def count(conn) -> None:  # type: ignore[no-untyped-def]
        commits[0] += 1

    device = ScriptedDevice(SPEEDS)

    def run(spec):
        at_run.append(commits[0])
        with contextlib.closing(sqlite3.connect(store_path())) as db:
            in_flight.extend(db.execute(
                "SELECT state FROM trials WHERE state NOT IN ('COMPLETE', 'PRUNED')"))
        return device(spec)

    event.listen(Engine, "commit", count)
    try:
        outcome = run_search(plan(), CLASSES, SETTINGS, run=run)
    finally:
        event.remove(Engine, "commit", count)
    assert in_flight == []  # no run's trial is there while it runs
    # Between one run's start and the next's: that run's one write.
    assert [b - a for a, b in itertools.pairwise(at_run)] == [1] * (len(at_run) - 1), at_run
    study = optuna.load_study(study_name=outcome.study.name, storage=outcome.study.storage)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == len(device.specs) and all(
        t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        and "result" in t.user_attrs and "micro_batch" in t.params for t in trials)


def test_a_full_disk_mid_search_is_said_as_full_and_the_search_finishes() -> None:
    armed = [False]
    with disk_full_from(armed):
        outcome, _, said = search_with(lambda: armed.__setitem__(0, True))
    assert not outcome.interrupted and winner(outcome) == "bf16/default/32"
    assert outcome.study is not None
    assert "the disk is full (OperationalError: database or disk is full)" in outcome.study.note
    assert "damaged" not in outcome.study.note and len(said) == 1
    config = tuned_config(plan(), outcome, SETTINGS)
    assert study_lines(config) == [f"study store: {outcome.study.note}",
                                   *_recorded_until_it_failed(config)]
    assert store_path().is_file() and not list(store_path().parent.glob("*.corrupt-*"))


def test_a_full_disk_when_opening_runs_without_the_store_and_moves_nothing_aside() -> None:
    with disk_full_from([True]):  # not even the store's tables can be made
        outcome = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert winner(outcome) == "bf16/default/32"
    assert outcome.study is not None and outcome.study.storage == ""
    assert outcome.study.note == (
        f"study store {store_path()} not used: the disk is full (OperationalError: database "
        "or disk is full); runs are not kept")
    assert not list(store_path().parent.glob("*.corrupt-*"))


def full_database_error(tmp_path: Path) -> sqlite3.OperationalError:
    """The error SQLite itself raises when its file may not grow (SQLITE_FULL)."""
    db = sqlite3.connect(tmp_path / "full.db")
    db.execute("create table t (x blob)")
    db.execute("PRAGMA max_page_count = 2")
    with pytest.raises(sqlite3.OperationalError) as info:
        for _ in range(100):
            db.execute("insert into t values (zeroblob(4000))")
    db.close()
    return info.value


def not_a_database_error(tmp_path: Path) -> sqlite3.DatabaseError:
    (tmp_path / "junk.db").write_bytes(b"junk" * 1000)
    with pytest.raises(sqlite3.DatabaseError) as info:
        sqlite3.connect(tmp_path / "junk.db").execute("select * from sqlite_master")
    return info.value


def test_store_trouble_tells_a_full_disk_from_a_damaged_store(tmp_path: Path) -> None:
    full = full_database_error(tmp_path)
    assert str(full) == "database or disk is full"
    assert store_trouble(full) == ("full", "the disk is full (OperationalError: database or "
                                           "disk is full)")
    try:  # as Optuna raises it: wrapped by SQLAlchemy, then by Optuna
        raise optuna.exceptions.StorageInternalError("An exception is raised") from full
    except optuna.exceptions.StorageInternalError as wrapped:
        assert store_trouble(wrapped)[0] == "full"
    assert store_trouble(OSError(errno.ENOSPC, "No space left on device"))[0] == "full"
    damaged = not_a_database_error(tmp_path)
    assert store_trouble(damaged) == ("damaged", "it is damaged (DatabaseError: file is not a "
                                                 "database)")


def test_a_store_damaged_inside_is_moved_aside_and_a_fresh_one_started() -> None:
    run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    path = store_path()
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)  # the header intact, every page after it not
    path.write_bytes(bytes(data))
    outcome = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    [aside] = path.parent.glob("studies.db.corrupt-*")
    assert aside.read_bytes() == bytes(data)
    assert outcome.study is not None and outcome.study.note.startswith(
        f"study store {path} was damaged (DatabaseError: ")
    assert outcome.study.storage == f"sqlite:///{path}"


def test_another_programs_sqlite_database_at_the_store_path_is_left_untouched() -> None:
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("create table users (name text)")
        db.execute("insert into users values ('ada')")
    before = path.read_bytes()
    outcome = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert winner(outcome) == "bf16/default/32"
    assert path.read_bytes() == before and not list(path.parent.glob("studies.db.*-*"))
    assert outcome.study is not None and outcome.study.storage == ""
    assert outcome.study.note == (
        f"study store not used: {path} is an SQLite database of something else (tables: "
        "users), not autotune's store: left untouched, runs are not kept (set "
        "AUTOTUNE_CACHE_DIR to another folder, or remove it: `autotune cache clear` does)")
    listed = CliRunner().invoke(app, ["cache", "list"])
    assert listed.exit_code == 2 and "an SQLite database of something else" in listed.output
    assert path.read_bytes() == before  # listing did not add Optuna's tables either


def test_a_folder_at_the_store_path_is_left_and_cache_clear_removes_it() -> None:
    path = store_path()
    path.mkdir(parents=True)
    (path / "inside").write_text("x")
    aside = path.with_name("studies.db.corrupt-20260101T000000")  # an older version's move
    aside.mkdir()
    (aside / "inside").write_text("x")
    outcome = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert winner(outcome) == "bf16/default/32" and outcome.study is not None
    assert outcome.study.note.startswith(f"study store not used: {path} is a folder")
    assert (path / "inside").read_text() == "x"
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0, cleared.output
    assert not path.exists() and not aside.exists()
    again = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert again.study is not None and again.study.storage == f"sqlite:///{path}"


@pytest.mark.timeout(30)  # it waited for a writer forever, with signals held
@pytest.mark.parametrize("name", ["studies.db", "studies.db.lock"])
def test_a_fifo_at_the_store_path_is_never_opened(name: str) -> None:
    """Issue 61: a FIFO in place of the store (or its lock) is left as it is, the search runs
    without a store and says why, and `autotune cache list` says what is there."""
    fifo = store_path().with_name(name)
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    outcome = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert winner(outcome) == "bf16/default/32" and outcome.study is not None
    assert outcome.study.storage == ""
    assert outcome.study.note == ((
        f"study store not used: {store_path()} is a FIFO (named pipe), not autotune's store: "
        "left untouched, runs are not kept (set AUTOTUNE_CACHE_DIR to another folder, or "
        "remove it: `autotune cache clear` does)") if name == "studies.db" else (
        f"study store not used: cannot lock {store_path()}: {fifo} is a FIFO (named pipe), "
        "not a regular file; runs are not kept"))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if name == "studies.db":
        listed = CliRunner().invoke(app, ["cache", "list"])
        assert listed.exit_code == 2 and "is a FIFO (named pipe), not autotune's store" in (
            " ".join(listed.output.split())), listed.output


def test_the_estimators_figures_are_kept_for_a_repeat_and_a_failed_store_keeps_none() -> None:
    one = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    remember(one.ledger, "estimate:fp32/off:32:16", {"32": 5, "16": 3})
    two = run_search(plan(), CLASSES, SETTINGS, run=ScriptedDevice(SPEEDS))
    assert recall(two.ledger, "estimate:fp32/off:32:16") == {"32": 5, "16": 3}
    store_path().unlink()
    store_path().mkdir()  # the store gone under the finished search
    with pytest.warns(UserWarning, match="study store failed while keeping"):
        remember(two.ledger, "estimate:bf16/off:32:16", {"32": 4})
    assert recall(two.ledger, "estimate:fp32/off:32:16") is None  # not cached, no error
    assert two.ledger is not None and "failed while keeping" in two.ledger.record.note
