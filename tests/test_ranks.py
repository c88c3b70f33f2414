"""Jobs of several ranks (``--nproc-per-node``, ``--strategy ddp|fsdp``): real gloo ranks on
this CPU under torch's elastic launcher; a fault on any rank is the job's outcome, and no rank
outlives the job."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune import api
from autotune.config import DeviceInfo, Knobs, TrialSpec, WorkloadSpec
from autotune.errors import ConfigError
from autotune.names import FLAGS
from autotune.runner import run_isolated
from autotune.runner_ranks import merge_ranks
from autotune.units import MIB
from tests.conftest import workload_target
from tests.test_cli import _invoke, _words

CPU = DeviceInfo(device="cpu", name="test cpu", total_memory_bytes=8 * 1024 * MIB,
                 available_memory_bytes=8 * 1024 * MIB, supports_bf16=True,
                 supports_fp16=False, supports_tf32=False)


def _spec(name: str, strategy: str, micro_batch: int = 2, **kwargs: object) -> TrialSpec:
    kwargs.setdefault("timeout_s", 120.0)
    return TrialSpec(workload=WorkloadSpec(kind="file", target=workload_target(name)),
                     device="cpu", micro_batch=micro_batch, knobs=Knobs(strategy=strategy),
                     ranks=2, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def job_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """A token in the environment of every process this test starts (inherited by the
    launcher and its ranks): what ``_left_running`` looks for."""
    token = f"test-{uuid.uuid4().hex}"
    monkeypatch.setenv("AUTOTUNE_TEST_JOB", token)
    return token


def _left_running(token: str) -> list[int]:
    """Processes still running with ``token`` in their environment (this one aside, and the
    fork server started with it: it lives on to fork this process's next child)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token.encode() in (entry / "environ").read_bytes() and not _is_fork_server(
                    entry):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _is_fork_server(entry: Path) -> bool:
    cmdline = (entry / "cmdline").read_bytes().split(b"\0")
    return cmdline[1:4] == [b"-m", b"autotune.fork_server", b"--serve"] and int(
        (entry / "stat").read_text().rpartition(")")[2].split()[1]) == os.getpid()


# -- the job's result from its ranks' (no processes) -------------------------------------------

def _ok(peak: int, steps: tuple[float, ...] = (1.0, 2.0)) -> dict[str, object]:
    return {"status": "ok", "peak_bytes": peak, "step_times_s": list(steps),
            "samples_per_step": 8}


def test_an_ok_job_takes_its_largest_rank_and_slowest_steps() -> None:
    job = merge_ranks([_ok(10 * MIB, (1.0, 3.0)), _ok(12 * MIB, (2.0, 1.5))])
    assert job.ok
    assert job.peak_bytes == 12 * MIB and job.rank_peak_bytes == (10 * MIB, 12 * MIB)
    assert job.step_times_s == (2.0, 3.0)


def test_the_cause_wins_over_its_echoes() -> None:
    echo = {"status": "error", "message": "RuntimeError: Connection closed by peer"}
    oom = {"status": "oom", "message": "can't allocate memory"}
    job = merge_ranks([echo, oom])
    assert job.status == "oom"
    assert job.message.startswith("rank 1 of 2: can't allocate memory")


def test_the_first_rank_to_fail_is_the_cause() -> None:
    """Both ranks raised (an ``error``): the one that failed first is the cause, its peer's
    broken connection the echo, whatever their order."""
    echo = {"status": "error", "message": "RuntimeError: [pair.cc:553] Connection closed by peer",
            "rank_failed_at_s": 1002.5}
    cause = {"status": "error", "message": "ValueError: the user's bug",
             "rank_failed_at_s": 1002.0}
    for ranks, rank in (([echo, cause], 1), ([cause, echo], 0)):
        job = merge_ranks(ranks)
        assert job.status == "error"
        assert job.message == f"rank {rank} of 2: ValueError: the user's bug"
    # A peer the launcher stopped (SIGTERM) before it failed on its own left no result: an
    # echo too, where a rank that died of itself would be the cause.
    assert merge_ranks([None, cause], stopped=[0]).message == (
        "rank 1 of 2: ValueError: the user's bug")
    assert merge_ranks([None, cause]).status == "crash"


def test_a_rank_without_a_result_is_a_crash_unless_another_names_the_cause() -> None:
    echo = {"status": "error", "message": "RuntimeError: Connection closed by peer"}
    crash = merge_ranks([echo, None], "launcher exited with code 1")
    assert crash.status == "crash"
    assert crash.message.startswith("rank 1 of 2 left no result")
    assert "launcher exited with code 1" in crash.message
    assert merge_ranks([_ok(MIB), None]).status == "crash"
    assert merge_ranks([{"status": "oom", "message": "m"}, None]).status == "oom"
    assert merge_ranks([{"child_error": "ValueError: x"}, _ok(MIB)]).status == "crash"


