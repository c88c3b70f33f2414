"""The Optuna study: the loop's record, for resuming a search and for reading it.

Each child run is one trial, asked for before the run starts (so storage shows it running)
and told when it ends: a timed run completes with its objective, or with a constraint
violation for OOM, crash, timeout, numerics; a memory probe that timed nothing is pruned; a
run cut short by Ctrl-C fails. Its whole result rides along as JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import optuna
from optuna.trial import TrialState

from autotune.config import ProbeReport, TrialResult, WorkloadSpec, from_json_dict, to_json_dict
from autotune.errors import ConfigError
from autotune.search._records import SearchSettings, keep_better

CONSTRAINT = "ran"
"""Optuna constraint: 0 for a run that counts, 1 for OOM, crash, timeout, numerics, ..."""
_INFEASIBLE = 1.0
optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress says what happens


def study_identity(report: ProbeReport, settings: SearchSettings) -> dict[str, str]:
    """What a stored run was measured for: a study holding runs of another identity (another
    model source, target, budget, device or torch) is refused, never silently reused."""
    return {
        "workload": report.workload.label(),
        "workload_source": workload_source(report.workload),
        "target_batch": str(report.target_batch), "world_size": str(report.world_size),
        "device": report.device.name, "torch": report.device.torch_version,
        "budget_bytes": str(report.budget_bytes), "headroom": f"{report.headroom:g}",
        "objective": (f"time_to_train:{settings.train_steps}" if settings.train_steps
                      else "throughput"),
    }


def workload_source(spec: WorkloadSpec) -> str:
    """A hash of what defines the workload, read without running it: the workload file's
    bytes (``file``), the model's ``config.json`` when it is a local folder (``hf``), the
    spec itself. An edited model file is another study."""
    parts = [spec.kind, spec.target, str(spec.seq_len), str(spec.pretrained)]
    if spec.kind == "file":
        path = Path(spec.target.rpartition(":")[0])
        with contextlib.suppress(OSError):
            parts.append(hashlib.sha256(path.read_bytes()).hexdigest())
    elif spec.kind == "hf":
        with contextlib.suppress(OSError):
            parts.append(hashlib.sha256((Path(spec.target) / "config.json").read_bytes())
                         .hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def check_storage(storage: str | None) -> None:
    """Refuse a storage URL that cannot keep a study (an in-memory SQLite database).

    Raises:
        ConfigError: ``sqlite://``, ``sqlite:///`` or ``sqlite:///:memory:``.
    """
    if storage is None:
        return
    scheme, sep, rest = storage.partition("://")
    if sep and scheme.split("+")[0].lower() == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if path.split("?")[0] in ("", ":memory:"):
            raise ConfigError(
                f"--storage {storage!r} is an in-memory SQLite database: nothing would be kept "
                "to resume; name a file, e.g. sqlite:///autotune.db")


def open_study(settings: SearchSettings, identity: dict[str, str],
               direction: str) -> optuna.Study:
    """Create or resume the study; refuse one that belongs to another workload or target.

    Raises:
        ConfigError: the storage cannot be opened, or the study holds another search.
    """
    check_storage(settings.storage)
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
        diff = "; ".join(f"{k}: {existing.get(k)!r} stored, {v!r} now"
                         for k, v in identity.items() if existing.get(k) != v)
        raise ConfigError(
            f"study {name!r} in {settings.storage} holds another search ({diff}): refusing to "
            "mix results measured for something else; use another --study-name")
    return study


def completed(study: optuna.Study) -> tuple[dict[str, TrialResult], dict[str, int]]:
    """Timed runs already in the study, each candidate's better run (a re-measured one has
    two: the faster kept, as the search keeps it), and how many runs each had."""
    done: dict[str, TrialResult] = {}
    runs: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if "result" not in t.user_attrs or "candidate" not in t.params:
            continue
        key = t.params["candidate"]
        result = from_json_dict(TrialResult, json.loads(t.user_attrs["result"]))
        runs[key] = runs.get(key, 0) + 1
        done[key] = keep_better(done[key], result) if key in done else result
    return done, runs


def probed(study: optuna.Study) -> dict[str, TrialResult]:
    """Memory probes already in the study: runs that stopped before timed steps (pruned)."""
    done: dict[str, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        if "result" in t.user_attrs and "candidate" in t.params:
            done[t.params["candidate"]] = from_json_dict(TrialResult,
                                                         json.loads(t.user_attrs["result"]))
    return done


@contextlib.contextmanager
def running(study: optuna.Study, key: str, choices: Sequence[str]) -> Iterator[optuna.Trial]:
    """Ask for the trial of one run of ``key``; a run that raises (Ctrl-C) is told failed."""
    distribution = {"candidate": optuna.distributions.CategoricalDistribution(choices)}
    study.enqueue_trial({"candidate": key})
    trial = study.ask(distribution)
    # A waiting trial left by an interrupted process is popped first: fail it, ask again.
    while trial.params["candidate"] != key:
        study.tell(trial, state=TrialState.FAIL)
        trial = study.ask(distribution)
    try:
        yield trial
    except BaseException:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        raise


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, value: float | None,
         *, kind: Literal["trial", "probe", "re-measure"] = "trial") -> None:
    """End a run's trial: pruned for a memory ``probe`` (it timed nothing); else complete,
    ``value`` None marking it infeasible (a constraint violation samplers and dashboards
    read). ``kind`` is kept as a user attribute."""
    trial.set_user_attr("result", json.dumps(to_json_dict(result)))
    trial.set_user_attr("status", result.status)
    trial.set_user_attr("kind", kind)
    if kind == "probe":
        study.tell(trial, state=TrialState.PRUNED)
        return
    trial.set_constraint(CONSTRAINT, _INFEASIBLE if value is None else 0.0)
    worst = 0.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1e18
    study.tell(trial, worst if value is None else value)
