"""One study shared by several nodes (``--storage postgresql+... --study-name NAME --join``).

Each node's coordinator runs the same search against the same PostgreSQL study. Before a run
starts, its coordinator claims the candidate in the store: under a PostgreSQL advisory lock
held by one coordinator at a time (``pg_advisory_xact_lock`` on the study's id), it fails the
claims whose heartbeat stopped (``optuna.storages.fail_stale_trials``), reads the study's
trials of that candidate, and either takes a result another node finished (its evidence, no
run), finds it running elsewhere (a live claim: the candidate is left to that node), or
writes its own claim: a RUNNING trial with the candidate's parameters and who claimed it
(``claimed_by``, host:pid), its first heartbeat recorded before the lock is released. So two
coordinators never both run a candidate, and each candidate of a batch is run once by
whichever claims it first.

A claim's heartbeat is refreshed by a thread every ``HEARTBEAT_S`` (Optuna's heartbeat table,
stamped with the database server's clock, so nodes' clocks need not agree); a claim not
refreshed for ``GRACE_S`` is failed by the next coordinator that claims anything (its node
died or lost the server), and its candidate is claimed and run again; so is a claim whose
first heartbeat has not come ``GRACE_S`` after a coordinator first saw it (its node died
between the claim's two commits: ``Claims._never_beat``). The run's end finishes
the claimed trial (its attributes, constraint and state: several writes; ``_study._write``).
"""

from __future__ import annotations

import os
import socket
import threading
import warnings
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from autotune.config import TrialSpec
from autotune.serialize import control_character

if TYPE_CHECKING:
    import optuna

HEARTBEAT_S = 5
"""Seconds between a claim's heartbeats."""
GRACE_S = 30
"""A claim whose heartbeat is older than this is failed and its candidate run again: long
enough for a loaded database server, short against a child run."""
OUTPUTS_ATTR = "outputs_written_by"
"""The study attribute naming the node that writes the joined searches' outputs, and when."""
POLL_S = 1.0
"""Seconds between looks at a candidate another node runs, while its result is waited for."""
CLAIMED_AT = "claimed_at"
"""A claim's user attribute: when it was claimed, by the database server's clock."""
SEARCH_ATTR = "joined_search"
"""The study attribute saying when the joined search under way began and on which node (the
database server's clock): a node that joins it later counts its ``--time-budget`` and
``--max-trials`` from then (``Claims.began``)."""
IDLE_S = 60
"""A joined search with no run under way and none claimed for this long is over (its nodes
ended or died): the next node to open the study begins another."""


class Elsewhere(Exception):
    """Another node runs this spec now (``Executor.measure`` told not to wait for it)."""

    def __init__(self, spec: TrialSpec) -> None:
        super().__init__(spec.knobs.label())
        self.spec = spec


def node_text(claimed_by: object) -> str:
    """A node's ``host:pid`` as another node wrote it (a claim, the joined search's beginning)
    as ``autotune.json`` may hold it: text a study shared by other tools may have set to
    anything, its control characters escaped (``autotune.json``'s reader refuses them)."""
    node = str(claimed_by)
    return node if control_character(node) is None else node.encode("unicode_escape").decode()


