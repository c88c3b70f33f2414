"""Compiled artifacts for the user's first launch (issue 49): saved after a compiled winner,
loaded by a fresh process when torch, device and graphs match (it reports inductor cache hits),
refused with the reason otherwise; a damaged or foreign file is never fatal."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autotune
from autotune import api
from autotune.api.deliver import with_compile_artifacts, write_outputs
from autotune.artifacts import GRAPH_SETTINGS, graph_settings, graphs_key, load_artifacts
from autotune.codegen import render_train_script
from autotune.config import WorkloadSpec
from autotune.schema import CompileArtifacts
from autotune.search import SearchSettings
from autotune.signals import SignalGuard
from autotune.tuned_file import read_tuned, save_tuned
from autotune.usage import CompileArtifactsWarning
from tests.tuned_configs import REPO, small, subprocess_env
from tests.workloads import WideMLP

TINY = WorkloadSpec(kind="file", target=f"{REPO / 'tests' / 'workloads.py'}:tiny")


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled winner's outputs (tiny MLP, fp32/default 2x2), its artifacts saved by the
    real child run. Tests copy it (``folder``): none changes another's files."""
    out = tmp_path_factory.mktemp("saved")
    config = small(compile_mode="default", workload=TINY, workload_name="tiny-wide-mlp")
    config, saved = with_compile_artifacts(config, out / "autotune.json", 600.0, SignalGuard())
    assert saved is not None, config.skipped
    write_outputs(config, out / "autotune.json", out / "train_autotuned.py", force=False,
                  artifacts=saved)
    return out


@pytest.fixture()
def folder(saved_folder: Path, tmp_path: Path) -> Path:
    shutil.copytree(saved_folder, tmp_path / "out")
    return tmp_path / "out"


@pytest.fixture()
def handmade(tmp_path: Path) -> Path:
    """A compiled config naming artifacts that match this torch, this CPU and ``WideMLP`` (its
    file holds bytes of no use: every check before torch's loader is reached refuses first)."""
    from autotune.artifacts import device_name

    config = small(compile_mode="default", workload=TINY, workload_name="tiny-wide-mlp")
    data = b"not a cache"
    config = dataclasses.replace(config, compile_artifacts=CompileArtifacts(
        file="autotune.compile-cache.bin", size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(), torch_version=torch.__version__,
        device_name=device_name("cpu"), graphs_key=graphs_key(WideMLP(), graph_settings(config))))
    (tmp_path / "autotune.compile-cache.bin").write_bytes(data)
    save_tuned(config, tmp_path / "autotune.json")
    (tmp_path / "train_autotuned.py").write_text(render_train_script(config, script_dir=tmp_path))
    return tmp_path


