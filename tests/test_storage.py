"""``--storage``: a study shared or resumed through an Optuna RDB URL.

Its budget may move as the local store's does (the default budget, what is free, moves a
little between runs); its password is never shown or stored; the PostgreSQL setup of
docs/several-devices.md runs as written against a throwaway cluster (``initdb``/``pg_ctl``;
skipped where PostgreSQL's binaries are missing: ``apt-get install postgresql``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.report import study_lines, to_json
from autotune.search import SearchSettings, open_study, redact, run_search, tuned_config
from autotune.search._study import study_identity
from autotune.units import MIB
from tests.scripted import CLASSES, ScriptedDevice, plan
from tests.scripted import SETTINGS as IN_MEMORY
from tests.test_store import SPEEDS, winner

ROOT = Path(__file__).resolve().parent.parent
BUDGET = plan().budget_bytes


def identity(settings: SearchSettings, budget: int) -> dict[str, str]:
    return study_identity(replace(plan(), budget_bytes=budget), settings)


def test_a_storage_study_resumes_when_the_budget_moved_a_little_and_names_both_beyond(
        tmp_path: Path) -> None:
    """README's resume example without --memory-budget: what is free moves ~0.2%."""
    settings = SearchSettings(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    open_study(settings, identity(settings, BUDGET), "maximize")
    for moved in (1.002, 0.998, 1.05):
        open_study(settings, identity(settings, int(BUDGET * moved)), "maximize")
    with pytest.raises(ConfigError) as info:
        open_study(settings, identity(settings, int(BUDGET * 0.9)), "maximize")
    assert ("the memory budget moved from 1,000 MiB to 900 MiB (more than 5%)"
            in str(info.value))
    assert "--memory-budget 1000MiB" in str(info.value)


def test_a_resumed_storage_search_reuses_its_runs_under_a_budget_moved_by_0_2_percent(
        tmp_path: Path) -> None:
    settings = replace(IN_MEMORY, storage=f"sqlite:///{tmp_path / 'study.db'}",
                       study_name="s")
    first = ScriptedDevice(SPEEDS)
    one = run_search(plan(), CLASSES, settings, run=first)
    again = ScriptedDevice(SPEEDS)
    moved = replace(plan(), budget_bytes=BUDGET - 2 * MIB)  # what is free, a moment later
    two = run_search(moved, CLASSES, settings, run=again)
    assert again.specs == [] and two.num_runs == 0
    assert winner(two) == winner(one) and len(two.runs) == one.num_runs


PASSWORDS = st.text(st.characters(codec="ascii", min_codepoint=33, max_codepoint=126),
                    min_size=4, max_size=20).map(lambda s: f"Pw{s}")
"""Printable passwords, ``@ : / % ?`` included; ``Pw`` makes each one stand out (hosts,
users and database names below are lower case)."""
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str]:
    """(URL, password): written raw or percent-encoded, in the user part or the query."""
    password = draw(PASSWORDS)
    written = draw(st.sampled_from([password, quote(password, safe="")]))
    scheme = draw(st.sampled_from(["postgresql+psycopg2", "postgresql", "mysql+pymysql",
                                   "postgresql+nodriver"]))
    host = draw(NAMES) + draw(st.sampled_from(["", ":5432"]))
    if draw(st.booleans()):
        return f"{scheme}://{draw(NAMES)}:{written}@{host}/{draw(NAMES)}", password
    return f"{scheme}://{host}/{draw(NAMES)}?password={quote(password, safe='')}", password


def forms(password: str) -> set[str]:
    return {password, quote(password, safe="")}


@hyp_settings(max_examples=200, deadline=None)
@given(urls())
def test_redact_hides_every_password_and_keeps_the_rest(written: tuple[str, str]) -> None:
    url, password = written
    shown = redact(url)
    assert not any(form in shown for form in forms(password))
    scheme = url.partition("://")[0]
    assert shown.startswith(f"{scheme}://")
    if "?password=" in url:
        assert shown == f"{url.partition('?')[0]}?password=***"
    else:  # the user, then the host and database after the last @
        user = url.partition("://")[2].partition(":")[0]
        assert shown == f"{scheme}://{user}:***@{url.rpartition('@')[2]}"


def test_redact_leaves_urls_without_a_password_as_they_are() -> None:
    for url in ("sqlite:////tmp/a:b@c/x.db", "sqlite:///autotune.db",
                "postgresql+psycopg2://user@host/db", "mysql+pymysql://host/db?charset=utf8"):
        assert redact(url) == url


