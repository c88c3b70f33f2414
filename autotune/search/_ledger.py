"""The one place a search touches its study store once it is open: it asks for each run's
trial, tells its result, reads what the study held, and keeps the estimator's figures.

The store is a cache: any failure of it (the SQLite file removed or replaced by ``autotune
cache clear`` from another shell, the cache disk full, the PostgreSQL server of
``--storage`` gone) costs the cache, never the search. From the first failure on the search
records nothing more, goes on, and says once what failed: a warning at once, and the
study's note, which the footer and ``autotune.json`` carry.
"""

from __future__ import annotations

import contextlib
import errno
import json
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from autotune.config import TrialResult
from autotune.schema import RunRecord, StudyRecord
from autotune.schema_study import STORE_FAILED
from autotune.search import _study, _trials, claims
from autotune.search._records import Candidate
from autotune.serialize import from_json_dict

if TYPE_CHECKING:
    import optuna

Trouble = Literal["full", "read-only", "moved", "damaged", "unreachable", "failed"]

_SAID: dict[Trouble, str] = {
    "full": "the disk is full",
    "read-only": "it cannot be written",
    "moved": "its file was removed or replaced meanwhile (e.g. `autotune cache clear`)",
    "damaged": "it is damaged",
    "unreachable": "its server cannot be reached",
    "failed": "it failed",
}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, then what it wraps (SQLAlchemy's ``orig``, causes, contexts), innermost last."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen) and len(seen) < 8:
        seen.append(current)
        current = (getattr(current, "orig", None) or current.__cause__
                   or current.__context__)
    return seen


def store_trouble(exc: BaseException) -> tuple[Trouble, str]:
    """What a store failure is, and the one line saying so (its innermost error quoted):
    a full disk (``ENOSPC``, SQLite's ``SQLITE_FULL``) is not a damaged store, and only a
    damaged one is moved aside when opening."""
    chain = _chain(exc)
    codes = {str(getattr(e, "sqlite_errorname", "") or "") for e in chain}
    numbers = {getattr(e, "errno", None) for e in chain}
    text = " | ".join(str(e) for e in chain).lower()
    kind: Trouble = "failed"
    if (numbers & {errno.ENOSPC, errno.EDQUOT} or "SQLITE_FULL" in codes
            or "database or disk is full" in text or "no space left" in text):
        kind = "full"
    elif "SQLITE_READONLY_DBMOVED" in codes or "no such table" in text:
        kind = "moved"
    elif (any(c.startswith("SQLITE_READONLY") for c in codes) or "readonly database" in text
          or numbers & {errno.EROFS, errno.EACCES}):
        kind = "read-only"
    elif (codes & {"SQLITE_NOTADB", "SQLITE_CORRUPT"} or "file is not a database" in text
          or "malformed" in text or "no such column" in text or "has no column" in text
          or "no longer compatible with the table schema" in text):
        kind = "damaged"
    elif any(s in text for s in ("server closed the connection", "could not connect",
                                 "connection refused", "terminating connection",
                                 "connection to server", "lost connection", "can't connect")):
        kind = "unreachable"
    return kind, f"{_SAID[kind]} ({inner_error(exc)})"


def inner_error(exc: BaseException) -> str:
    """``Type: first line`` of the innermost error that says something (Optuna's
    ``StorageInternalError`` wraps SQLAlchemy's, which wraps the driver's)."""
    inner = next((e for e in reversed(_chain(exc)) if str(e).strip()), exc)
    text = str(inner).strip()
    return f"{type(inner).__name__}: {text.splitlines()[0] if text else ''}"


class Ledger:
    """The search's study, behind one seam: each call that touches the store turns its
    failure into "not cached" (a note, a warning once), never an error of the search."""

    def __init__(self, study: optuna.Study, record: StudyRecord, *,
                 shared: bool = False, time_budget_s: float | None = None) -> None:
        """``shared``: the study is joined by other nodes' searches (``--join``): each run
        is claimed first (``claim``); ``time_budget_s``: this node's ``--time-budget``
        (``Claims``)."""
        self._study: optuna.Study | None = study
        self.record = record
        """What the search says of its study (``SearchOutcome.study``): its note grows."""
        self._shown = record.storage
        self.claims = claims.Claims(study, time_budget_s) if shared else None
        if self.claims is not None and self.claims.began_by:
            self.note(f"joined the search {self.claims.began_by} began "
                      f"{self.claims.late_s:,.0f} s before (the database server's clock): "
                      "this node's --time-budget and --max-trials count from then")
        self._known: set[int] = set()
        """The study's finished trials ``stored_runs`` read (``others_runs`` adds the rest)."""

    @property
    def ok(self) -> bool:
        """Whether runs are still recorded."""
        return self._study is not None

    def note(self, text: str) -> None:
        """Add to what the report says of the store."""
        self.record = replace(self.record, note="; ".join(filter(None, (self.record.note,
                                                                          text))))

    def _failed(self, what: str, exc: Exception) -> None:
        """Stop using the store, saying once why."""
        if self._study is None:
            return
        self._study = None
        if self.claims is not None:  # its claims are never finished: let them go stale
            self.claims.stop_all()
        _, why = store_trouble(exc)
        line = _study.redact_text(
            f"{STORE_FAILED}{what}: {why}; the search goes on without it (the runs from here "
            "on are not kept)", self._shown)
        self.note(line)
        warnings.warn(f"study store {line}", stacklevel=3)

    def completed(self) -> dict[Candidate, list[TrialResult]]:
        """``_trials.completed``, or nothing once the store failed."""
        if self._study is not None:
            try:
                return _trials.completed(self._study)
            except Exception as exc:  # any store failure: not cached
                self._failed("reading its runs", exc)
        return {}

    def probed(self) -> dict[Candidate, TrialResult]:
        """``_trials.probed``, or nothing once the store failed."""
        if self._study is not None:
            try:
                return _trials.probed(self._study)
            except Exception as exc:
                self._failed("reading its probes", exc)
        return {}

    def stored_runs(self, usable_bytes: int) -> list[RunRecord]:
        """``_trials.stored_runs``, or none once the store failed."""
        if self._study is not None:
            try:
                runs, self._known = _trials.stored_runs(self._study, usable_bytes)
                return runs
            except Exception as exc:
                self._failed("reading its runs", exc)
        return []

    def claim(self, candidate: Candidate, kind: Literal["trial", "probe"],
              micro_batches: Sequence[int], *, wait: bool = True,
              waiting: Callable[[], None] | None = None
              ) -> _study.Asked | TrialResult | None:
        """In a joined study, claim ``candidate``'s run before it starts (``claims``): this
        node's run (its ``Asked``, to pass to ``running``), or the result another node
        finished (no run here), or None when another node runs it now and ``wait`` is False
        (with ``wait``, the result is waited for, and a claim gone stale is taken over;
        ``waiting`` is called before each look again, and what it raises ends the wait: the
        search's limits, ``Executor.waiting``).
        Without a store (it failed) the run is this node's, unrecorded."""
        asked = _study.ask(self._study, candidate, micro_batches)
        while self._study is not None and self.claims is not None:
            kinds = ("trial",) if kind == "trial" else ("probe", "trial")
            try:
                got = self.claims.claim(candidate.key(), kinds, claims.claim_trial(
                    asked.params, asked.distributions, candidate.key(), kind))
            except Exception as exc:
                self._failed(f"claiming {candidate.key()}", exc)
                break
            for line in self.claims.failed:
                self.note(f"the claim of {line} and its candidate run again")
            self.claims.failed.clear()
            if isinstance(got, claims.Claimed):
                return replace(asked, claimed=got)
            if got.attrs is not None:
                return from_json_dict(TrialResult, json.loads(got.attrs["result"]))
            if not wait:
                return None
            if waiting is not None:
                waiting()
            time.sleep(claims.POLL_S)
        return asked

    @property
    def late_s(self) -> float:
        """How long before this node opened the study the joined search it joined began (0:
        alone, or this node began it): ``--time-budget`` counts from then."""
        return self.claims.late_s if self.claims is not None else 0.0

    def joint_runs(self) -> int | None:
        """In a joined study, every node's runs since the joined search began
        (``Claims.runs_since_began``); None alone, or once the store failed."""
        if self.claims is None or self._study is None:
            return None
        try:
            return self.claims.runs_since_began()
        except Exception as exc:
            self._failed("counting the joined runs", exc)
            return None

    def others_runs(self, usable_bytes: int) -> list[RunRecord]:
        """In a joined study, the runs other nodes finished that ``stored_runs`` did not read
        (``_trials.others_runs``: the writer's outputs list every node's runs); none alone, or
        once the store failed."""
        if self.claims is None or self._study is None:
            return []
        try:
            return _trials.others_runs(self.claims, self._known, usable_bytes)
        except Exception as exc:
            self._failed("reading the other nodes' runs", exc)
            return []

    def outputs_by(self) -> str:
        """In a joined study, the node that writes the outputs when it is another ('': this
        one; also without a joined study, or once the store failed: each node then writes
        its own)."""
        if self.claims is None or self._study is None:
            return ""
        try:
            return self.claims.outputs()
        except Exception as exc:
            self._failed("claiming the outputs", exc)
            return ""

    def release(self, asked: _study.Asked | None) -> None:
        """A claimed run that did not start (a limit stopped it): its claim failed, so
        another node may run it."""
        if asked is not None and asked.claimed is not None and self._study is not None:
            try:
                _study.fail(self._study, asked)
            except Exception as exc:
                self._failed(f"releasing the claim of {asked.candidate.key()}", exc)

    @contextlib.contextmanager
    def running(self, candidate: Candidate, micro_batches: Sequence[int],
                claimed: _study.Asked | None = None) -> Iterator[_study.Asked | None]:
        """The run of ``candidate`` beginning (None once the store failed), written when it
        ends (``tell``); a run that raises (Ctrl-C) is written failed. Only the store's own
        failures are caught: what the run raises goes on up. ``claimed``: its claim in a
        joined study (``claim``), which its end finishes."""
        asked = None if self._study is None else claimed if claimed is not None else \
            _study.ask(self._study, candidate, micro_batches)
        try:
            yield asked
        except BaseException:
            if asked is not None and self._study is not None:
                try:
                    _study.fail(self._study, asked)
                except Exception as exc:
                    self._failed(f"recording the run of {candidate.key()} cut short", exc)
            raise

    def tell(self, asked: _study.Asked | None, result: TrialResult, value: float | None, *,
             kind: Literal["trial", "probe", "re-measure"] = "trial") -> None:
        """``_study.tell``; nothing for a run begun without the store (it had failed)."""
        if asked is None or self._study is None:
            return
        try:
            _study.tell(self._study, asked, result, value, kind=kind)
        except Exception as exc:
            self._failed(f"recording a run ({result.status})", exc)

    def recall(self, name: str) -> Any:
        """A value a search before kept in the study (``remember``); None when there is
        none, or no store."""
        if self._study is None or not self.record.storage:
            return None
        try:
            return self._study.user_attrs.get(name)
        except Exception as exc:
            self._failed(f"reading {name!r}", exc)
            return None

    def remember(self, name: str, value: Any) -> None:
        """Keep a JSON value in the study for the next search with its key (e.g. the
        estimator's figures for a calibration); nothing without a store."""
        if self._study is None or not self.record.storage:
            return
        try:
            self._study.set_user_attr(name, value)
        except Exception as exc:
            self._failed(f"keeping {name!r}", exc)


def recall(ledger: Ledger | None, name: str) -> Any:
    """``Ledger.recall``; None without a ledger."""
    return ledger.recall(name) if ledger is not None else None


def remember(ledger: Ledger | None, name: str, value: Any) -> None:
    """``Ledger.remember``; nothing without a ledger."""
    if ledger is not None:
        ledger.remember(name, value)