def first_launch(folder: Path, tmp_path: Path) -> str:
    """``train_autotuned.py --steps 1`` as on a new machine: a fresh process, an empty
    inductor cache. Its output; it must end well."""
    env = {**subprocess_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh-cache")}
    run = subprocess.run([sys.executable, "train_autotuned.py", "--steps", "1", "--out",
                          str(tmp_path / "ckpt")], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def cache_counts(output: str) -> tuple[int, int]:
    line = next(ln for ln in output.splitlines() if "inductor caches:" in ln)
    hits, misses = line.split("inductor caches: ")[1].split(" hits, ")
    return int(hits), int(misses.split()[0])


@pytest.mark.subprocess
@pytest.mark.slow  # 63 s; the default run keeps test_no_damaged_file_is_loaded_or_raises
def test_a_fresh_first_launch_reads_the_saved_artifacts(folder: Path, tmp_path: Path) -> None:
    config = read_tuned(folder / "autotune.json")
    record = config.compile_artifacts
    assert record is not None and record.file == "autotune.compile-cache.bin"
    data = (folder / record.file).read_bytes()
    assert (len(data), hashlib.sha256(data).hexdigest()) == (record.size_bytes, record.sha256)
    assert record.entries.get("inductor", 0) >= 1 and record.torch_version == torch.__version__
    output = first_launch(folder, tmp_path)
    assert "compiled artifacts loaded from" in output
    hits, misses = cache_counts(output)  # counted by inductor, not timed
    assert hits >= 1 and misses == 0, output


@pytest.mark.slow  # the default run keeps the script's first launch of the same artifacts
@pytest.mark.subprocess
def test_tuned_compile_loads_them_in_a_fresh_process(folder: Path, tmp_path: Path) -> None:
    code = (
        "import logging, sys, torch, autotune\n"
        "from autotune.artifacts import compile_cache_counts\n"
        "sys.path.insert(0, 'tests')\n"
        "from workloads import WideMLP, _batch\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "cfg = autotune.load(sys.argv[1])\n"
        "cfg.set_matmul_precision()\n"
        "torch.manual_seed(0)\n"
        "model = cfg.compile(WideMLP())\n"
        "model(*_batch(2)).backward()\n"
        "print('counts', *compile_cache_counts())\n")
    env = {**subprocess_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh-cache")}
    run = subprocess.run([sys.executable, "-c", code, str(folder / "autotune.json")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "compiled artifacts loaded from" in run.stderr
    hits, misses = map(int, run.stdout.split("counts ")[1].split())
    assert hits >= 1 and misses == 0, run.stdout + run.stderr


# slow: a compiled search's artifacts, made by the fixture; the everyday run
# keeps damaged artifacts refused (test_no_damaged_file_is_loaded_or_raises)
@pytest.mark.slow
@pytest.mark.subprocess
def test_tf32_flags_unlike_the_searchs_are_said_when_loading(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "cache"))  # what the load writes
    cfg = autotune.load(folder / "autotune.json")
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # torch's default; the search's fp32 runs had False
    try:
        with pytest.warns(CompileArtifactsWarning, match=r"call cfg\.set_matmul_precision"):
            cfg.compile(WideMLP())
        cfg.set_matmul_precision()
        with warnings.catch_warnings():
            warnings.simplefilter("error", CompileArtifactsWarning)
            cfg.compile(WideMLP())
        assert cfg.artifacts_note.startswith("compiled artifacts loaded from")
    finally:
        torch.backends.cudnn.allow_tf32 = before


@pytest.mark.subprocess
@pytest.mark.slow  # in the default run: test_no_damaged_file_is_loaded_or_raises, in process
@pytest.mark.parametrize("damage", ["truncated", "random-bytes"])
def test_a_damaged_file_is_ignored_with_a_warning_and_the_run_completes(
        folder: Path, tmp_path: Path, damage: str) -> None:
    path = folder / "autotune.compile-cache.bin"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    output = first_launch(folder, tmp_path)
    assert "not loaded: not the file the search wrote" in output
    assert cache_counts(output)[0] == 0  # compiled from nothing


@pytest.mark.subprocess
@pytest.mark.slow  # the refusal's reasons are tested in process (test_a_mismatch_is_refused...)
def test_the_script_refuses_artifacts_for_another_micro_batch(folder: Path,
                                                              tmp_path: Path) -> None:
    script = folder / "train_autotuned.py"
    text = script.read_text()
    assert "micro_batch = 2  #" in text
    script.write_text(text.replace("micro_batch = 2  #", "micro_batch = 4  #"))
    output = first_launch(folder, tmp_path)
    assert "not loaded: saved for other graphs" in output


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("torch_version", "2.7.0+cu126", "saved by torch 2.7.0+cu126, this is torch"),
    ("device_name", "NVIDIA H100 80GB HBM3", "saved on 'NVIDIA H100 80GB HBM3', this is"),
    ("graphs_key", "0123456789abcdef", "saved for other graphs (key 0123456789abcdef"),
])
def test_a_mismatch_is_refused_with_its_reason(handmade: Path, field: str, value: str,
                                               reason: str) -> None:
    data = json.loads((handmade / "autotune.json").read_text())
    data["compile_artifacts"][field] = value
    (handmade / "autotune.json").write_text(json.dumps(data))
    cfg = autotune.load(handmade / "autotune.json")
    with pytest.warns(CompileArtifactsWarning, match="not loaded: ") as seen:
        cfg.compile(WideMLP())
    assert reason in str(seen[0].message) and "compiling from nothing" in str(seen[0].message)
    assert len(str(seen[0].message).splitlines()) == 1


@pytest.mark.timeout(30)  # it waited for a writer forever
@pytest.mark.parametrize("make", [os.mkfifo, lambda at: os.symlink("/dev/null", at)])
def test_a_fifo_or_device_in_place_of_the_file_is_never_read(handmade: Path,
                                                          make: Callable[[Path], None]) -> None:
    """Issue 61: a FIFO (or a link to a device) in place of the artifacts: not
    loaded, one line saying what is there, a normal compile."""
    path = handmade / "autotune.compile-cache.bin"
    path.unlink()
    make(path)
    cfg = autotune.load(handmade / "autotune.json")
    with pytest.warns(CompileArtifactsWarning) as seen:
        cfg.compile(WideMLP())
    kind = "a FIFO (named pipe)" if path.is_fifo() else "a character device"
    assert str(seen[0].message) == (f"compiled artifacts {path} not loaded: it is {kind}, not "
                                    "a regular file; compiling from nothing")


@pytest.mark.timeout(30)  # it waited for a writer forever
@pytest.mark.parametrize("make", [os.mkfifo, lambda at: os.symlink("/dev/zero", at)])
def test_the_script_never_reads_a_fifo_or_device_in_place_of_the_file(
        handmade: Path, make: Callable[[Path], None]) -> None:
    """Issue 61: ``train_autotuned.py``'s own check (it does not import autotune) opens the
    file without waiting and reads it only when it is a regular file."""
    path = handmade / "autotune.compile-cache.bin"
    path.unlink()
    make(path)
    script = handmade / "train_autotuned.py"
    namespace: dict[str, object] = {"__name__": "generated", "__file__": str(script)}
    exec(compile(script.read_text(), str(script), "exec"), namespace)  # defines, runs nothing
    line = namespace["load_compile_artifacts"](WideMLP(), "cpu")  # type: ignore[operator]
    assert line == (f"note: compiled artifacts {path} not loaded: it is not a regular file (a "
                    "FIFO, device or folder); compiling from nothing")


def test_another_model_is_refused_and_the_handmade_one_reaches_the_file(handmade: Path) -> None:
    cfg = autotune.load(handmade / "autotune.json")
    with pytest.warns(CompileArtifactsWarning, match="saved for other graphs"):
        cfg.compile(torch.nn.Linear(8, 8))
    with pytest.warns(CompileArtifactsWarning, match="torch could not"):  # all else matched
        cfg.compile(WideMLP())


def _record(folder: Path) -> CompileArtifacts:
    record = read_tuned(folder / "autotune.json").compile_artifacts
    assert record is not None
    return record


# slow: a compiled child's artifacts, made by the fixture; the everyday run keeps every refusal of a
# handmade file in this process
@pytest.mark.slow
@pytest.mark.subprocess
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0), noise=st.binary(max_size=64), keep_digest=st.booleans())
def test_no_damaged_file_is_loaded_or_raises(folder: Path, cut: float, noise: bytes,
                                             keep_digest: bool) -> None:
    """Any prefix of the file with any bytes after it: refused, never an exception; with its
    digest recorded as its own (a foreign file) torch's loader sees it and still nothing
    breaks."""
    record = _record(folder)
    data = (folder / record.file).read_bytes()
    damaged = data[:int(cut * len(data))] + noise
    if damaged == data:
        return
    target = folder / "damaged.bin"
    target.write_bytes(damaged)
    record = dataclasses.replace(record, file="damaged.bin")
    if keep_digest:
        record = dataclasses.replace(record, size_bytes=max(1, len(damaged)),
                                     sha256=hashlib.sha256(damaged).hexdigest())
    config = read_tuned(folder / "autotune.json")
    model = WideMLP()
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "cache")  # whatever torch writes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded, line = load_artifacts(record, folder, model, graph_settings(config), "cpu")
    finally:
        if before is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    if not keep_digest or not damaged:
        assert not loaded and "not the file the search wrote" in line
    assert "\n" not in line