@hyp_settings(max_examples=12, deadline=None)
@given(urls())
def test_a_storage_that_cannot_be_opened_is_refused_without_its_password(
        written: tuple[str, str]) -> None:
    url, password = written
    # A driver that is not there: SQLAlchemy fails before any connection (no network).
    url = re.sub(r"^[a-z0-9+]+://", "postgresql+nodriver://", url)
    with pytest.raises(ConfigError) as info:
        open_study(SearchSettings(storage=url, study_name="s"),
                   identity(SearchSettings(), BUDGET), "maximize")
    assert not any(form in str(info.value) for form in forms(password))
    assert str(info.value).startswith(f"cannot open --storage {redact(url)!r}")
    fresh = CliRunner().invoke(app, ["search", "--fresh", "--storage", url])
    assert fresh.exit_code == 2 and "--fresh applies to the local study store" in fresh.output
    unwrapped = "".join(fresh.output.split())  # however the terminal wrapped it
    assert not any(form in unwrapped for form in forms(password))


@pytest.mark.parametrize("url", ["postgresql+psycopg2://autotune:secret@localhost/studies",
                                 "postgresql://autotune:secret@localhost/studies"])
def test_a_missing_database_driver_is_named_with_its_pip_command_before_anything_runs(
        url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 61: with the driver module missing, the error said "Failed to import DB access
    module" (after the probes, in the CLI's words from Python too). The import fails for real
    here (psycopg2 blocked; plain ``postgresql://`` is psycopg 3's in SQLAlchemy 2, not
    installed): refused before any child, the module and the pip command named, in the words
    of the interface used, the password never shown."""
    import importlib.util

    monkeypatch.setitem(sys.modules, "psycopg2", None)
    module, pip = (("psycopg2", "pip install psycopg2-binary") if "psycopg2" in url else
                   ("psycopg", "pip install 'psycopg[binary]'"))
    assert importlib.util.find_spec(module) is None
    import autotune

    with pytest.raises(ConfigError) as info:
        autotune.search(target_batch=8, device="cpu", settings=SearchSettings(storage=url))
    said = str(info.value)
    assert said.startswith(f"storage={redact(url)!r} needs the database driver module "
                           f"{module!r}, which is not installed here: {pip}"), said
    assert "secret" not in said and "--storage" not in said
    result = CliRunner().invoke(app, ["search", "--storage", url, "--device", "cpu",
                                      "--out", str(tmp_path)])
    words = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert (f"--storage {shlex.quote(redact(url))} needs the database driver module "
            f"{module!r}, which is "
            f"not installed here: {pip}") in words, words
    assert "secret" not in words and not list(tmp_path.iterdir())


# -- a real PostgreSQL ---------------------------------------------------------------------


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Cluster:
    bin: Path
    data: Path
    port: int
    user: str
    password: str
    as_user: list[str]
    """The command prefix that runs PostgreSQL's tools as an unprivileged user (initdb and
    postgres refuse root)."""

    def ctl(self, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data),
                        "-l", str(self.data.parent / "log"), "-w", *args],
                       check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self.ctl("-o", f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1",
                 "start")

    def readme_url(self) -> str:
        """The docs' example URL (docs/several-devices.md), this cluster's user, password and
        host in it."""
        readme = (ROOT / "docs" / "several-devices.md").read_text()
        [url] = re.findall(r"--storage (postgresql\S*)", readme)
        assert url == "postgresql+psycopg2://user:pass@db-host/autotune", url
        assert "pip install psycopg2-binary" in readme
        return (url.replace("user:pass", f"{self.user}:{quote(self.password, safe='')}")
                .replace("db-host", f"127.0.0.1:{self.port}"))


@pytest.fixture(scope="module")
def postgres() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster on 127.0.0.1, password authentication, one database
    (``autotune``), gone after the module."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed (Debian: apt-get install "
                    "postgresql)")
    pytest.importorskip("psycopg2", reason="psycopg2-binary is not installed (the dev extra)")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the cluster as postgres
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run PostgreSQL as")
        as_user = ["runuser", "-u", "postgres", "--"]
    # In the system's /tmp, not the session's $TMPDIR (tests/conftest.py): pytest's folder is
    # its user's alone, and the cluster runs as postgres. Removed after the module.
    home = Path(tempfile.mkdtemp(prefix="autotune-pg-",
                                 dir="/tmp" if as_user and Path("/tmp").is_dir() else None))
    password = "S3cr%t@P:w/x?y"
    (home / "pw").write_text(password)
    if as_user:
        shutil.chown(home, "postgres")
        shutil.chown(home / "pw", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = Cluster(pg, home / "data", port, "tuner", password, as_user)
    try:
        subprocess.run([*as_user, str(pg / "initdb"), "-D", str(cluster.data), "-U",
                        cluster.user, f"--pwfile={home / 'pw'}", "--auth=scram-sha-256",
                        "--no-sync"], check=True, capture_output=True, timeout=120)
        cluster.start()
        import psycopg2

        db = psycopg2.connect(host="127.0.0.1", port=port, user=cluster.user,
                              password=password, dbname="postgres")
        db.autocommit = True
        db.cursor().execute("create database autotune")
        db.close()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.ctl("-m", "immediate", "stop")
        shutil.rmtree(home, ignore_errors=True)


def _leaks(password: str, *texts: str) -> list[str]:
    return [t for t in texts for form in forms(password) if form in t]


@pytest.mark.subprocess
def test_readmes_postgresql_url_records_resumes_and_never_shows_its_password(
        postgres: Cluster) -> None:
    url = postgres.readme_url()
    settings = replace(IN_MEMORY, storage=url, study_name="llm-fsdp")
    first = ScriptedDevice(SPEEDS)
    one = run_search(plan(), CLASSES, settings, run=first)
    assert one.study is not None and one.study.name == "llm-fsdp"
    # Resumed as README says, without --memory-budget: every run reused.
    again = ScriptedDevice(SPEEDS)
    two = run_search(replace(plan(), budget_bytes=BUDGET + 2 * MIB), CLASSES, settings,
                     run=again)
    assert again.specs == [] and winner(two) == winner(one) == "bf16/default/32"
    with pytest.raises(ConfigError) as refused:  # another budget: refused, naming both
        run_search(replace(plan(), budget_bytes=BUDGET // 2), CLASSES, settings,
                   run=ScriptedDevice(SPEEDS))
    assert "moved from 1,000 MiB to 500 MiB" in str(refused.value)
    config = tuned_config(plan(), two, settings)
    assert config.study is not None and config.study.storage == (
        f"postgresql+psycopg2://tuner:***@127.0.0.1:{postgres.port}/autotune")
    assert _leaks(postgres.password, to_json(config), *study_lines(config),
                  str(refused.value)) == []


def search_with_server_stopped(postgres: Cluster, settings: SearchSettings):
    """A scripted search whose PostgreSQL server stops before its fourth run (warned that it
    cannot be reached); the server started again after, for whichever test runs next."""
    device = ScriptedDevice(SPEEDS)

    def run(spec):
        if len(device.specs) == 3:
            postgres.ctl("-m", "fast", "stop")
        return device(spec)

    try:
        with pytest.warns(UserWarning, match="its server cannot be reached"):
            return run_search(plan(), CLASSES, settings, run=run)
    finally:
        postgres.start()


@pytest.mark.subprocess
def test_a_postgresql_server_gone_mid_search_costs_the_cache_not_the_search(
        postgres: Cluster) -> None:
    outcome = search_with_server_stopped(postgres, replace(
        IN_MEMORY, storage=postgres.readme_url(), study_name="gone"))
    assert not outcome.interrupted and winner(outcome) == "bf16/default/32"
    assert outcome.study is not None and outcome.study.note.startswith("failed while ")
    assert "the search goes on without it" in outcome.study.note
    assert _leaks(postgres.password, outcome.study.note) == []


@pytest.mark.slow  # two real searches; the default run keeps the resume tests on scripted devices
@pytest.mark.subprocess
def test_readmes_resume_example_runs_as_written(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/search.md: `--storage sqlite:///autotune.db --study-name NAME` resumes a search; the
    second one, as written (no --memory-budget: the default budget, what is free, moves a
    little), is not refused and measures no run again."""
    readme = " ".join((ROOT / "docs" / "search.md").read_text().split())
    assert "`--storage sqlite:///autotune.db --study-name NAME` resumes an interrupted search" in (
        readme)
    monkeypatch.chdir(tmp_path)
    args = ["search", "--workload", f"{ROOT / 'tests' / 'workloads.py'}:tiny",
            "--target-batch", "2", "--device", "cpu", "--precisions", "fp32",
            "--compile-modes", "off", "--timed-steps", "3",
            "--storage", "sqlite:///autotune.db", "--study-name", "NAME"]
    first = CliRunner().invoke(app, [*args, "--out", "first", "--json"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, [*args, "--out", "again", "--json"])
    assert again.exit_code == 0, again.output
    one, two = (json.loads((tmp_path / d / "autotune.json").read_text())
                for d in ("first", "again"))
    assert one["cost"]["num_runs"] > 0 and two["cost"]["num_runs"] == 0
    assert (two["micro_batch"], two["knobs"]) == (one["micro_batch"], one["knobs"])