_STATUSES = ("ok", "oom", "error", "non_finite", "crash", "workload_error", "compile_error")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.tuples(st.sampled_from(_STATUSES),
                                               st.integers(0, 2**40))), min_size=1, max_size=8))
def test_any_failed_or_missing_rank_fails_the_job(ranks: list[tuple[str, int] | None]) -> None:
    datas = [None if r is None else {"status": r[0], "peak_bytes": r[1], "message": r[0]}
             for r in ranks]
    job = merge_ranks(datas)
    if all(r is not None and r[0] == "ok" for r in ranks):
        assert job.ok and job.peak_bytes == max(r[1] for r in ranks if r is not None)
    else:
        assert not job.ok
        if any(r is not None and r[0] == "oom" for r in ranks):
            assert job.status == "oom"  # the cause of the others' failures


# -- what a request of ranks may ask (no processes) --------------------------------------------

def _validate(**fields: object):
    """The request's validation, its messages naming the CLI's flags."""
    fields.setdefault("target_batch", 64)
    fields.setdefault("precisions", ["fp32"])
    fields.setdefault("compile_modes", ["off"])
    return api.TuneRequest(**fields).validate(CPU, FLAGS)  # type: ignore[arg-type]


def test_ranks_default_to_ddp_and_the_world_to_the_ranks() -> None:
    request = api.TuneRequest(target_batch=64, nproc_per_node=2)
    assert request.world_size == 2
    _, _, classes, values, _ = _validate(nproc_per_node=2)
    assert values["strategy"] == ("ddp", "ddp-bucket-view")
    assert classes == (Knobs(strategy="ddp"),)
    _, _, classes, values, _ = _validate()
    assert values["strategy"] == ("none",) and classes == (Knobs(),)


def test_a_strategy_family_names_its_memory_option() -> None:
    _, _, _, values, _ = _validate(nproc_per_node=2, knob_values={"strategy": ["fsdp", "ddp"]})
    assert values["strategy"] == ("fsdp", "fsdp-no-reshard", "ddp", "ddp-bucket-view")


