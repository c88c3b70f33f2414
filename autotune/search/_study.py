"""The Optuna study: the loop's record, for resuming a search and for reading it.

Each child run is one trial, written when the run ends in one transaction (its parameters,
result and state together, ``Study.add_trial``): a timed run completes with its objective, or
with a constraint violation for OOM, crash, timeout, numerics; a memory probe that timed
nothing is pruned; a run cut short by Ctrl-C fails. Its whole result rides along as JSON. A run
in flight is not in the store, and the store never holds a half-told one (asked, then each
parameter and attribute its own transaction, a store failing between them left a trial
running forever, and a scripted search spent 70% of its time in them).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

from autotune.config import ProbeReport, TrialResult, WorkloadSpec
from autotune.errors import ConfigError
from autotune.knobs import KNOBS
from autotune.names import KEYWORDS, Names
from autotune.search import claims, joining
from autotune.search._records import Candidate, SearchSettings
from autotune.serialize import to_json_dict

if TYPE_CHECKING:
    import optuna

CONSTRAINT = "ran"
"""Optuna constraint: 0 for a run that counts, 1 for OOM, crash, timeout, numerics, ..."""
_INFEASIBLE = 1.0


def _optuna() -> Any:
    """optuna, imported when a search opens its study (``autotune.load`` never needs it)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress says what happens
    return optuna


IDENTITY_ATTR = "autotune_identity"
"""The study attribute holding what its runs were measured for (``study_identity``)."""


