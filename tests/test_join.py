"""``--join``: one study shared by the searches of several nodes through PostgreSQL.

Each node is its own coordinator process (tests/join_node.py: a scripted device, no
training) on a throwaway PostgreSQL cluster (test_storage's fixture; skipped where
``initdb`` is missing). Together they run each candidate once; a node killed mid-run leaves
its claim to go stale, and another node fails it and runs the candidate again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.search import SearchSettings, claims, joining, run_search, tuned_config
from tests.scripted import BUDGET, CLASSES, VALUES, KnobDevice, ScriptedDevice, by_class, plan
from tests.scripted import SETTINGS as IN_MEMORY
from tests.test_storage import Cluster, postgres, search_with_server_stopped  # noqa: F401
from tests.test_store import SPEEDS, winner


def winner_of(outcome: object) -> str:
    """The pick of a search of the knobs (``winner`` says the class's)."""
    config = tuned_config(plan(), outcome, IN_MEMORY)  # type: ignore[arg-type]
    return f"{config.knobs.label()}/{config.micro_batch}"

ROOT = Path(__file__).resolve().parent.parent


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_node_left() -> Iterator[None]:
    """A node a failed test left waiting (e.g. on a claim never failed) is killed."""
    yield
    while _STARTED:
        node = _STARTED.pop()
        if node.poll() is None:
            node.kill()
            node.wait()


def _node(url: str, study: str, out: Path, hang: str = "", width: int = 1
          ) -> subprocess.Popen[bytes]:
    node = subprocess.Popen([sys.executable, "-m", "tests.join_node", url, study, str(out),
                             hang, str(width)], cwd=ROOT, stderr=subprocess.PIPE)
    _STARTED.append(node)
    return node


def _fresh_database(postgres: Cluster, name: str) -> str:  # noqa: F811
    """A new, empty database on the cluster: its URL."""
    import psycopg2

    db = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user,
                          password=postgres.password, dbname="postgres")
    db.autocommit = True
    db.cursor().execute(f"create database {name}")
    db.close()
    return postgres.readme_url().rsplit("/", 1)[0] + f"/{name}"


def _first_runs(ran: list[list[str]]) -> Counter[tuple[str, str]]:
    """The probes and first timings a node made (re-measures of its finalists are its own)."""
    return Counter((kind, cand) for kind, cand in ran if kind != "re-measure")


@pytest.mark.subprocess
def test_two_nodes_share_one_study_and_together_run_each_candidate_once(
        postgres: Cluster, tmp_path: Path) -> None:  # noqa: F811
    url = postgres.readme_url()
    solo = run_search(plan(), CLASSES, replace(IN_MEMORY, storage=url, study_name="solo",
                                               join=True), run=ScriptedDevice(SPEEDS))
    alone = _first_runs([[r.kind, f"{r.knobs.label()}/{r.micro_batch}"] for r in solo.runs])
    nodes = [_node(url, "pair", tmp_path / f"{n}.json") for n in "ab"]
    for node in nodes:
        assert node.wait(timeout=240) == 0, node.stderr.read().decode()[-3000:] \
            if node.stderr else ""
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    together = _first_runs(a["ran"]) + _first_runs(b["ran"])
    assert max(together.values()) == 1, together  # no probe or timing made twice
    assert set(together) == set(alone)  # and none left out
    assert a["winner"] == b["winner"] == winner(solo) == "bf16/default/32"
    # The outputs: written by the first node to end, once; the other names it.
    assert (a["outputs_by"], b["outputs_by"]) in (("", a["me"]), (b["me"], ""))
    # Each node's outcome lists every node's runs that ended before it did (the writer's
    # autotune.json lists them), each naming the node that ran it (runs[].node: host:pid, as
    # claims name them): the node that ended last lists every first run of the search.
    assert a["me"] != b["me"]
    for node in (a, b):
        listed = Counter((n, k, c) for n, k, c in node["listed"] if k != "re-measure")
        assert max(listed.values()) == 1
        for me in (a, b):
            assert {(k, c) for n, k, c in listed if n == me["me"]} <= set(_first_runs(me["ran"]))
    writer, last = (a, b) if a["outputs_by"] == "" else (b, a)
    assert {(k, c) for n, k, c in writer["listed"] if n == writer["me"]} >= set(
        _first_runs(writer["ran"]))
    assert Counter((k, c) for n, k, c in last["listed"] if k != "re-measure") == together
    assert {r.node for r in solo.runs} == {claims.who()}
    # A search of the study that begins after they ended (a resume) writes its own.
    third = tmp_path / "c.json"
    assert _node(url, "pair", third).wait(timeout=240) == 0
    assert json.loads(third.read_text())["outputs_by"] == ""


