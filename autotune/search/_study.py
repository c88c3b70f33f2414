"""The Optuna study: the record of a search, for resuming it and for sharing its results.

Each finished child run is added as a completed trial: its candidate, its objective (or a
constraint violation for OOM, crash, timeout, numerics), and its whole result as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import optuna

from autotune.config import TrialResult, from_json_dict, to_json_dict
from autotune.errors import ConfigError
from autotune.search._records import SearchSettings

CONSTRAINT = "ran"
"""Optuna constraint: 0 for a run that counts, 1 for OOM, crash, timeout, numerics, ..."""
_INFEASIBLE = 1.0
optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress says what happens


def open_study(settings: SearchSettings, identity: dict[str, str],
               direction: str) -> optuna.Study:
    """Create or resume the study; refuse one that belongs to another workload or target.

    Raises:
        ConfigError: the storage cannot be opened, or the study holds another search.
    """
    name = settings.study_name or ("autotune" if settings.storage else None)
    try:
        study = optuna.create_study(storage=settings.storage, study_name=name,
                                    direction=direction, load_if_exists=True)
    except Exception as exc:  # sqlalchemy and optuna raise many types for a bad URL
        raise ConfigError(f"cannot open --storage {settings.storage!r}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}; use e.g. sqlite:///autotune.db") from exc
    if study.direction.name.lower() != direction:
        raise ConfigError(f"study {name!r} optimizes {study.direction.name.lower()}; this search "
                          f"would {direction} (objective changed): use another --study-name")
    existing = study.user_attrs.get("autotune_identity")
    if existing is None:
        study.set_user_attr("autotune_identity", identity)
    elif existing != identity:
        diff = {k: (existing.get(k), v) for k, v in identity.items() if existing.get(k) != v}
        raise ConfigError(
            f"study {name!r} in {settings.storage} holds another search ({diff} as stored vs "
            "now): refusing to mix results; use another --study-name")
    return study


def completed(study: optuna.Study) -> dict[str, TrialResult]:
    """Results already in the study (a resumed or shared search does not run them again)."""
    done: dict[str, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "result" in t.user_attrs and "candidate" in t.params:
            done[t.params["candidate"]] = from_json_dict(TrialResult,
                                                         json.loads(t.user_attrs["result"]))
    return done


def probed(study: optuna.Study) -> dict[str, TrialResult]:
    """Memory probes already in the study: runs that stopped before timed steps (pruned)."""
    done: dict[str, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)):
        if t.user_attrs.get("kind") == "probe" and "candidate" in t.params:
            done[t.params["candidate"]] = from_json_dict(TrialResult,
                                                         json.loads(t.user_attrs["result"]))
    return done


def record(study: optuna.Study, key: str, result: TrialResult, value: float | None,
           choices: Sequence[str], *, probe_only: bool = False) -> None:
    """Add one finished run; ``value`` None marks it infeasible (a constraint violation).

    A memory probe that timed nothing is added as pruned: it has no objective value."""
    worst = 0.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1e18
    attrs = {"result": json.dumps(to_json_dict(result)), "status": result.status}
    distributions = {"candidate": optuna.distributions.CategoricalDistribution(choices)}
    if probe_only:
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED, params={"candidate": key},
            distributions=distributions, user_attrs={**attrs, "kind": "probe"}))
        return
    study.add_trial(optuna.trial.create_trial(
        params={"candidate": key}, distributions=distributions,
        value=worst if value is None else value, user_attrs=attrs,
        constraints={CONSTRAINT: _INFEASIBLE if value is None else 0.0},
    ))