def study_identity(report: ProbeReport, settings: SearchSettings) -> dict[str, str]:
    """What a stored run was measured for: a study holding runs of another identity (another
    model source, target, world size, ranks per node, budget, device or torch) is refused,
    never silently reused (searches on several nodes of one GPU kind share one)."""
    return {
        "workload": report.workload.label(),
        "workload_source": workload_source(report.workload),
        "target_batch": str(report.target_batch), "world_size": str(report.world_size),
        "device": report.device.name, "torch": report.device.torch_version,
        "budget_bytes": str(report.budget_bytes), "headroom": f"{report.headroom:g}",
        "objective": (f"time_to_train:{settings.train_steps}" if settings.train_steps
                      else "throughput"),
        "params": "knobs+micro_batch",  # one Optuna parameter per knob (schema 2)
        # Ranks measure another job (their peaks and global throughput): said when several.
        **({"nproc_per_node": str(report.nproc_per_node)} if report.nproc_per_node > 1 else {}),
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


def redact(url: str) -> str:
    """``url`` with its password hidden (``postgresql://user:***@host/db``), the form in which
    a storage URL is shown or stored: ``autotune.json``, the footer, every message.

    Split by hand, not by SQLAlchemy's ``make_url``: that one ends the password at its first
    ``@``, so a password written with a raw ``@`` would show its rest as the host. Here the
    user part ends at the URL's last ``@`` (hiding too much rather than too little), and a
    ``password=`` in the query is hidden too.
    """
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    user, colon, _ = rest[:max(at, 0)].partition(":")
    if sep and colon and not rest.startswith("/"):  # sqlite:///a:b@c names a file
        url = f"{scheme}://{user}:***@{rest[at + 1:]}"
    return re.sub(r"(?i)(password=)[^&;\s]*", r"\1***", url)


def redact_text(text: str, url: str | None) -> str:
    """``text`` (e.g. an exception's message) with ``url``'s password and the URL itself
    hidden wherever they appear."""
    if not url:
        return text
    text = text.replace(url, redact(url))
    _, sep, rest = url.partition("://")
    at = rest.rfind("@")
    secrets = [rest[:at].partition(":")[2] if sep and at >= 0 and rest[:1] != "/" else "",
               *re.findall(r"(?i)password=([^&;\s]*)", url)]
    for form in sorted({f for s in secrets for f in (s, unquote(s)) if f}, key=len,
                       reverse=True):
        text = text.replace(form, "***")
    return text


def check_storage(storage: str | None, name: Names = KEYWORDS) -> None:
    """Refuse a storage URL that cannot keep a study (an in-memory SQLite database), or whose
    database driver is not installed (said before any child runs, not after the probes).

    Args:
        storage: the URL (None: the local study store).
        name: how the user wrote the setting (``--storage`` or ``storage=``).

    Raises:
        ConfigError: ``sqlite://``, ``sqlite:///`` or ``sqlite:///:memory:``; a driver module
            that does not import (named, with the pip command that installs it).
    """
    if storage is None:
        return
    scheme, sep, rest = storage.partition("://")
    if sep and scheme.split("+")[0].lower() == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if path.split("?")[0] in ("", ":memory:"):
            raise ConfigError(
                f"{name.given('storage', redact(storage))} is an in-memory SQLite "
                "database: nothing would be kept to resume; name a file, e.g. "
                "sqlite:///autotune.db")
    module = _missing_driver(storage)
    if module is not None:
        dialect = scheme.split("+")[0]
        others = [f"{dialect}+{d.lower()}://" for d, m in _DRIVERS.items()
                  if d != module and m[1] == dialect and importlib.util.find_spec(d)]
        raise ConfigError(
            f"{name.given('storage', redact(storage))} needs the database driver module "
            f"{module!r}, which is not installed here: pip install "
            f"{_DRIVERS.get(module, (module,))[0]}"
            + (f", or name a driver that is installed in the URL ({', '.join(others)})"
               if others else ""))


_DRIVERS = {"psycopg2": ("psycopg2-binary", "postgresql"),
            "psycopg": ("'psycopg[binary]'", "postgresql"), "pg8000": ("pg8000", "postgresql"),
            "pymysql": ("PyMySQL", "mysql"), "MySQLdb": ("mysqlclient", "mysql")}
"""Database driver modules SQLAlchemy imports: the pip package and the dialect of each."""


def _missing_driver(storage: str) -> str | None:
    """The driver module ``storage``'s dialect imports when it does not import; None when it
    does, or when the URL is not one SQLAlchemy reads (opening it says what is wrong)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(storage).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        return None
    try:
        dialect.import_dbapi()
    except ImportError as exc:  # ModuleNotFoundError, or a module blocked or half-installed
        return (exc.name or "").split(".")[0] or dialect.driver
    return None


BUDGET_TOLERANCE = 0.05
"""A stored study is reused while the memory budget is within this share of the one its runs
were measured under (the local store's and ``--storage``'s alike): the default budget is what
is free, which moves a little between runs. Stored peaks are judged against the budget of
now; only an out-of-memory near the old cap could read otherwise."""


def budget_moved(stored: dict[str, Any], now: dict[str, Any]) -> str:
    """Why the stored study's budget is too far from this search's ('' when close enough)."""
    try:
        before, after = int(stored["budget_bytes"]), int(now["budget_bytes"])
    except (KeyError, TypeError, ValueError):
        return "its key is unreadable"
    if abs(after - before) <= BUDGET_TOLERANCE * max(before, 1):
        return ""
    return (f"the memory budget moved from {before / 2**20:,.0f} MiB to {after / 2**20:,.0f} "
            f"MiB (more than {BUDGET_TOLERANCE:.0%})")


def open_study(settings: SearchSettings, identity: dict[str, str],
               direction: str) -> optuna.Study:
    """Create or resume the study; refuse one that belongs to another workload or target
    (its budget may differ by ``BUDGET_TOLERANCE``).

    Raises:
        ConfigError: the storage cannot be opened, or the study holds another search.
    """
    check_storage(settings.storage)
    name = settings.study_name or ("autotune" if settings.storage else None)
    shown = redact(settings.storage) if settings.storage else None
    # Joined nodes open one at a time: Optuna's table creation, and a new study's identity,
    # race on an empty database otherwise (a duplicate key, or two identities).
    with joining.opening(settings.storage) if settings.join and settings.storage \
            else contextlib.nullcontext():
        try:
            study = _create(settings, name, direction)
        except Exception as exc:  # sqlalchemy and optuna raise many types for a bad URL
            why = redact_text(str(exc).splitlines()[0] if str(exc) else "", settings.storage)
            raise ConfigError(f"cannot open --storage {shown!r}: {type(exc).__name__}: {why}; "
                              "use e.g. sqlite:///autotune.db or "
                              "postgresql+psycopg2://user:pass@host/db") from None
        try:
            if settings.join and joining.other_kind(study.user_attrs.get(IDENTITY_ATTR),
                                                   identity):
                # a mixed pool: each device kind has the study of its own (its answer, its
                # outputs), beside the first kind's under the name given
                name = joining.kind_study_name(str(name), identity["device"])
                study = _create(settings, name, direction)
            return _check_identity(study, name, shown, identity, direction)
        except ConfigError as exc:
            raise joining.refuse_mismatch(exc) if settings.join else exc from None
        except Exception as exc:  # the storage failed while reading what the study holds
            why = redact_text(str(exc).splitlines()[0] if str(exc) else "", settings.storage)
            raise ConfigError(f"cannot open --storage {shown!r}: {type(exc).__name__}: {why}"
                              ) from None

def _create(settings: SearchSettings, name: str | None, direction: str) -> optuna.Study:
    """Optuna's ``create_study`` of ``name`` (loaded if it exists) in ``--storage``."""
    return _optuna().create_study(
        storage=joining.shared_storage(settings.storage) if settings.join and settings.storage
        else settings.storage, study_name=name, direction=direction, load_if_exists=True)


def _check_identity(study: optuna.Study, name: str | None, shown: str | None,
                    identity: dict[str, str], direction: str) -> optuna.Study:
    if study.direction.name.lower() != direction:
        raise ConfigError(f"study {name!r} optimizes {study.direction.name.lower()}; this search "
                          f"would {direction} (objective changed): use another --study-name")
    existing = study.user_attrs.get(IDENTITY_ATTR)
    if existing is None:
        study.set_user_attr(IDENTITY_ATTR, identity)
        return study
    existing = existing if isinstance(existing, dict) else {}
    moved = budget_moved(existing, identity)
    diff = "; ".join([*(f"{k}: {existing.get(k)!r} stored, {identity.get(k)!r} now"
                        for k in dict.fromkeys([*identity, *existing])
                        if k != "budget_bytes" and existing.get(k) != identity.get(k)),
                      *filter(None, [moved])])
    if diff:
        hint = (f", or pass --memory-budget {int(existing['budget_bytes']) // 2**20}MiB (the "
                "stored budget)" if "moved from" in moved and diff == moved else "")
        raise ConfigError(
            f"study {name!r} in {shown} holds another search ({diff}): refusing to mix results "
            f"measured for something else; use another --study-name{hint}")
    return study


def distributions(micro_batches: Sequence[int]) -> dict[str, optuna.distributions.BaseDistribution]:
    """One categorical parameter per knob over all its values, and the micro-batch: the same
    choices whatever a search is restricted to, so restricted and resumed searches share a
    study, and optuna-dashboard shows each knob as a parameter."""
    categorical = _optuna().distributions.CategoricalDistribution
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        k.name: categorical(k.values) for k in KNOBS}
    dists["micro_batch"] = categorical(tuple(micro_batches))
    return dists