# slow: the everyday run keeps two nodes sharing one study and a real two-slot
# search (test_parallel.py)
@pytest.mark.slow
@pytest.mark.subprocess
def test_two_nodes_of_two_slots_each_split_the_joint_screens_batches(
        postgres: Cluster, tmp_path: Path) -> None:  # noqa: F811
    speeds = by_class(100, 150, 160, 200, 300, 330)
    solo = run_search(plan(), CLASSES, IN_MEMORY, values=VALUES, run=KnobDevice(speeds))
    alone = _first_runs([[r.kind, f"{r.knobs.label()}/{r.micro_batch}"] for r in solo.runs])
    url = _fresh_database(postgres, "slots")  # both open it at once: tables made once
    nodes = [_node(url, "slots", tmp_path / f"{n}.json", width=2) for n in "ab"]
    for node in nodes:
        assert node.wait(timeout=280) == 0, node.stderr.read().decode()[-3000:] \
            if node.stderr else ""
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    together = _first_runs(a["ran"]) + _first_runs(b["ran"])
    assert max(together.values()) == 1, together
    # the same timings; the baseline's memory probes differ: with two slots a node runs its
    # largest micro-batches ahead (``probe.probe_ahead``) where one slot bisects
    assert {k for k in together if k[0] != "probe"} == {k for k in alone if k[0] != "probe"}
    assert ("probe", "fp32/off/32") in together and ("probe", "fp32/off/32") not in alone
    assert a["winner"] == b["winner"] == winner_of(solo)


# slow: waits out a claim's 30 s; the everyday run keeps two nodes sharing one study
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_node_killed_mid_run_has_its_claim_failed_by_the_heartbeat_and_run_again(
        postgres: Cluster, tmp_path: Path) -> None:  # noqa: F811
    url = postgres.readme_url()
    first = run_search(plan(), CLASSES, IN_MEMORY, run=ScriptedDevice(SPEEDS)).runs[0]
    hang = f"{first.knobs.label()}/{first.micro_batch}"
    dead = _node(url, "killed", tmp_path / "dead.json", hang)
    deadline = time.monotonic() + 120
    while not (tmp_path / "dead.json.hang").exists():  # its claim is written, its run begun
        assert dead.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    other = _node(url, "killed", tmp_path / "other.json")
    assert other.wait(timeout=240) == 0, other.stderr.read().decode()[-3000:] \
        if other.stderr else ""
    out = json.loads((tmp_path / "other.json").read_text())
    assert out["winner"] == "bf16/default/32"
    assert [first.kind, hang] in out["ran"]  # run again, here
    study = optuna.load_study(study_name="killed", storage=url)
    runs_of = [t for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get("kind") == first.kind
               and t.user_attrs.get("candidate") == hang]
    states = sorted((t.state.name, t.user_attrs["claimed_by"].rsplit(":", 1)[1])
                    for t in runs_of)
    assert states == sorted([("FAIL", str(dead.pid)),
                             ("COMPLETE" if first.kind == "trial" else "PRUNED",
                              str(other.pid))])
    assert (f"(claimed by {runs_of[0].user_attrs['claimed_by'].rsplit(':', 1)[0]}:{dead.pid}) "
            "was failed (its heartbeat stopped) and its candidate run again") in out["note"]



@pytest.mark.parametrize(("extra", "said"), [
    ([], "--join shares one study between the nodes' searches through the store every node "
         "reaches: add --storage postgresql+psycopg2://user:pass@db-host/autotune and "
         "--study-name NAME"),
    (["--storage", "sqlite:////shared/autotune.db"],
     "--join needs a PostgreSQL --storage, got a sqlite:// URL (SQLite's locking is unsafe "
     "over a network file system"),
])
def test_join_without_a_postgresql_storage_is_refused_before_anything_runs(
        extra: list[str], said: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["search", "--join", "--device", "cpu", "--out",
                                      str(tmp_path), *extra])
    words = " ".join(result.stderr.split())
    assert result.exit_code == 2 and said in words, words
    assert "secret" not in words and not list(tmp_path.iterdir())


