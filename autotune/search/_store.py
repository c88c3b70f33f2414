"""The local study store: every search records its runs in an Optuna SQLite file under the
user's cache folder, so a repeated search on the same key reuses what it measured.

One study per key: the search's identity (workload and its source, target batch, world size,
device, torch, budget, headroom, objective) plus what it searches (the knob settings and
values, the timing settings) and autotune's version. The key's hash is the study's name; the
key itself is a study attribute (``autotune cache list`` shows it, optuna-dashboard too).

The store is a cache: when it cannot be used (an unwritable folder, a full disk, a folder or
another program's SQLite database at its path, left untouched) the search runs without it
and says why; a damaged file is moved aside (never deleted) and a fresh store started. Once
open, the search touches it only through its ``Ledger``, which turns any later failure into
"not cached".
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from autotune import __version__
from autotune.errors import ConfigError
from autotune.files import not_a_file
from autotune.schema import StudyRecord
from autotune.search._ledger import Ledger, inner_error, store_trouble
from autotune.search._study import budget_moved, open_study, redact, study_identity

if TYPE_CHECKING:
    import optuna

    from autotune.search.evidence import Evidence

_SPACE_SETTINGS = frozenset((
    "num_timed_steps", "rank_precision", "min_timed_s", "micro_batches_per_class",
    "refine_within", "slower_factor", "stop_margin", "num_confirm", "confirm_within",
    "timeout_s"))
"""Settings that change what a search measures: part of the local store's key."""

STORE_NAME = "studies.db"
KEY_ATTR = "autotune_key"


def cache_dir() -> Path:
    """``$AUTOTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autotune``, else
    ``~/.cache/autotune``.

    Raises:
        ConfigError: ``AUTOTUNE_CACHE_DIR`` is set but empty or names an existing file.
    """
    env = os.environ.get("AUTOTUNE_CACHE_DIR")
    if env is not None:
        if not env.strip():
            raise ConfigError("AUTOTUNE_CACHE_DIR is set but empty: unset it (the default is "
                              "$XDG_CACHE_HOME/autotune) or name a folder")
        path = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "autotune"
    if path.exists() and not path.is_dir():
        raise ConfigError(f"the autotune cache folder {path} is a file, not a folder: set "
                          "AUTOTUNE_CACHE_DIR to a folder, or pass --no-cache")
    return path.resolve()


def store_path() -> Path:
    """The SQLite file of the local study store."""
    return cache_dir() / STORE_NAME


def storage_url(path: Path) -> str:
    return f"sqlite:///{path}"


LOCAL_SYNCHRONOUS = "OFF"
"""SQLite's ``synchronous`` for the local store: a commit is handed to the OS, not waited for on
the disk (each run's tell commits several times, and a search waited on each). The store is a
cache: a crash of autotune loses nothing the OS holds; a power loss may damage it, and the next
search moves a damaged store aside and starts afresh (``open_local``). A ``--storage``
database is the user's and keeps its own settings."""


def _storage(optuna: Any, path: Path) -> Any:
    """The local store's Optuna storage: every connection with ``LOCAL_SYNCHRONOUS``."""
    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(str(path), check_same_thread=False)
        db.execute(f"PRAGMA synchronous={LOCAL_SYNCHRONOUS}")
        return db

    return optuna.storages.RDBStorage(storage_url(path), engine_kwargs={"creator": connect})