def test_the_script_computes_the_librarys_graphs_key(handmade: Path) -> None:
    namespace: dict[str, object] = {"__name__": "generated"}
    source = (handmade / "train_autotuned.py").read_text()
    exec(compile(source, "train_autotuned.py", "exec"), namespace)  # defines, runs nothing
    config = read_tuned(handmade / "autotune.json")
    model = WideMLP()
    assert set(GRAPH_SETTINGS) <= namespace.keys()  # each a variable of the script
    assert namespace["graphs_key"](model) == graphs_key(model, graph_settings(config))  # type: ignore[operator]
    assert namespace["compile_artifacts"]["graphs_key"] == config.compile_artifacts.graphs_key  # type: ignore[index,union-attr]


@pytest.mark.parametrize("spec", [WorkloadSpec(), WorkloadSpec(kind="hf", target="gpt2")],
                         ids=["default", "hf"])
def test_every_kind_of_script_computes_the_librarys_graphs_key(spec: WorkloadSpec) -> None:
    # The built-in workload's script says no shape policy (nor does a --model one without
    # --lengths): a key over a setting the script lacks never matched (found by the README's
    # main command: "not loaded: saved for other graphs").
    config = small(compile_mode="default", workload=spec, compile_artifacts=CompileArtifacts(
        file="x.bin", size_bytes=1, sha256="0" * 64, torch_version="2.13.0",
        device_name="cpu", graphs_key="0" * 16))  # saved: the script carries their loader
    namespace: dict[str, object] = {"__name__": "generated"}
    exec(compile(render_train_script(config), "train_autotuned.py", "exec"), namespace)
    model = WideMLP()
    assert set(GRAPH_SETTINGS) <= namespace.keys()
    assert namespace["graphs_key"](model) == graphs_key(model, graph_settings(config))  # type: ignore[operator]