def test_join_from_python_is_refused_in_its_keywords() -> None:
    import autotune

    with pytest.raises(ConfigError) as info:
        autotune.search(target_batch=8, device="cpu", settings=SearchSettings(join=True))
    assert str(info.value).startswith(
        "join=True shares one study between the nodes' searches through the store every node "
        "reaches: add storage='postgresql+psycopg2://user:pass@db-host/autotune' and "
        "study_name='NAME'"), str(info.value)


@pytest.mark.subprocess
def test_a_joined_search_whose_server_goes_away_goes_on_locally_and_says_so(
        postgres: Cluster) -> None:  # noqa: F811
    outcome = search_with_server_stopped(postgres, replace(
        IN_MEMORY, storage=postgres.readme_url(), study_name="gone", join=True))
    alone = run_search(plan(), CLASSES, IN_MEMORY, run=ScriptedDevice(SPEEDS))
    assert not outcome.interrupted and winner(outcome) == winner(alone) == "bf16/default/32"
    assert outcome.num_runs == alone.num_runs  # every run made here, none waited for
    assert outcome.study is not None and "the search goes on without it" in outcome.study.note
    assert outcome.ledger is not None and outcome.ledger.outputs_by() == ""  # writes its own


# slow: three nodes' searches; the everyday run keeps two nodes sharing one study
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_node_of_another_device_kind_gets_its_own_answer_and_another_budget_is_refused(
        postgres: Cluster) -> None:  # noqa: F811
    # A mixed pool (H100 and A100 nodes) joined under one --study-name: one answer per device
    # kind, each from its own runs; the same device under another budget, or another kind
    # with another workload, is another search and refused, naming what differs.
    settings = replace(IN_MEMORY, storage=postgres.readme_url(), study_name="kinds", join=True)
    first = run_search(plan(), CLASSES, settings, run=ScriptedDevice(SPEEDS))
    a100 = replace(plan(), device=replace(plan().device, name="NVIDIA A100-SXM4-40GB"))
    other = run_search(a100, CLASSES, settings, run=ScriptedDevice(SPEEDS))
    assert first.study is not None and other.study is not None
    assert (first.study.name, other.study.name) == ("kinds", "kinds on NVIDIA A100-SXM4-40GB")
    assert other.num_runs == first.num_runs  # its own runs: none taken from the first kind
    assert other.ledger is not None and other.ledger.outputs_by() == ""  # its own outputs
    again = run_search(a100, CLASSES, settings, run=ScriptedDevice(SPEEDS))
    assert again.num_runs < other.num_runs  # a node of that kind joins that kind's study
    for report, differs in [(replace(plan(), budget_bytes=BUDGET // 2), "budget"),
                            (replace(a100, workload=WorkloadSpec(kind="hf", target="gpt2")),
                             "workload: ")]:
        with pytest.raises(ConfigError) as info:
            run_search(report, CLASSES, settings, run=ScriptedDevice(SPEEDS))
        said = str(info.value)
        assert differs in said and "study 'kinds' in" in said, said
        assert said.endswith("(--join shares evidence only between nodes of the same device "
                             "kind and memory, torch version and memory budget; a node of "
                             "another device kind gets its own answer, under the same "
                             "--study-name)"), said


@pytest.mark.slow  # one real search of the tiniest workload, on the CPU
@pytest.mark.subprocess
def test_a_joined_search_ended_after_another_nodes_writes_no_outputs_and_names_it(
        postgres: Cluster, tmp_path: Path) -> None:  # noqa: F811
    """The outputs are written once: by the node whose search ends first. Here another node
    (``node-b:1``) claims them while this search runs; this one writes nothing and says so."""
    import psycopg2

    from autotune import api
    from tests.conftest import workload_target

    url = _fresh_database(postgres, "outputs")

    def other_node_ends_first(*_: object) -> None:
        study = optuna.load_study(study_name="tiny", storage=url)
        if "outputs_written_by" in study.user_attrs:
            return
        db = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user,
                              password=postgres.password, dbname="postgres")
        with db, db.cursor() as cur:
            cur.execute("select now()")
            [(now,)] = cur.fetchall()
        db.close()
        study.set_user_attr("outputs_written_by", {"by": "node-b:1", "at": now.isoformat()})

    with pytest.warns(UserWarning, match="the outputs are written by node-b:1, the first of "
                                         "the joined searches to end"):
        request = api.TuneRequest(
            workload=api.workload_spec(workload=workload_target("tiny")), target_batch=1,
            device="cpu", precisions=("fp32",), compile_modes=("off",),
            memory_budget="2GiB")
        result = api.search(  # as the CLI calls it
            request, out=tmp_path, on_trial=other_node_ends_first,
            settings=SearchSettings(storage=url, study_name="tiny", join=True,
                                    num_timed_steps=3, micro_batches_per_class=1))
    assert result.path is None and list(tmp_path.iterdir()) == []
    assert result.config.study is not None
    assert (f"this node writes no {tmp_path / 'autotune.json'}") in result.config.study.note



def _claim_of(key: str, claimed_by: str = "",
              micro_batches: tuple[int, ...] = (8, 16)) -> optuna.trial.FrozenTrial:
    """The RUNNING trial a node's claim of ``key`` writes (``claimed_by``: another node's)."""
    from autotune.search import _study
    from autotune.search._records import Candidate

    asked = _study.ask(None, Candidate.from_key(key), micro_batches)
    trial = claims.claim_trial(asked.params, asked.distributions, key, "trial")
    if claimed_by:
        trial.set_user_attr("claimed_by", claimed_by)
    return trial


@pytest.mark.subprocess  # the PostgreSQL cluster
def test_a_claim_whose_first_heartbeat_never_came_is_failed_and_taken_over(
        postgres: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # A node that died between its claim's two commits (the RUNNING trial, then its first
    # heartbeat) leaves a claim Optuna's fail_stale_trials never finds: another node must
    # not wait on it for ever. One that beats is left to its node however long it runs.
    monkeypatch.setattr(claims, "GRACE_S", 1)
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.2)
    study = optuna.create_study(storage=joining.shared_storage(_fresh_database(
        postgres, "unbeaten")), study_name="unbeaten", direction="maximize")
    dead, alive = "fp32/off/8", "fp32/off/16"
    study._storage.create_new_trial(study._study_id,  # a claim without its heartbeat
                                    template_trial=_claim_of(dead, "gone-node:1"))
    beating = claims.Claims(study).claim(alive, ("trial",), _claim_of(alive))
    assert isinstance(beating, claims.Claimed)
    other = claims.Claims(study)
    try:
        first = other.claim(dead, ("trial",), _claim_of(dead))
        assert isinstance(first, claims.Taken) and first.attrs is None
        assert first.by == "gone-node:1" and other.failed == []
        time.sleep(1.5)  # GRACE_S of the server's clock since this node first saw it
        taken = other.claim(dead, ("trial",), _claim_of(dead))
        assert isinstance(taken, claims.Claimed)
        taken.stop()
        assert other.failed == [f"{dead} (claimed by gone-node:1) was failed (no heartbeat "
                                "came)"]
        # The beating claim, older than GRACE_S too, is still its node's.
        still = other.claim(alive, ("trial",), _claim_of(alive))
        assert isinstance(still, claims.Taken) and still.attrs is None
    finally:
        beating.stop()
    states = sorted((t.user_attrs["claimed_by"], t.state.name)
                    for t in study.get_trials(deepcopy=False)
                    if t.user_attrs["candidate"] == dead)
    assert states == sorted([("gone-node:1", "FAIL"), (claims.who(), "RUNNING")])


# slow: a node waits out its budget; the everyday run keeps two nodes sharing one study
@pytest.mark.slow
@pytest.mark.subprocess  # the PostgreSQL cluster
def test_a_node_waiting_on_another_nodes_run_stops_at_its_time_budget(
        postgres: Cluster) -> None:  # noqa: F811
    # One node's first run goes on (its claim beats); the other node needs that result
    # first and waits, bounded by its --time-budget as a run of its own would be.
    import threading

    url = _fresh_database(postgres, "waits")
    settings = replace(IN_MEMORY, storage=url, study_name="waits", join=True)
    begun, release = threading.Event(), threading.Event()
    device = ScriptedDevice(SPEEDS)

    def held(spec):  # the first node's first run: until the test releases it
        begun.set()
        release.wait(120)
        return device(spec)

    first = threading.Thread(target=run_search, args=(plan(), CLASSES, settings),
                             kwargs={"run": held}, daemon=True)
    first.start()
    try:
        assert begun.wait(60)
        # the other node's run ends only when this test releases it, after this search
        outcome = run_search(plan(), CLASSES, replace(settings, time_budget_s=3.0),
                             run=ScriptedDevice(SPEEDS))
        assert outcome.num_runs == 0 and outcome.stop_reason.kind == "time-budget"
    finally:
        release.set()
        first.join(120)


# slow: two nodes' searches again; the everyday run keeps two nodes sharing one study
@pytest.mark.slow
@pytest.mark.subprocess  # the PostgreSQL cluster
def test_a_joined_max_trials_counts_the_runs_of_every_node(postgres: Cluster) -> None:  # noqa: F811
    # Nodes that together make a search make at most --max-trials runs together: here,
    # once this node's first run has begun, another node claims three runs of its own (and
    # a fourth it released, which is no run), and this node (--max-trials 5) makes one more.
    url = _fresh_database(postgres, "capped")
    divisors = (1, 2, 4, 8, 16, 32, 64)  # the search's micro-batches of 64
    settings = replace(IN_MEMORY, storage=url, study_name="capped", join=True, max_trials=5)
    device, others = ScriptedDevice(SPEEDS), []

    def first_run_then_another_node(spec):
        if not others:
            study = optuna.load_study(study_name="capped", storage=url)
            node = claims.Claims(study)
            others.extend(node.claim(key, ("trial",), _claim_of(key, "node-b:2", divisors))
                          for key in ("fp16/off/8", "fp16/off/16", "fp16/default/8"))
            released = node.claim("fp16/default/16", ("trial",),
                                  _claim_of("fp16/default/16", "node-b:2", divisors))
            study._storage.set_trial_state_values(released.trial_id,  # a claim released
                                                  optuna.trial.TrialState.FAIL)
            released.stop()
        return device(spec)

    try:
        outcome = run_search(plan(), CLASSES, settings, run=first_run_then_another_node)
    finally:
        for claimed in others:
            claimed.stop()
    assert len(others) == 3 and all(isinstance(c, claims.Claimed) for c in others)
    assert outcome.num_runs == 2 and outcome.stop_reason.kind == "max-trials"
    alone = run_search(plan(), CLASSES, replace(IN_MEMORY, max_trials=5),
                       run=ScriptedDevice(SPEEDS))
    assert alone.num_runs == 5  # the same search alone makes its five


@pytest.mark.parametrize("claimed_by", ["node-a:1\n[experimental]", "a\u2028b:2", 7])
def test_a_claim_read_back_names_its_node_as_text_the_file_can_hold(claimed_by: object) -> None:
    # A shared study is written by other tools too: what its claims say of their node reaches
    # autotune.json's runs[].node, whose reader refuses control characters.
    from autotune.search._trials import stored_runs
    from autotune.serialize import control_character

    study = optuna.create_study(direction="maximize")
    trial = _claim_of("fp32/off/8")
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=1.0, params=trial.params,
        distributions=trial.distributions, user_attrs={
            "candidate": "fp32/off/8", "kind": "trial", "claimed_by": claimed_by,
            "result": json.dumps({"status": "ok"})}))
    [run], _ = stored_runs(study, 2**30)
    assert control_character(run.node) is None and run.node != ""
    assert run.node == (str(claimed_by) if isinstance(claimed_by, int)
                        else claimed_by.encode("unicode_escape").decode())


