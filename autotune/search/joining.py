"""Opening a study several nodes share (``--join``): what a joined search needs (a PostgreSQL
URL), the lock under which nodes open the database one at a time, the storage's pool and
heartbeats, and a mixed pool's study per device kind. The claims of its runs are
``claims``'."""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from autotune.errors import ConfigError
from autotune.names import KEYWORDS, Names
from autotune.search import claims

if TYPE_CHECKING:
    import optuna

EXAMPLE_URL = "postgresql+psycopg2://user:pass@db-host/autotune"
POOL_SIZE = 2
"""Connections each coordinator keeps to the server: the search's writes and a heartbeat."""

def check_join(join: bool, storage: str | None, name: Names = KEYWORDS) -> list[str]:
    """What is wrong with ``join`` beside ``storage`` (nothing: an empty list): a shared
    study needs a PostgreSQL server every node reaches. SQLite is refused (its locking over
    a network file system is unsafe, and a file on one node is no study shared by others);
    so is another server kind (its claims are not written: PostgreSQL's advisory locks make
    them atomic)."""
    if not join:
        return []
    join_flag = name.given("join", True)
    if not storage:
        return [f"{join_flag} shares one study between the nodes' searches through the "
                f"store every node reaches: add {name.given('storage', EXAMPLE_URL)} "
                f"and {name.given('study_name', 'NAME')}"]
    scheme = storage.partition("://")[0].split("+")[0].lower()
    if scheme != "postgresql":
        why = ("SQLite's locking is unsafe over a network file system, and a file on one node "
               "is not reached by the others" if scheme == "sqlite" else
               "claims are made atomic with PostgreSQL's advisory locks")
        return [f"{join_flag} needs a PostgreSQL {name('storage')}, got a "
                f"{scheme or '?'}:// URL ({why}): pass e.g. "
                f"{name.given('storage', EXAMPLE_URL)}"]
    return []


OPENING_KEY = zlib.crc32(b"autotune:opening")
"""The advisory lock under which joined nodes open the database one at a time."""


@contextlib.contextmanager
def opening(url: str) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock ``OPENING_KEY`` on ``url``'s database while
    a node opens its study; a server that cannot be reached holds nothing (opening the study
    then says why)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        conn = engine.connect()
    except Exception:  # said by the study's own opening
        engine.dispose()
        yield
        return
    try:
        conn.execute(text("select pg_advisory_lock(:key)"), {"key": OPENING_KEY})
        conn.commit()
        yield
    finally:
        with contextlib.suppress(Exception):
            conn.execute(text("select pg_advisory_unlock(:key)"), {"key": OPENING_KEY})
            conn.commit()
        conn.close()
        engine.dispose()


def shared_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage of a joined study: a small connection pool checked before each use (a
    server restarted meanwhile), heartbeats on."""
    import optuna

    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna since 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url, engine_kwargs={"pool_size": POOL_SIZE, "max_overflow": 2,
                                "pool_pre_ping": True},
            heartbeat_interval=claims.HEARTBEAT_S, grace_period=claims.GRACE_S)


def other_kind(stored: object, identity: dict[str, str]) -> bool:
    """Whether a joined study's stored identity is the same search on another device kind
    (a mixed pool: this node's kind gets a study of its own, ``kind_study_name``): the device
    differs, and nothing else but the memory budget that follows from it. Another workload,
    target or torch is refused as ever."""
    if not isinstance(stored, dict) or stored.get("device") in (None, identity["device"]):
        return False
    return all(stored.get(k) == v for k, v in identity.items()
               if k not in ("device", "budget_bytes")) and set(stored) == set(identity)


def kind_study_name(name: str, device: str) -> str:
    """The study of one device kind in a mixed pool joined under ``name``: its runs, its
    answer and its outputs (the first kind to open ``name`` keeps ``name`` itself)."""
    return f"{name} on {device}"


def refuse_mismatch(exc: ConfigError) -> ConfigError:
    """A joined study that holds another search's runs: the identity check's refusal, saying
    that nodes share evidence only for the same device kind and memory, torch and budget."""
    return ConfigError(f"{exc} (--join shares evidence only between nodes of the same device "
                       "kind and memory, torch version and memory budget; a node of another "
                       "device kind gets its own answer, under the same --study-name)")