@dataclass(frozen=True)
class Asked:
    """A run begun, not yet in the study (``tell`` or ``fail`` writes it whole)."""

    candidate: Candidate
    params: dict[str, object]
    distributions: dict[str, optuna.distributions.BaseDistribution]
    started: datetime
    claimed: claims.Claimed | None = None
    """Its claim in a joined study (``--join``): its end finishes that trial."""


def ask(study: optuna.Study | None, candidate: Candidate, micro_batches: Sequence[int]) -> Asked:
    """A run of ``candidate`` beginning: its trial is written when it ends (``tell``, or
    ``fail`` when the run raises). The search decides what runs; Optuna records it, with every
    parameter the candidate's (no sampler asked, no queue popped: a queue is shared by every
    process on the study, so two searches at once would pop each other's runs)."""
    params: dict[str, object] = {k.name: getattr(candidate.knobs, k.name) for k in KNOBS}
    params["micro_batch"] = candidate.micro_batch
    return Asked(candidate, params, distributions(micro_batches), datetime.now())


def fail(study: optuna.Study, asked: Asked) -> None:
    """Write a run cut short (Ctrl-C) as failed."""
    _write(study, asked, _optuna().trial.TrialState.FAIL, {})


def _write(study: optuna.Study, asked: Asked, state: Any, attrs: dict[str, Any], *,
           value: float | None = None, constraints: dict[str, float] | None = None) -> None:
    """One transaction: the run's trial, finished, with all it says."""
    trial = _optuna().trial.create_trial(
        state=state, value=value, params=asked.params, distributions=asked.distributions,
        user_attrs={"candidate": asked.candidate.key(), **attrs}, constraints=constraints)
    trial.datetime_start = asked.started
    if asked.claimed is not None:
        claims.finish(study, asked.claimed, trial)
        return
    study.add_trial(trial)


def tell(study: optuna.Study, asked: Asked, result: TrialResult, value: float | None,
         *, kind: Literal["trial", "probe", "re-measure"] = "trial") -> None:
    """Write a run's trial: pruned for a memory ``probe`` (it timed nothing); else complete,
    ``value`` None marking it infeasible (a constraint violation samplers and dashboards
    read). ``kind`` is kept as a user attribute."""
    attrs: dict[str, Any] = {"result": json.dumps(to_json_dict(result)),
                             "status": result.status, "kind": kind}
    # Readable in optuna-dashboard beside the parameters (the result above is for autotune).
    if result.peak_bytes is not None:
        attrs["peak_MiB"] = round(result.peak_bytes / 2**20, 1)
    if (median := result.median_step_s()) is not None:
        attrs["median_step_s"] = round(median, 4)
        attrs["timed_steps"] = len(result.step_times_s)
    if (per_s := result.samples_per_s()) is not None:
        attrs["samples_per_s"] = round(per_s, 2)
    if result.compile_s is not None and asked.params.get("compile_mode") != "off":
        attrs["compile_s"] = round(result.compile_s, 1)
    if result.wall_s is not None:
        attrs["wall_s"] = round(result.wall_s, 1)
    if result.message:
        attrs["message"] = result.message[:500]
    state = _optuna().trial.TrialState
    if kind == "probe":
        _write(study, asked, state.PRUNED, attrs)
        return
    worst = 0.0 if study.direction == _optuna().study.StudyDirection.MAXIMIZE else 1e18
    _write(study, asked, state.COMPLETE, attrs, value=worst if value is None else value,
           constraints={CONSTRAINT: _INFEASIBLE if value is None else 0.0})