def _server_now(study: optuna.Study) -> datetime:
    """The database server's clock (the one claims and joined searches are stamped with)."""
    from sqlalchemy import text

    with study._storage._backend.engine.connect() as conn:
        return conn.execute(text("select now()")).scalar_one()


def _began(study: optuna.Study, seconds_ago: float, by: str = "node-a:1") -> None:
    """Another node began a joined search on ``study`` ``seconds_ago`` (server clock)."""
    at = _server_now(study) - timedelta(seconds=seconds_ago)
    study.set_user_attr(claims.SEARCH_ATTR, {"by": by, "at": at.isoformat()})


@pytest.mark.subprocess  # the PostgreSQL cluster
def test_a_node_that_joins_late_counts_its_budget_and_runs_from_when_the_search_began(
        postgres: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # Node A began the joined search 20 s ago and has a run under way, claimed after it
    # began, with one more it finished: a node opening now joins that search (its start, its
    # runs), not one of its own; it is over once A wrote the outputs, once this node's
    # budget is spent since it began, or once no run was under way or claimed for IDLE_S.
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.2)
    study = optuna.create_study(storage=joining.shared_storage(_fresh_database(
        postgres, "late")), study_name="late", direction="maximize")
    _began(study, 20)
    other = claims.Claims(study)
    running = other.claim("fp32/off/8", ("trial",), _claim_of("fp32/off/8", "node-a:1"))
    finished = other.claim("fp32/off/16", ("trial",), _claim_of("fp32/off/16", "node-a:1"))
    assert isinstance(running, claims.Claimed) and isinstance(finished, claims.Claimed)
    study._storage.set_trial_state_values(finished.trial_id, optuna.trial.TrialState.COMPLETE,
                                          [1.0])
    finished.stop()
    try:
        late = claims.Claims(study, time_budget_s=600)
        assert late.began_by == "node-a:1" and 20 <= late.late_s < 60
        assert late.began < late.opened and late.runs_since_began() == 2
        # a budget spent since the search began: this node begins a search of its own
        spent = claims.Claims(study, time_budget_s=15)
        assert spent.began_by == "" and spent.late_s == 0 and spent.runs_since_began() == 0
        assert study.user_attrs[claims.SEARCH_ATTR]["by"] == claims.who()
        # ... which the next node joins as this node's (the same host:pid here: not late)
        assert claims.Claims(study, time_budget_s=600).began == spent.began
        _began(study, 20)
        study.set_user_attr(claims.OUTPUTS_ATTR, {"by": "node-a:1", "at": _server_now(
            study).isoformat()})  # A ended and wrote the outputs: that search is over
        assert claims.Claims(study).began_by == ""
    finally:
        running.stop()
    # No run under way (A's claim failed, its heartbeat gone) nor claimed for IDLE_S: over.
    study._storage.set_trial_state_values(running.trial_id, optuna.trial.TrialState.FAIL)
    study.set_user_attr(claims.OUTPUTS_ATTR, {"by": "node-a:1", "at": (
        _server_now(study) - timedelta(seconds=60)).isoformat()})  # an earlier search's
    monkeypatch.setattr(claims, "IDLE_S", 1)
    time.sleep(1.5)  # IDLE_S of the server's clock since the last claim
    _began(study, 20)
    assert claims.Claims(study).began_by == ""
    _began(study, 0.5)  # began just now, nothing claimed since: under way
    assert claims.Claims(study).began_by == "node-a:1"
    # Another tool wrote the node's name: its control characters are escaped (the note goes
    # into autotune.json, whose reader refuses them).
    _began(study, 0.5, by="node-a:1\n[experimental]")
    assert claims.Claims(study).began_by == "node-a:1\\n[experimental]"
    # What another tool wrote there, unreadable as a search's beginning: this node begins one.
    for written in ({"by": "node-a:1", "at": "not a time"}, {"by": "node-a:1",
                    "at": "2026-11-29T10:00:00"}, "node-a:1", None, {"at": 7}):
        study.set_user_attr(claims.SEARCH_ATTR, written)
        assert claims.Claims(study).began_by == "", written


