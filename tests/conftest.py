"""Shared test setup: children import this checkout's autotune; slow/gpu tests are opt-in."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune import child

# Keep the bytecode of what the tests import, assertion rewriting's included, where the
# environment says not to (PYTHONDONTWRITEBYTECODE, set on some CI images): every pytest-xdist
# worker and every child would otherwise rewrite and compile it all again (about 8 s a worker).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Each pytest-xdist worker runs its in-process steps (the estimator's traces, the fallback's
# real steps) on one intra-op thread: two OpenMP threads in each of several workers spun against
# each other's (the non-subprocess tests took 313 s on 2 cores with torch's default of 2, 261 s
# with 1). The everyday run's children train on one thread too (``pytest_configure``).
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads.py"

# The runner's children run `python -m autotune.runner`: make them import the autotune of this
# checkout (not an installed copy) whatever directory pytest was started from.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker a core and one more (a test waits on its children, their start, a
    timeout or a signal much of the time), at most 8 (each child of a test imports torch:
    memory, not cores, binds beyond). README's command on this project's quiet 2-core machine,
    children on one thread: 3 workers 291 s, 4 workers 315 s, 5 workers 325 s (each worker
    collects the suite again: 11 s of CPU); `time python -m pytest -q -n N` compares them."""
    return max(2, min((os.cpu_count() or 1) + 1, 8))


def pytest_configure(config: pytest.Config) -> None:
    """The everyday run's children train on one OpenMP thread (``OMP_NUM_THREADS=1`` unless
    set): several workers each waiting on a child at torch's default, a thread a core,
    oversubscribed the cores and spun (README's command took 338-345 s with 5 workers, 325 s
    with children on one thread). What a test of a child asserts holds on any thread count;
    the slow set (``-m slow``) keeps torch's default, so CI runs children both ways."""
    if "slow" not in (config.getoption("-m") or ""):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def workload_target(name: str) -> str:
    """``/abs/path/tests/workloads.py:NAME`` for --workload and WorkloadSpec(kind="file")."""
    return f"{WORKLOADS}:{name}"


@pytest.fixture
def workloads_file() -> Path:
    """Path of tests/workloads.py."""
    return WORKLOADS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("-m") or ""
    has_cuda = None
    for item in items:
        if "slow" in item.keywords and "slow" not in markexpr:
            item.add_marker(pytest.mark.skip(reason="slow: run with -m slow"))
        if "gpu" in item.keywords:
            if has_cuda is None:
                import torch

                has_cuda = torch.cuda.is_available()
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True, scope="session")
def _temporary_files_under_pytests_folder(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every temporary file of a test run, its children's and their launchers' too (a child's
    folder, torchrun's ``torchelastic_*``, the GPU suite rehearsal's stores), under pytest's
    own folder (``$TMPDIR``, read by ``tempfile``, by each child and by each launcher), which
    pytest prunes to its last three runs: a run of the tests left folders in /tmp that nothing
    removed (a test killed mid-run, a launcher's own folder, a child killed by design)."""
    temp = tmp_path_factory.mktemp("tmp", numbered=False)
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(temp)
    tempfile.tempdir = None  # read again from $TMPDIR
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(autouse=True)
def _children_only_where_marked(request: pytest.FixtureRequest,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a child process must say so (``subprocess``, ``slow`` or ``gpu``),
    so ``-m "not subprocess"`` stays the quick inner loop: elsewhere starting one fails."""
    if any(request.node.get_closest_marker(m) for m in ("subprocess", "slow", "gpu")):
        return

    def refuse(self: subprocess.Popen[bytes], args: object, *rest: object, **kw: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a child process ({args!r}): mark "
                             "it @pytest.mark.subprocess")

    def refuse_fork(module: str, args: object, **kw: object) -> None:
        refuse(None, [module, args])  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(child, "start", refuse_fork)  # a fork server another test started


@pytest.fixture(autouse=True)
def _own_study_store(tmp_path_factory: pytest.TempPathFactory,
                     monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's searches record into a study store of their own (never the user's cache,
    never another test's runs)."""
    folder = tmp_path_factory.mktemp("autotune-cache")
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(folder))
    return folder