def test_an_eager_config_names_no_artifacts_and_saves_none(tmp_path: Path) -> None:
    config = small(workload=TINY)
    same, saved = with_compile_artifacts(config, tmp_path / "autotune.json", 60.0,
                                         SignalGuard())
    assert (same, saved) == (config, None)
    assert "compile_artifacts" not in render_train_script(config)  # nor code to load them


def test_a_record_outside_the_folder_is_refused_on_read(tmp_path: Path) -> None:
    config = small(compile_mode="default", compile_artifacts=CompileArtifacts(
        file="x.bin", size_bytes=1, sha256="0" * 64, torch_version="2.13.0",
        device_name="cpu", graphs_key="0" * 16))
    save_tuned(config, tmp_path / "autotune.json")
    data = json.loads((tmp_path / "autotune.json").read_text())
    data["compile_artifacts"]["file"] = "../../etc/passwd"
    (tmp_path / "autotune.json").write_text(json.dumps(data))
    with pytest.raises(autotune.ConfigError, match=r"compile_artifacts\.file"):
        read_tuned(tmp_path / "autotune.json")


@pytest.mark.subprocess
@pytest.mark.slow
# two searches, one compiled whose first launch compiles afresh (its cold compile was most of
# the 344 s this took alone on the 2-core Xeon until ``Fusable`` took 8 ops, 2026-11-29; 2 ops
# and an eager pause that makes compiled win whatever the load, 2026-11-30)
def test_a_compiled_search_writes_artifacts_an_eager_one_none(tmp_path: Path) -> None:
    fast = SearchSettings(num_timed_steps=3, min_timed_s=0.2, micro_batches_per_class=1,
                          num_confirm=0, cache=False)
    fusable = WorkloadSpec(kind="file", target=f"{REPO / 'tests' / 'workloads.py'}:fusable")
    config = api.search(fusable, target_batch=4, device="cpu", memory_budget="4GiB",
                        precisions=["fp32"], compile_modes=["off", "default"],
                        out=tmp_path / "compiled", settings=fast).config
    assert config.compile_mode == "default", (  # fused, far faster than eager
        config.reason, [(t.knobs.label(), t.micro_batch, t.verdict, t.samples_per_s)
                        for t in config.trials], config.skipped)
    record = config.compile_artifacts
    assert record is not None and (tmp_path / "compiled" / record.file).exists()
    assert record.cache_hits and not record.cache_misses  # the search's graphs, read back
    eager = api.search(TINY, target_batch=4, device="cpu", memory_budget="4GiB",
                       precisions=["fp32"], compile_modes=["off"], out=tmp_path / "eager",
                       settings=fast).config
    assert eager.compile_artifacts is None
    assert not (tmp_path / "eager" / "autotune.compile-cache.bin").exists()
    assert "compile_artifacts" not in (tmp_path / "eager" / "train_autotuned.py").read_text()

def test_artifacts_that_cannot_be_written_leave_the_config_naming_none(tmp_path: Path) -> None:
    from autotune.first_launch import Saved
    from autotune.report import search_footer
    from autotune.schema import SearchResult

    data = b"entries"
    record = CompileArtifacts(file="autotune.compile-cache.bin", size_bytes=len(data),
                              sha256=hashlib.sha256(data).hexdigest(), torch_version="2.13.0",
                              device_name="AMD EPYC", graphs_key="0" * 16,
                              entries={"inductor": 2}, compile_s=3.0, cache_hits=2,
                              cache_misses=0)
    config = dataclasses.replace(small(compile_mode="default"), compile_artifacts=record)
    footer = search_footer(SearchResult(config=config, path=None, probe=None))  # type: ignore[arg-type]
    assert ("first launch: compiled artifacts autotune.compile-cache.bin (0.0 MiB, 2 cache "
            "entries: inductor 2; saved in 3 s, 2 cache hits, 0 misses), loaded when torch "
            "2.13.0 runs on AMD EPYC") in footer
    (tmp_path / record.file).write_bytes(b"another search's")  # appeared while it ran
    with pytest.warns(UserWarning, match="autotune.compile-cache.bin not written"):
        write_outputs(config, tmp_path / "autotune.json", tmp_path / "train_autotuned.py",
                      force=False, artifacts=Saved(data, record))
    written = read_tuned(tmp_path / "autotune.json")
    assert written.compile_artifacts is None
    assert any(s.rule == "compile-artifacts" for s in written.skips)
    assert (tmp_path / record.file).read_bytes() == b"another search's"