def who() -> str:
    """This coordinator, as a claim names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Claimed:
    """A candidate this coordinator claimed: its RUNNING trial, kept alive by a heartbeat
    until ``stop``."""

    trial_id: int
    _stop: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Taken:
    """A candidate claimed elsewhere: its result when another node finished it (None: still
    running there)."""

    attrs: dict[str, Any] | None
    by: str = ""


class Claims:
    """Claims of one joined study (``Ledger`` uses them; any store error goes up to it)."""

    def __init__(self, study: optuna.Study, time_budget_s: float | None = None) -> None:
        """``time_budget_s``: this node's ``--time-budget`` (a joined search it has spent
        since it began is over: this node begins another)."""
        from sqlalchemy import text

        self.study = study
        storage = study._storage
        # the storage's pool (behind Optuna's cache of finished trials): the lock uses it
        self._engine = getattr(storage, "_backend", storage).engine
        self._lock_sql = text("select pg_advisory_xact_lock(:key)")
        self._key = zlib.crc32(f"autotune:{study._study_id}".encode())
        self.live: list[Claimed] = []
        """The claims made here whose heartbeats may still beat (``stop_all``)."""
        self.failed: list[str] = []
        """Claims failed because their heartbeat stopped or never began, each as its note's
        clause: ``candidate (claimed by host:pid) was failed (its heartbeat stopped)``."""
        self._unbeaten: dict[int, datetime] = {}
        """Claims seen RUNNING without a heartbeat yet, by trial id: when first seen
        (``_never_beat``)."""
        getattr(storage, "_backend", storage).heartbeat_stale_trial_callback = self._stale
        with self._engine.connect() as conn, conn.begin():  # the server's clock, not a node's
            conn.execute(self._lock_sql, {"key": self._key})
            self.opened: datetime = conn.execute(text("select now()")).scalar_one()
            self.began, self.began_by = self._joined(time_budget_s)
        self.late_s = (self.opened - self.began).total_seconds() if self.began_by else 0.0
        """How long before this node opened the study another node began the joined search
        it joins (0: this node began it)."""

    def _joined(self, time_budget_s: float | None) -> tuple[datetime, str]:
        """The joined search under way (``SEARCH_ATTR``): when it began and on which node
        ("" for this one), unless it is over (its outputs written, ``time_budget_s`` spent
        since it began, or ``IDLE_S`` without a run); then this node begins one now."""
        import optuna

        under_way = self.study.user_attrs.get(SEARCH_ATTR)
        at = _stamp(under_way.get("at")) if isinstance(under_way, dict) else None
        if at is not None and isinstance(under_way, dict):
            self._fail_stale()
            outputs = self.study.user_attrs.get(OUTPUTS_ATTR)
            claimed = [(t.state, stamp) for t in self.study.get_trials(deepcopy=False)
                       if (stamp := _stamp(t.user_attrs.get(CLAIMED_AT))) and stamp > at]
            last = max((stamp for _, stamp in claimed), default=at)
            over = ((isinstance(outputs, dict) and _after(outputs.get("at"), at))
                    or (time_budget_s is not None
                        and (self.opened - at).total_seconds() >= time_budget_s)
                    or (all(state != optuna.trial.TrialState.RUNNING for state, _ in claimed)
                        and (self.opened - last).total_seconds() > IDLE_S))
            by = node_text(under_way.get("by", "?"))
            if not over:
                return at, "" if by == who() else by
        self.study.set_user_attr(SEARCH_ATTR, {"by": who(), "at": self.opened.isoformat()})
        return self.opened, ""

    def _fail_stale(self) -> None:
        """Fail the claims whose heartbeat stopped (``_stale`` notes each)."""
        import optuna

        with warnings.catch_warnings():  # "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def claim(self, candidate: str, kinds: tuple[str, ...], trial: optuna.trial.FrozenTrial
              ) -> Claimed | Taken:
        """Claim ``candidate`` for a run of one of ``kinds`` (the first is the run's), or say
        who has it: ``trial`` is the RUNNING trial to write (parameters, attributes)."""
        import optuna
        from sqlalchemy import text

        state = optuna.trial.TrialState
        storage = self.study._storage
        with self._engine.connect() as conn, conn.begin():
            conn.execute(self._lock_sql, {"key": self._key})  # held until this block ends
            self._fail_stale()
            mine = [t for t in self.study.get_trials(deepcopy=False)
                    if t.user_attrs.get("candidate") == candidate
                    and t.user_attrs.get("kind") in kinds]
            for t in mine:
                if t.state in (state.COMPLETE, state.PRUNED) and "result" in t.user_attrs:
                    return Taken(dict(t.user_attrs), str(t.user_attrs.get("claimed_by", "")))
            now = conn.execute(text("select now()")).scalar_one()  # the server's clock
            running = [t for t in mine
                       if t.state == state.RUNNING and t.user_attrs.get("kind") == kinds[0]]
            for t in self._never_beat(conn, running, now):
                storage.set_trial_state_values(t._trial_id, state.FAIL)
                self._stale(self.study, t, "no heartbeat came")
                running.remove(t)
            if running:
                return Taken(None, str(running[0].user_attrs.get("claimed_by", "")))
            trial.set_user_attr(CLAIMED_AT, now.isoformat())  # a joined --max-trials counts it
            trial_id = storage.create_new_trial(self.study._study_id, template_trial=trial)
            storage.record_heartbeat(trial_id)
        claimed = Claimed(trial_id)
        self.live = [c for c in self.live if not c._stop.is_set()] + [claimed]
        threading.Thread(target=self._beat, args=(claimed,), daemon=True,
                         name=f"autotune-heartbeat-{trial_id}").start()
        return claimed

    def _never_beat(self, conn: Any, running: list[optuna.trial.FrozenTrial],
                    now: datetime) -> list[optuna.trial.FrozenTrial]:
        """The claims of ``running`` whose first heartbeat never came within ``GRACE_S``.

        A claim's first heartbeat is written one commit after the claim itself (``claim``):
        a node that died between the two leaves a RUNNING trial without a heartbeat, which
        ``fail_stale_trials`` never finds (it times only heartbeats), and every other node
        would wait on it for ever. Each such claim is timed from when this node first saw it
        (the database server's clock, as heartbeats are); one still without a heartbeat
        ``GRACE_S`` later is gone."""
        from sqlalchemy import text

        if not running:
            return []
        beating = {row[0] for row in conn.execute(
            text("select trial_id from trial_heartbeats where trial_id = any(:ids)"),
            {"ids": [t._trial_id for t in running]})}
        gone = []
        for t in running:
            if t._trial_id in beating:
                self._unbeaten.pop(t._trial_id, None)
                continue
            first = self._unbeaten.setdefault(t._trial_id, now)
            if (now - first).total_seconds() > GRACE_S:
                gone.append(t)
        return gone

    def runs_since_began(self) -> int:
        """The runs every node claimed since the joined search began (``began``), this
        node's included, finished or running (a claim failed or released is none): what a
        joined search's ``--max-trials`` counts, so that the nodes together make at most that
        many, however late one joined."""
        import optuna

        failed = optuna.trial.TrialState.FAIL
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.state != failed and _after(t.user_attrs.get(CLAIMED_AT), self.began))

    def others_finished(self, known: set[int]) -> list[tuple[optuna.trial.FrozenTrial, float]]:
        """The runs other nodes finished that are not ``known`` (the trial numbers this node
        read when it opened the study), each with when it was claimed, in seconds after that
        opening (the server's clock: a timeline all nodes share; 0 for one claimed before);
        in the order they were claimed."""
        import optuna

        state, me, runs = optuna.trial.TrialState, who(), []
        for t in self.study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED)):
            at = t.user_attrs.get(CLAIMED_AT)
            if t.user_attrs.get("claimed_by") not in (None, me) and t.number not in known:
                runs.append((t, (datetime.fromisoformat(at) - self.opened).total_seconds()
                             if _after(at, self.opened) else 0.0))
        return sorted(runs, key=lambda run: run[1])

    def outputs(self) -> str:
        """Who writes this search's outputs: '' when this node does (the first of the joined
        searches to end, since this one opened the study; said in the study, attribute
        ``outputs_written_by``), else the node that does (``host:pid``)."""
        from sqlalchemy import text

        with self._engine.connect() as conn, conn.begin():
            conn.execute(self._lock_sql, {"key": self._key})
            now = conn.execute(text("select now()")).scalar_one()
            before = self.study.user_attrs.get(OUTPUTS_ATTR)
            if isinstance(before, dict) and _after(before.get("at"), self.opened):
                return str(before.get("by", "?"))
            self.study.set_user_attr(OUTPUTS_ATTR, {"by": who(), "at": now.isoformat()})
        return ""

    def stop_all(self) -> None:
        """Stop every heartbeat of this node (the search stopped using the store): a claim
        it will never finish goes stale, and another node runs its candidate."""
        for claimed in self.live:
            claimed.stop()

    def _stale(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
               why: str = "its heartbeat stopped") -> None:
        """A claim failed by its stopped heartbeat (``fail_stale_trials``), or one whose
        first heartbeat never came (``_never_beat``): noted."""
        self.failed.append(f"{trial.user_attrs.get('candidate')} (claimed by "
                           f"{trial.user_attrs.get('claimed_by')}) was failed ({why})")

    def _beat(self, claimed: Claimed) -> None:
        """Refresh the claim's heartbeat until its run ends. A store failure here is left to
        the search's own next write to find (its ledger says it once)."""
        storage = self.study._storage
        while not claimed._stop.wait(HEARTBEAT_S):
            try:
                storage.record_heartbeat(claimed.trial_id)
            except Exception:  # the server gone: the claim goes stale, as a dead node's
                return


def _after(stamp: object, opened: datetime) -> bool:
    """Whether ``stamp`` (the outputs' claim, ISO text) is later than ``opened``."""
    when = _stamp(stamp)
    return when is not None and when > opened


def _stamp(text: object) -> datetime | None:
    """A time another node wrote (ISO text, the server's clock, with its zone); None for
    anything else."""
    try:
        when = datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else None


def finish(study: optuna.Study, claimed: Claimed, trial: optuna.trial.FrozenTrial) -> None:
    """End a claimed run: its trial gets ``trial``'s attributes, constraint and state (the
    state last: until then the claim is RUNNING, and a node that dies here leaves it to go
    stale and be run again)."""
    storage = study._storage
    try:  # beating until the state is written: a slow finish is no stale claim
        for key, value in trial.user_attrs.items():
            storage.set_trial_user_attr(claimed.trial_id, key, value)
        for key, value in trial.system_attrs.items():  # the constraint Optuna reads
            storage.set_trial_system_attr(claimed.trial_id, key, value)
        storage.set_trial_state_values(claimed.trial_id, trial.state,
                                       None if trial.value is None else [trial.value])
    finally:
        claimed.stop()


def claim_trial(params: dict[str, object],
                distributions: dict[str, optuna.distributions.BaseDistribution],
                candidate: str, kind: str) -> optuna.trial.FrozenTrial:
    """The RUNNING trial a claim writes: the candidate's parameters, what run it is for, and
    which coordinator runs it."""
    import optuna

    return optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=params, distributions=distributions,
        user_attrs={"candidate": candidate, "kind": kind, "claimed_by": who()})
