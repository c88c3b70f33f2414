"""What a study's trials say, read back: each trial's candidate, the results a search reuses,
and the runs the report draws (this node's stored ones, and in a joined study the other
nodes'). ``_study`` writes the trials; this module only reads them."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timezone
from typing import TYPE_CHECKING, Any

from autotune.config import TrialResult
from autotune.knobs import KNOBS, Knobs
from autotune.schema import RunRecord
from autotune.search import claims
from autotune.search._records import Candidate, run_record
from autotune.search._study import _optuna
from autotune.serialize import from_json_dict

if TYPE_CHECKING:
    import optuna


def _candidate(params: dict[str, object]) -> Candidate | None:
    """The candidate an Optuna trial's parameters name (None: not one of ours). A knob newer
    than the trial is at its default there: that is what the trial ran."""
    try:
        knobs = Knobs(**{k.name: params.get(k.name, k.default)  # type: ignore[arg-type]
                         for k in KNOBS})
        return Candidate(knobs=knobs, micro_batch=int(params["micro_batch"]))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None


def completed(study: optuna.Study) -> dict[Candidate, list[TrialResult]]:
    """Timed runs already in the study, per candidate in the order they ended (a re-measured
    one has two or more: a resumed search answers each ask with the next)."""
    done: dict[Candidate, list[TrialResult]] = {}
    for t in study.get_trials(deepcopy=False, states=(_optuna().trial.TrialState.COMPLETE,)):
        key = _candidate(t.params)
        if "result" not in t.user_attrs or key is None:
            continue
        done.setdefault(key, []).append(
            from_json_dict(TrialResult, json.loads(t.user_attrs["result"])))
    return done


def probed(study: optuna.Study) -> dict[Candidate, TrialResult]:
    """Memory probes already in the study: runs that stopped before timed steps (pruned)."""
    done: dict[Candidate, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(_optuna().trial.TrialState.PRUNED,)):
        key = _candidate(t.params)
        if "result" in t.user_attrs and key is not None:
            done[key] = from_json_dict(TrialResult, json.loads(t.user_attrs["result"]))
    return done


def others_runs(joined: claims.Claims, known: set[int], usable_bytes: int) -> list[RunRecord]:
    """The runs other nodes of a joined study finished that this search did not read as
    stored, each naming its node, on this search's timeline (``Claims.others_finished``)."""
    runs: list[RunRecord] = []
    for t, start_s in joined.others_finished(known):
        if (run := _run_of(t, len(runs), usable_bytes, start_s=start_s)) is not None:
            runs.append(run)
    return runs


def stored_runs(study: optuna.Study, usable_bytes: int) -> tuple[list[RunRecord], set[int]]:
    """The runs the study held before this search, in the order they ended, each with when it
    was measured (the report's memory plot draws them; its timeline does not), and the numbers
    of the trials read (one read: ``others_runs`` adds only what came after it)."""
    state = _optuna().trial.TrialState
    runs: list[RunRecord] = []
    read: set[int] = set()
    for t in study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED)):
        read.add(t.number)
        ended = t.datetime_complete or t.datetime_start
        run = _run_of(t, len(runs), usable_bytes, stored_at=ended.astimezone(
            timezone.utc).isoformat(timespec="seconds") if ended else None)
        if run is not None:
            runs.append(run)
    return runs, read


def _run_of(t: optuna.trial.FrozenTrial, number: int, usable_bytes: int,
            **fields: Any) -> RunRecord | None:
    """A finished trial's run as the report draws it, naming the node whose claim it was in
    a joined study (None: not one of ours)."""
    key = _candidate(t.params)
    if "result" not in t.user_attrs or key is None:
        return None
    result = from_json_dict(TrialResult, json.loads(t.user_attrs["result"]))
    kind = t.user_attrs.get("kind", "trial")
    return replace(run_record(
        number, kind if kind in ("probe", "trial", "re-measure") else "trial", key, result,
        usable_bytes, compiled=key.knobs.compiled, **fields),
        node=claims.node_text(t.user_attrs.get("claimed_by", "")))