@pytest.mark.parametrize(("fields", "expected"), [
    ({"nproc_per_node": 4096}, "--nproc-per-node 4096 is more than this machine runs"),
    ({"nproc_per_node": 0}, "--nproc-per-node must be a whole number of at least 1, got 0"),
    ({"nproc_per_node": 2, "world_size": 3, "target_batch": 63},
     "--world-size 3 is not a multiple of --nproc-per-node 2"),
    ({"nproc_per_node": 2, "knob_values": {"strategy": ["none"]}},
     "ranks need a strategy to share the work; use --strategy ddp or fsdp"),
    ({"knob_values": {"strategy": ["none", "ddp"]}}, "--strategy none,ddp: none is one process"),
    ({"knob_values": {"strategy": ["zero3"]}},
     "--strategy zero3: not a value of strategy; choose from none,ddp,ddp-bucket-view,fsdp,"
     "fsdp-no-reshard"),
])
def test_bad_ranks_are_named(fields: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _validate(**fields)
    assert expected in str(caught.value)


def test_the_cli_refuses_more_ranks_than_cores_with_exit_2() -> None:
    result = _invoke("search", "--nproc-per-node", "4096", "--device", "cpu")
    assert result.exit_code == 2
    assert "--nproc-per-node 4096 is more than this machine runs" in _words(result.stderr)


# -- real jobs of 2 gloo ranks -----------------------------------------------------------------

@pytest.mark.subprocess
@pytest.mark.parametrize("strategy", [
    # slow: the everyday run keeps DDP jobs of two ranks in the faults below and the generated
    # DDP step (test_codegen.py)
    pytest.param("ddp", marks=pytest.mark.slow),
    "fsdp"])
def test_a_job_of_two_ranks_trains_and_reports_each_rank(strategy: str) -> None:
    result = run_isolated(_spec("tiny", strategy, accumulate_steps=2, num_timed_steps=2))
    assert result.status == "ok", result.message
    assert len(result.rank_peak_bytes) == 2 and result.peak_bytes == max(result.rank_peak_bytes)
    assert result.samples_per_step == 2 * 2 * 2  # micro-batch x accumulation x ranks
    assert len(result.step_times_s) == 2 and result.reference_loss is not None


@pytest.mark.slow  # a whole job's folders; the default run keeps a job of two ranks (each strategy)
@pytest.mark.subprocess
def test_a_job_of_ranks_leaves_nothing_in_the_temporary_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's log folders (``torchelastic_*``) and the job's files go with the job
    (inductor's cache folder stays: every child shares it, warm, by design)."""
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the launcher's and the ranks' (a server of theirs)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # this process's, read once
    result = run_isolated(_spec("tiny", "ddp", micro_batch=1, num_timed_steps=1))
    assert result.status == "ok", result.message
    assert sorted(p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")) == []



    """state_heavy: 16 MiB of parameters, 64 MiB with gradients and AdamW's moments; FSDP2 on
    2 ranks holds half of that per rank, DDP all of it plus its gradient buckets."""
    ddp = run_isolated(_spec("state_heavy", "ddp", micro_batch=1, num_timed_steps=1))
    fsdp = run_isolated(_spec("state_heavy", "fsdp", micro_batch=1, num_timed_steps=1))
    assert ddp.ok and fsdp.ok, (ddp.message, fsdp.message)
    assert ddp.peak_bytes is not None and fsdp.peak_bytes is not None
    assert ddp.peak_bytes - fsdp.peak_bytes > 16 * MIB  # at least the state's half, less noise


@pytest.mark.subprocess
@pytest.mark.parametrize(("workload", "status", "cause"), [
    # slow: a killed child named as a crash runs everyday (test_runner.py's segfault), a rank's
    # fault ending the job in the case below
    pytest.param("rank_killed", "crash", "rank 1 of 2 killed by SIGKILL", marks=pytest.mark.slow),
    # slow: a rank's OOM named as the job's cause runs everyday in test_the_cause_wins_over_its_
    # echoes, a fault that leaves no rank behind in the case above
    pytest.param("rank_oom", "oom", "rank 1 of 2: out of memory: the CPU allocator could not "
                 "allocate ", marks=pytest.mark.slow),
    # slow: the same job as the case below, whose peer is busy when the fault comes
    pytest.param("rank_raises", "error", "rank 1 of 2: ValueError: rank one's loss failed",
                 marks=pytest.mark.slow),
    ("rank_raises_peer_busy", "error", "rank 1 of 2: ValueError: rank one's loss failed"),
])
def test_a_fault_on_one_rank_ends_the_job_and_no_rank_is_left(workload: str, status: str,
                                                             cause: str, job_token: str) -> None:
    result = run_isolated(_spec(workload, "ddp", timeout_s=60.0, num_timed_steps=2,
                                memory_budget_bytes=512 * MIB))
    assert result.status == status, result.message
    assert cause in result.message.splitlines()[0]  # ended by the fault, not the timeout
    time.sleep(0.5)  # SIGKILL of the ranks (parent-death signal) is delivered asynchronously
    assert _left_running(job_token) == []


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_hanging_rank_times_the_job_out_and_no_rank_is_left(job_token: str) -> None:
    result = run_isolated(_spec("rank_hang", "ddp", timeout_s=10.0, num_timed_steps=2))
    assert result.status == "timeout"
    time.sleep(0.5)  # SIGKILL of the ranks (parent-death signal) is delivered asynchronously
    assert _left_running(job_token) == []


@pytest.mark.subprocess
@pytest.mark.slow
def test_probe_shows_ddp_and_fsdp_side_by_side(tmp_path: object) -> None:
    """Under a cap where DDP's replicated AdamW state leaves room for few samples, FSDP2's
    shards leave room for more: the probe JSON shows both."""
    result = _invoke("probe", "--workload", workload_target("state_heavy"),
                     "--target-batch", "32", "--nproc-per-node", "2",
                     "--strategy", "ddp-bucket-view,fsdp-no-reshard", "--memory-budget",
                     "120MiB", "--headroom", "0", "--device", "cpu", "--precisions", "fp32",
                     "--compile-modes", "off", "--json")
    assert result.exit_code == 0, result.output
    probes = {p["knobs"]["strategy"]: p for p in json.loads(result.stdout)["probes"]}
    assert set(probes) == {"ddp-bucket-view", "fsdp-no-reshard"}
    assert probes["fsdp-no-reshard"]["max_micro_batch"] > probes["ddp-bucket-view"][
        "max_micro_batch"] >= 1


@pytest.mark.slow
def test_a_model_too_big_for_one_rank_is_tuned_with_fsdp(tmp_path: object) -> None:
    """DDP (the job's baseline) fits no micro-batch: the search offers FSDP2, the first
    setting that frees enough memory, and tunes it."""
    out = str(tmp_path)
    result = _invoke("search", "--workload", workload_target("state_heavy"),
                     "--target-batch", "16", "--nproc-per-node", "2", "--strategy", "ddp,fsdp",
                     "--memory-budget", "85MiB", "--headroom", "0", "--device", "cpu",
                     "--precisions", "fp32", "--compile-modes", "off", "--checkpointing", "off",
                     "--optimizer-impls", "default", "--out", out, "--no-cache")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "autotune.json").read_text())  # type: ignore[operator]
    assert config["knobs"]["strategy"].startswith("fsdp")
    assert config["nproc_per_node"] == 2 and config["world_size"] == 2
    assert "fp32/off+dp=ddp fits no micro-batch" in " ".join(s["text"] for s in config["skips"])
    assert config["nproc_per_node"] == 2


def test_a_shared_study_refuses_runs_of_another_job(tmp_path: Path) -> None:
    """Searches on several nodes share one --storage study; one measured with another number
    of ranks per node, or on another device kind, is refused (its peaks are another job's)."""
    from autotune.config import ProbeReport
    from autotune.search import SearchSettings
    from autotune.search._study import open_study, study_identity

    settings = SearchSettings(storage=f"sqlite:///{tmp_path}/shared.db", study_name="nodes")

    def identity(ranks: int, device: DeviceInfo = CPU) -> dict[str, str]:
        report = ProbeReport(workload=WorkloadSpec(), device=device, target_batch=64,
                             world_size=4, headroom=0.1, budget_bytes=1024 * MIB, probes=(),
                             nproc_per_node=ranks)
        return study_identity(report, settings)

    open_study(settings, identity(2), "maximize")
    open_study(settings, identity(2), "maximize")  # another node of the same kind: shared
    for other in (identity(4), identity(2, DeviceInfo(**{**CPU.__dict__, "name": "other"}))):
        with pytest.raises(ConfigError, match="refusing to mix"):
            open_study(settings, other, "maximize")


@pytest.mark.slow
def test_fsdp_without_repeated_blocks_shards_the_root_and_says_so(tmp_path: Path) -> None:
    """tiny (two Linear layers, no ModuleList): FSDP2 has no blocks to shard one by one."""
    result = _invoke("search", "--workload", workload_target("tiny"), "--target-batch", "4",
                     "--nproc-per-node", "1", "--strategy", "fsdp", "--device", "cpu",
                     "--precisions", "fp32", "--compile-modes", "off", "--checkpointing", "off",
                     "--optimizer-impls", "default", "--out", str(tmp_path), "--no-cache")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "autotune.json").read_text())
    assert config["knobs"]["strategy"].startswith("fsdp")
    assert any(s.startswith("fsdp: no repeated blocks to shard one by one")
               for s in (x["text"] for x in config["skips"]))