@pytest.mark.subprocess  # the PostgreSQL cluster
def test_a_node_joining_a_search_near_its_budget_stops_on_it_and_says_why(
        postgres: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # The search node A began 15 s ago has a run under way; this node's --time-budget of 30 s
    # counts from then: less than a child run needs (20 s here) is left, and the outcome says
    # it joined. Alone, the same budget runs.
    from autotune.search import executor

    monkeypatch.setattr(executor, "MIN_CHILD_S", 20.0)
    url = _fresh_database(postgres, "nearly")
    study = optuna.create_study(storage=joining.shared_storage(url), study_name="nearly",
                                direction="maximize")
    _began(study, 15)
    running = claims.Claims(study).claim("fp32/off/8", ("trial",), _claim_of(
        "fp32/off/8", "node-a:1", (1, 2, 4, 8, 16, 32, 64)))  # the search's micro-batches
    settings = replace(IN_MEMORY, storage=url, study_name="nearly", join=True,
                       time_budget_s=30.0)
    try:
        outcome = run_search(plan(), CLASSES, settings, run=ScriptedDevice(SPEEDS))
        alone = run_search(plan(), CLASSES, replace(IN_MEMORY, time_budget_s=30.0),
                           run=ScriptedDevice(SPEEDS))
    finally:
        assert isinstance(running, claims.Claimed)
        running.stop()
    assert outcome.num_runs == 0 and outcome.stop_reason.kind == "time-budget"
    assert re.search(r"joined the search node-a:1 began 1[5-9] s before \(the database "
                     r"server's clock\): this node's --time-budget and --max-trials count "
                     "from then", outcome.study.note), outcome.study.note
    assert alone.num_runs > 0  # the same budget alone runs