def study_key(identity: dict[str, str], space: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(study name, key): the name is a hash of the key without the budget (compared with
    ``BUDGET_TOLERANCE`` on open), so the same search finds its study."""
    key = {**identity, "space": space, "autotune": __version__}
    named = {k: v for k, v in key.items() if k != "budget_bytes"}
    digest = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]
    return f"autotune-{digest}", key


@dataclass(frozen=True)
class LocalStudy:
    """The study a search records into, and what the store said while opening it."""

    study: optuna.Study
    storage: str | None
    """The store's URL; None when the search runs without it (in memory)."""
    note: str = ""
    """Why the store was not used, or what was done to it (a corrupt file moved aside)."""


def open_local(name: str, key: dict[str, Any], direction: str, *,
               fresh: bool = False) -> LocalStudy:
    """Open (or create) the key's study in the local store. ``fresh``: delete its stored runs
    first. Never raises for the store's own trouble: the search then runs in memory and the
    note says why.

    Raises:
        ConfigError: ``AUTOTUNE_CACHE_DIR`` is unusable as a folder name (see ``cache_dir``).
    """
    optuna = _optuna()
    try:
        path = store_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{path.parent} is not writable")
    except OSError as exc:
        return LocalStudy(_in_memory(direction), None,
                          f"study store not used: {exc}; runs are not kept (set "
                          "AUTOTUNE_CACHE_DIR to a writable folder, or pass --no-cache)")
    try:
        lock = _lock(path.with_name(f"{path.name}.lock"))
    except OSError as exc:
        return LocalStudy(_in_memory(direction), None,
                          f"study store not used: cannot lock {path}: {exc}; runs are not kept")
    with lock:  # one process at a time creates tables and studies (they race otherwise)
        note = ""
        if (foreign := _foreign(path)):
            return LocalStudy(_in_memory(direction), None, (
                f"study store not used: {path} is {foreign}, not autotune's store: left "
                "untouched, runs are not kept (set AUTOTUNE_CACHE_DIR to another folder, or "
                "remove it: `autotune cache clear` does)"))
        if path.exists() and not _is_sqlite(path):
            note = _move_aside(path)
        try:
            study, moved = _open(optuna, path, name, key, direction, fresh)
        except Exception as exc:  # sqlalchemy/optuna raise many types for a damaged database
            kind, why = store_trouble(exc)
            if kind not in ("damaged", "moved") or not path.is_file():
                return LocalStudy(_in_memory(direction), None,
                                  f"study store {path} not used: {why}; runs are not kept")
            note = _move_aside(path, inner_error(exc))
            try:
                study, moved = _open(optuna, path, name, key, direction, fresh)
            except Exception as again:
                return LocalStudy(_in_memory(direction), None,
                                  f"{note}; the fresh store failed too: {store_trouble(again)[1]}"
                                  ": runs are not kept")
    return LocalStudy(study, storage_url(path), "; ".join(filter(None, (note, moved))))


LOCK_WAIT_S = 60.0


def _lock(path: Path) -> IO[str]:
    """Open ``path`` (created if missing) holding an exclusive lock on it: closing the file
    releases it.

    Raises:
        OSError: the lock file cannot be made, or another process held it ``LOCK_WAIT_S``.
    """
    import fcntl

    kind = not_a_file(path)
    if kind is not None:  # a FIFO would wait for a reader forever
        raise OSError(f"{path} is {kind}, not a regular file")
    # Without waiting: a FIFO put there since fails to open (ENXIO) instead of blocking.
    f = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK,
                          0o666), "a")
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise OSError(f"another process held {path} for {LOCK_WAIT_S:.0f} s") from None
            time.sleep(0.05)


def _open(optuna: Any, path: Path, name: str, key: dict[str, Any], direction: str,
          fresh: bool) -> tuple[optuna.Study, str]:
    storage = _storage(optuna, path)
    if fresh:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=storage)
    study = optuna.create_study(storage=storage, study_name=name, direction=direction,
                                load_if_exists=True)
    stored = study.user_attrs.get(KEY_ATTR)
    why = budget_moved(stored, key) if isinstance(stored, dict) else ""
    if why:
        optuna.delete_study(study_name=name, storage=storage)
        study = optuna.create_study(storage=storage, study_name=name, direction=direction)
        stored = None
    if stored is None:
        study.set_user_attr(KEY_ATTR, key)
        study.set_user_attr("created_at", datetime.now(timezone.utc).isoformat(
            timespec="seconds"))
    return study, (f"stored runs not reused: {why}; this search's replace them" if why else "")


def _in_memory(direction: str) -> optuna.Study:
    return _optuna().create_study(direction=direction)