def _ranks_config(tmp_path: Path, ranks: int, world: int, strategy: str = "fsdp") -> Path:
    from tests.test_estimate import tuned_json

    path = tuned_json(tmp_path, micro_batch=4, knobs=Knobs(strategy=strategy), world_size=2)
    data = json.loads(path.read_text())
    data.update(nproc_per_node=ranks, world_size=world, accumulate_steps=1,
                target_batch=4 * world)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.subprocess
@pytest.mark.slow
def test_check_measures_one_job_of_the_configs_ranks(tmp_path: Path) -> None:
    result = api.check(_ranks_config(tmp_path, 2, 2), measure=True)
    assert result.method == "measure", result.message
    assert result.peak_bytes is not None and result.peak_bytes > 0


def test_check_refuses_to_measure_more_ranks_than_the_machine_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="measuring this config needs a job of 4096 ranks"):
        api.check(_ranks_config(tmp_path, 4096, 4096), measure=True)


def test_a_config_of_ranks_without_a_strategy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ranks need knobs\.strategy ddp or fsdp"):
        api.check(_ranks_config(tmp_path, 2, 2, strategy="none"), measure=False)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_loaded_fsdp_config_shards_the_users_model_under_torchrun(tmp_path: Path) -> None:
    """``autotune.load`` + ``cfg.parallelize`` in the user's own script under torchrun: the
    blocks and the root are FSDP2 modules, each rank holds half of a weight, a step trains."""
    from tests.tuned_configs import torchrun

    config = _ranks_config(tmp_path, 2, 2)
    result = torchrun(str(Path(__file__).parent / "load_ranks.py"), str(config),
                      str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"sharded": [True, True, True, True], "local_rows": 32,
                        "full_rows": 64, "moved": True}


def test_parallelize_without_a_process_group_says_what_to_do(tmp_path: Path) -> None:
    from torch import nn

    from autotune.knobs import KnobUnsupported

    cfg = api.load(_ranks_config(tmp_path, 2, 2), world_size=2)
    with pytest.raises(KnobUnsupported, match="needs a process group: run under torchrun"):
        cfg.parallelize(nn.Linear(2, 2))