def _foreign(path: Path) -> str:
    """What is at the store's path when it is not autotune's to touch ('' when it is: none,
    an empty file, an Optuna store, or a damaged file SQLite cannot read): a folder, anything
    else that is not a regular file (a FIFO, a device: never opened), or an SQLite database
    of something else (tables, but not Optuna's ``version_info``), which Optuna would add its
    tables to."""
    if path.is_dir():
        return "a folder"
    if (kind := not_a_file(path)) is not None:  # a FIFO: opening it would wait forever
        return kind
    if not path.is_file() or not _is_sqlite(path):
        return ""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            tables = sorted(r[0] for r in db.execute(
                "select name from sqlite_master where type = 'table'"))
    except sqlite3.Error:
        return ""  # damaged: opening it says so, and moves it aside
    if not tables or "version_info" in tables:
        return ""
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return f"an SQLite database of something else (tables: {shown})"


def _is_sqlite(path: Path) -> bool:
    """An SQLite database starts with this header (an empty file is one too: SQLite makes
    it a database)."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return True  # unreadable: let SQLite say why
    return head in (b"", b"SQLite format 3\x00")


def _move_aside(path: Path, why: str = "not an SQLite database") -> str:
    """Rename a damaged store to ``studies.db.corrupt-<time>`` (kept, never deleted)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        path.replace(aside)
    except OSError as exc:
        return f"study store {path} is damaged ({why}) and could not be moved aside: {exc}"
    return (f"study store {path} was damaged ({why}): moved to {aside.name} and a fresh store "
            "started (earlier runs are not reused)")


@dataclass(frozen=True)
class StoredStudy:
    """One study in the store, as ``autotune cache list`` shows it."""

    name: str
    key: dict[str, Any]
    num_runs: int
    last_run_at: str | None


def list_studies() -> tuple[Path, list[StoredStudy]]:
    """The store's file and its studies (none when it does not exist).

    Raises:
        ConfigError: the store cannot be read.
    """
    path = store_path()
    if not path.exists():
        return path, []
    if foreign := _foreign(path):
        raise ConfigError(f"cannot read the study store {path}: it is {foreign}, not "
                          "autotune's store (left untouched); `autotune cache clear` removes it")
    optuna = _optuna()
    try:
        summaries = optuna.get_all_study_summaries(storage_url(path), include_best_trial=False)
        studies = []
        for s in summaries:
            study = optuna.load_study(study_name=s.study_name, storage=storage_url(path))
            ends = [t.datetime_complete for t in study.get_trials(deepcopy=False)
                    if t.datetime_complete]
            studies.append(StoredStudy(
                s.study_name, dict(s.user_attrs.get(KEY_ATTR, {})), s.n_trials,
                max(ends).astimezone(timezone.utc).isoformat(timespec="seconds")
                if ends else None))
    except Exception as exc:
        raise ConfigError(f"cannot read the study store {path}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}; `autotune cache clear` removes it"
                          ) from exc
    return path, studies


def clear_studies() -> list[Path]:
    """Remove the store's files, what it moved aside, and whatever else is at its path (a
    folder too); the paths removed."""
    folder = cache_dir()
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.glob(f"{STORE_NAME}*")):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            raise ConfigError(f"cannot remove {path}: {exc.strerror or exc}") from exc
        removed.append(path)
    return removed


def open_search_study(ev: Evidence) -> Ledger:
    """``--storage``'s study, or the local store's study for this search's key, or (with
    ``--no-cache``) one in memory."""
    settings, plan = ev.settings, ev.plan
    direction = "minimize" if settings.train_steps else "maximize"
    identity = study_identity(plan.report, settings)
    if settings.storage is not None or not settings.cache:
        study = open_study(settings, identity, direction)
        return Ledger(study, StudyRecord(storage=redact(settings.storage or ""),
                                         name=study.study_name if settings.storage else ""),
                      shared=settings.join, time_budget_s=settings.time_budget_s)
    space = {
        "classes": sorted(k.label() for k in plan.classes),
        "values": {k: sorted(v) for k, v in sorted(plan.values.items())},
        **{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
           if f.name in _SPACE_SETTINGS}}
    name, key = study_key(identity, space)
    local = open_local(name, key, direction, fresh=settings.fresh)
    return Ledger(local.study, StudyRecord(storage=local.storage or "",
                                           name=name if local.storage else "",
                                           note=local.note))


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna
