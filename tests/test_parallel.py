"""``--parallel N`` (issue 60): its checks, the slots' pinning of a real child, and a search
whose batches run on several slots at once deciding as one run at a time does
(``autotune/search/slots.py``, ``batch.py``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autotune
from autotune.child import Child
from autotune.cli import app
from autotune.config import Knobs, TrialResult, TrialSpec
from autotune.errors import ConfigError, WorkloadError
from autotune.runner import run_in_child
from autotune.search import SearchOutcome, run_search
from autotune.search.slots import Begun, Done, Slot, ThreadSlots, dispatch, plan_slots
from tests.scripted import CLASSES, SETTINGS, VALUES, KnobDevice, by_class, pick_winner_record, plan

TINY = str(Path(__file__).resolve().parent / "workloads.py") + ":tiny"

CORES = len(os.sched_getaffinity(0))


def _cli(*args: str):
    return CliRunner().invoke(app, ["search", "--workload", TINY, "--target-batch",
                                    "2", "--device", "cpu", *args])


@pytest.mark.parametrize(("value", "said"), [
    ("0", "--parallel must be a whole number of child runs at once, at least 1, or 'auto'"),
    ("-2", "got -2"),
    ("1.5", "got '1.5' (a str)"),
    (str(CORES + 1), f"--parallel {CORES + 1} is more than this machine runs at once: "
                     f"{CORES} CPU core(s)"),
])
def test_a_bad_parallel_exits_2_naming_the_value(value: str, said: str,
                                                 tmp_path: Path) -> None:
    result = _cli("--parallel", value, "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "autotune.json").exists()


def test_jobs_of_ranks_count_their_devices_against_the_machine(tmp_path: Path) -> None:
    result = _cli("--parallel", "2", "--nproc-per-node", str(CORES), "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert (f"a job of --nproc-per-node {CORES} takes {CORES} devices, so 2 jobs need "
            f"{2 * CORES}") in result.output


@pytest.mark.parametrize("value", [0, -1, 2.0, "two", CORES + 1])
def test_the_library_refuses_a_bad_parallel_before_anything_runs(value: object) -> None:
    with pytest.raises(ConfigError, match=r"parallel"):
        autotune.search(TINY, target_batch=2, device="cpu", parallel=value)


def test_cpu_slots_take_disjoint_cores_and_their_share_of_compile_threads() -> None:
    slots = plan_slots("cpu", 2, cores=[0, 1, 2, 3])
    assert [dict(s.env)["AUTOTUNE_SLOT_CORES"] for s in slots] == ["0,1", "2,3"]
    assert [s.label for s in slots] == ["cpu 0-1", "cpu 2-3"]
    assert {dict(s.env)["TORCHINDUCTOR_COMPILE_THREADS"] for s in slots} == {"2"}
    cuda = plan_slots("cuda", 2, ranks=2, uuids=["GPU-a", "GPU-b", "GPU-c", "GPU-d"])
    assert [dict(s.env)["CUDA_VISIBLE_DEVICES"] for s in cuda] == ["GPU-a,GPU-b", "GPU-c,GPU-d"]
    assert {dict(s.env)["CUDA_DEVICE_ORDER"] for s in cuda} == {"PCI_BUS_ID"}


# slow: the everyday run keeps a real two-slot search, each run on its slot, and
# every slot's environment
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_real_child_runs_pinned_to_its_slot() -> None:
    cores = sorted(os.sched_getaffinity(0))
    slot = plan_slots("cpu", len(cores), cores=cores)[-1]  # one core: the last
    run = run_in_child("tests.child_slot", {}, timeout_s=120, extra_env=dict(slot.env))
    assert run.status == "ok", run.message
    assert run.data is not None
    assert run.data["cores"] == [cores[-1]] and run.data["threads"] == 1
    assert run.data["OMP_NUM_THREADS"] == "1"
    assert run.data["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    gpu = plan_slots("cuda", 1, uuids=["GPU-0000-test"])[0]
    run = run_in_child("tests.child_slot", {}, timeout_s=120, extra_env=dict(gpu.env))
    assert run.status == "ok", run.message
    assert run.data is not None
    assert (run.data["CUDA_VISIBLE_DEVICES"], run.data["CUDA_DEVICE_ORDER"]) == (
        "GPU-0000-test", "PCI_BUS_ID")
    assert run.data["cores"] == cores  # no slot of cores: its affinity left alone


def _slots(run: Callable[[TrialSpec], TrialResult], width: int = 2) -> ThreadSlots:
    """Real threads on scripted children, each slot a core label."""
    return ThreadSlots([Slot(i, f"cpu {i}") for i in range(width)],
                       lambda spec, slot, on_start: run(spec))


def _search(device: KnobDevice, width: int, said: list[str] | None = None) -> SearchOutcome:
    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if said is not None:
            said.append(f"{stage} {candidate.key()}" + (" ended" if record else ""))

    return run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device,
                      slots=_slots(device, width) if width > 1 else None, on_trial=on_trial)


def _ran(outcome: SearchOutcome) -> list[tuple[str, str]]:
    """The runs that timed a candidate (a memory probe's runs apart: the baseline's runs
    ahead with several slots, ``probe.probe_ahead``)."""
    return sorted((r.kind, f"{r.knobs.label()}/{r.micro_batch}") for r in outcome.runs
                  if r.kind != "probe")


def _probed(outcome: SearchOutcome, label: str) -> list[int]:
    """The micro-batches of ``label``'s memory probes that ran, in the order they began."""
    return [r.micro_batch for r in sorted(outcome.runs, key=lambda r: r.start_s or 0.0)
            if r.kind == "probe" and r.knobs.label() == label]


def test_a_search_on_two_slots_times_the_same_candidates_and_picks_the_same() -> None:
    speeds = by_class(100, 150, 160, 200, 300, 330)
    said: list[str] = []
    one, two = _search(KnobDevice(speeds), 1), _search(KnobDevice(speeds), 2, said)
    assert _ran(two) == _ran(one)
    assert pick_winner_record(two) == pick_winner_record(one)
    # The baseline fits 32: one slot tries 64 (timed: it fails), then measures 1 and 8 and
    # times 32, three rounds; two slots run 64 (timed) and 32 at once, then time 32, two
    # (``probe_ahead``).
    assert _probed(one, "fp32/off") == [1, 8] and _probed(two, "fp32/off") == [32]
    ahead = [r for r in two.runs if r.knobs.label() == "fp32/off" and r.micro_batch in (32, 64)
             and r.kind in ("probe", "trial")][:2]
    assert {r.slot for r in ahead} == {"cpu 0", "cpu 1"}
    assert {r.slot for r in one.runs} == {""}  # one at a time: no slot said
    assert {r.node for r in one.runs} == {r.node for r in two.runs} == {""}  # one node
    # A batch ran on both; a run outside one, on the first (pinned as the batch's are).
    assert {r.slot for r in two.runs} == {"cpu 0", "cpu 1"}
    assert two.cost.parallel == 2 and two.cost.device_s == pytest.approx(two.cost.child_s)
    # Each run's progress, as it begins and as it ends, says its slot.
    assert said and all(" [cpu " in line for line in said)
    assert any(line.startswith("joint [cpu 1] ") for line in said)


def test_with_four_slots_the_baseline_s_probe_runs_its_largest_micro_batches_at_once(
        ) -> None:
    # Issue 60: the baseline's memory probe is a chain of runs, each decided on the one
    # before, while every other slot waits. With four slots its four largest micro-batches
    # run at once (the largest timed, as a probe's first run is), and the probe goes on
    # below them as one slot would (fp32 eager fits 4 here: 8-64 all run out of memory).
    def device() -> KnobDevice:
        return KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                          peaks={"fp32/off": lambda m: 100 + 200 * m})

    said: list[str] = []
    one, four = _search(device(), 1), _search(device(), 4, said)
    first = sorted(four.runs, key=lambda r: r.start_s or 0.0)[:4]
    assert [(r.knobs.label(), r.micro_batch, r.kind) for r in first] == [
        ("fp32/off", 64, "trial"), ("fp32/off", 32, "probe"), ("fp32/off", 16, "probe"),
        ("fp32/off", 8, "probe")]
    assert len({r.slot for r in first}) == 4  # on four slots at once
    assert all(r.status == "oom" for r in first)
    # each memory probe said as it ended, as one slot's probe says its steps
    assert {line for line in said if line.startswith("probe") and "fp32/off/" in line} >= {
        f"probe [cpu {i}] fp32/off/{m}" for i, m in ((1, 32), (2, 16), (3, 8))}
    assert one.baseline == four.baseline and four.baseline is not None
    assert four.baseline.micro_batch == 4
    picks = [pick_winner_record(o) for o in (one, four)]
    assert len({(p.knobs, p.micro_batch) for p in picks if p is not None}) == 1
    # One slot: 64 timed, then 1 and 8 measured, then 4 timed (the line through 1's and
    # 8's peaks puts it under the budget): four rounds. Four slots: the round of four, then
    # 1 (nothing fit yet: is anything feasible?), then 4 timed: three.
    assert _probed(one, "fp32/off") == [1, 8]
    assert _probed(four, "fp32/off") == [32, 16, 8, 1]


class _Together(KnobDevice):
    """Each run of compiled fp32 says its micro-batch as it begins. With ``hold``, the run at
    16 waits until the run at 1 has begun (``met``: it had, 10 s at most): one slot's
    runs, one after another, never meet."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        if spec.knobs.label() == "fp32/default":
            state = self.__dict__.setdefault("state", {"began": [], "met": None,
                                                       "one": threading.Event()})
            state["began"].append(spec.micro_batch)
            if spec.micro_batch == 1:
                state["one"].set()
            elif spec.micro_batch == 16 and self.__dict__.get("hold"):
                state["met"] = state["one"].wait(timeout=10.0)
        return super().__call__(spec)


def test_with_slots_a_class_out_of_memory_at_its_hint_runs_its_descent_at_once() -> None:
    # Issue 60: compiled fp32 needs 3 GiB whatever the micro-batch (over the 1000 MiB budget
    # everywhere). One slot descends from its hint one run at a time: 32, 16, then 1 (is
    # anything feasible?). With four slots 16 and 1 run at once, as one would make them
    # were 16 to fail (1 begins while 16 still runs): the same runs in two rounds, what one
    # finds (nothing fits), the same pick.
    def device() -> _Together:
        return _Together(by_class(100, 150, 160, 200, 300, 330),
                         peaks={"fp32/default": lambda m: 3000 + m})

    one, four = device(), device()
    four.__dict__["hold"] = True
    alone, fanned = _search(one, 1), _search(four, 4)
    assert one.state["began"] == [32, 16, 1]
    assert four.state["began"][0] == 32 and sorted(four.state["began"][1:]) == [1, 16]
    assert four.state["met"] is True, four.state
    assert {p.knobs.label(): p.max_micro_batch for p in fanned.probes} == {
        p.knobs.label(): p.max_micro_batch for p in alone.probes}
    picks = [pick_winner_record(o) for o in (alone, fanned)]
    assert None not in picks and len({(p.knobs, p.micro_batch) for p in picks}) == 1


class _Slow(KnobDevice):
    """Runs of some settings take a while, in real time (the others end first)."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        if spec.knobs.optimizer_impl == "foreach":
            time.sleep(0.3)
        return super().__call__(spec)


def test_a_run_behind_a_result_told_while_it_ran_is_kept_as_evidence() -> None:
    # The joint screen's batch runs at once: foreach's run starts with fused's and ends after
    # it, behind it. It is not stopped: it ends, and its result is kept and judged.
    outcome = _search(_Slow(by_class(100, 150, 160, 200, 300, 330)), 2)
    trials = [r for r in outcome.runs if r.kind == "trial"]
    fused, foreach = next(  # foreach began first, and ended after fused: on another slot
        (u, f) for u in trials for f in trials if u.knobs.optimizer_impl == "fused"
        and f.knobs == u.knobs.with_(optimizer_impl="foreach") and f.micro_batch == u.micro_batch
        and f.start_s <= u.start_s and f.number > u.number)
    assert foreach.slot != fused.slot and foreach.status == "ok"
    records = {(r.knobs, r.micro_batch): r for r in outcome.records}
    kept, ahead = records[foreach.knobs, foreach.micro_batch], records[
        fused.knobs, fused.micro_batch]
    assert kept.samples_per_s and ahead.samples_per_s
    assert kept.samples_per_s < ahead.samples_per_s and kept.verdict == "ok"


def test_with_two_slots_two_classes_probe_at_once_each_its_own_chain() -> None:
    # Issue 60: after the baseline, each class's memory probe is a chain of its own; with two
    # slots two classes' runs are in flight together, each class's next step decided when
    # its own run before has been told (``on_step``), not after the other class's probe.
    events: list[tuple[str, str, str]] = []  # (what, class, slot)

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if stage.startswith("probe [") and record is None:
            events.append(("began", candidate.knobs.label(), stage.split("[")[1][:-1]))

    def on_step(knobs, step) -> None:  # type: ignore[no-untyped-def]
        events.append(("told", knobs.label(), ""))

    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330))
    outcome = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device,
                         slots=_slots(device, 2), on_trial=on_trial, on_step=on_step)
    together = [(a, b) for a, b in pairwise(events)
                if a[0] == b[0] == "began" and a[1] != b[1] and a[2] != b[2]]
    assert together, events  # two classes began, on two slots, neither told in between
    # The class told first (either: the slots' threads race) begins its next run at once,
    # while the other's run is still in flight: the chains do not wait for each other.
    after = events[events.index(together[0][1]) + 1:]
    first_told = next(i for i, e in enumerate(after) if e[0] == "told")
    assert after[first_told + 1][:2] == ("began", after[first_told][1]), events
    assert after[first_told][1] in {together[0][0][1], together[0][1][1]}
    one_alone = _search(KnobDevice(by_class(100, 150, 160, 200, 300, 330)), 1)
    assert pick_winner_record(outcome) == pick_winner_record(one_alone)


class _SlowNoise(KnobDevice):
    """The baseline's second timed run of one micro-batch (the noise's re-measure) takes a
    while, in real time: the classes' first runs beside it end first."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        if spec.knobs == CLASSES[0] and spec.num_timed_steps > 0:
            timed = self.__dict__.setdefault("timed", [])
            if spec.micro_batch in timed:
                time.sleep(0.5)
            timed.append(spec.micro_batch)
        return super().__call__(spec)


def test_with_two_slots_no_class_goes_on_before_the_noise_is_told() -> None:
    # The noise's re-measure runs beside the next classes' first runs; every cut reads it, so
    # no class's next run is decided (begins) before it is told, though that class's first
    # run ended earlier.
    events: list[tuple[str, str]] = []

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if stage.startswith("probe ["):
            events.append(("ended" if record else "began", candidate.key()))

    device = _SlowNoise(by_class(100, 150, 160, 200, 300, 330))
    run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device, slots=_slots(device, 2),
               on_trial=on_trial)
    began_noise = next(i for i, (what, key) in enumerate(events) if what == "began"
                       and ("ended", key) in events[:i])  # the baseline's fit, timed again
    noise = events[began_noise][1]
    told = events.index(("ended", noise), began_noise)
    beside = [key for what, key in events[began_noise + 1:told] if what == "began"]
    ended = [key for what, key in events[began_noise + 1:told] if what == "ended"]
    assert ended, events  # classes' first runs began, and ended, beside it
    setting = {key: key.rsplit("/", 1)[0] for _, key in events}
    # One run per class beside it: a class's next run begins only once the noise is told.
    assert len({setting[key] for key in beside}) == len(beside), events
    after = {setting[key] for what, key in events[told:] if what == "began"}
    assert {setting[key] for key in ended} <= after, events


class _FailsOn(_SlowNoise):
    """The workload fails on one class (its factory, say, refuses bf16 eager)."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        if spec.knobs == Knobs(precision="bf16", compile_mode="off"):
            return TrialResult(status="workload_error", message="bf16 refused", wall_s=0.1)
        return super().__call__(spec)


def test_a_workload_error_in_one_class_probe_ends_the_search_once_the_others_are_recorded(
        ) -> None:
    # bf16 eager's probe fails beside the noise's re-measure (its chain goes on once the
    # noise is told); the next classes' first runs take its slot meanwhile: each ends and is
    # recorded, then the workload's error stops the search.
    events: list[tuple[str, str]] = []

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        events.append(("ended" if record else "began", candidate.key()))

    device = _FailsOn(by_class(100, 150, 160, 200, 300, 330))
    with pytest.raises(WorkloadError, match="bf16 refused"):
        run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device,
                   slots=_slots(device, 2), on_trial=on_trial)
    after = events[events.index(("began", "bf16/off/32")):]
    began = [key for what, key in after if what == "began"]
    assert {key.rsplit("/", 1)[0] for key in began} - {"bf16/off"}, events  # others beside
    assert all(("ended", key) in after for key in began), events  # each one recorded
    assert after[-1] == ("ended", "fp32/off/32"), events  # the noise told; then the error


def test_with_two_slots_an_eager_walk_down_times_its_next_micro_batch_beside_the_one_before(
        ) -> None:
    # Issue 60: the refine stage's walk down an eager setting (each micro-batch faster than
    # the one above) asks for one run after another; with two slots its next step is timed
    # beside the one before (``batch.walk_ahead``), and the walk decides on them as it would.
    events: list[tuple[str, str, str]] = []  # (began/ended, candidate, slot)

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if stage.startswith("refine"):
            events.append(("ended" if record else "began", candidate.key(),
                            stage.partition("[")[2][:-1]))

    def device() -> KnobDevice:  # fp32 eager: faster at each smaller micro-batch
        return KnobDevice(by_class(300, 150, 160, 200, 250, 260),
                          shapes={"fp32/off": lambda m: 1 + 0.2 * math.log2(32 / m)})

    dev = device()
    two = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=dev,
                     slots=_slots(dev, 2), on_trial=on_trial)
    first_end = next(i for i, e in enumerate(events) if e[0] == "ended")
    began = [e for e in events[:first_end] if e[0] == "began"]
    assert [key for _, key, _ in began] == ["fp32/off/16", "fp32/off/8"], events
    assert began[0][2] != began[1][2], events  # on two slots at once
    one = _search(device(), 1)
    assert _ran(two) == _ran(one)  # the walk went as far: no other timing made
    assert pick_winner_record(two) == pick_winner_record(one)


@dataclass
class _HeldFirst(KnobDevice):
    """The joint screen's first run (checkpointed, foreach) ends only once ``released`` is
    set (at most 10 s later): what begins meanwhile begins while it still runs."""

    released: threading.Event = field(default_factory=threading.Event)
    held: list[str] = field(default_factory=list)

    def __call__(self, spec: TrialSpec) -> TrialResult:
        if spec.knobs.optimizer_impl == "foreach" and spec.knobs.checkpointing == "alternate" \
                and not self.held:  # the first such run only: the others run as they come
            self.held.append(f"{spec.knobs.label()}/{spec.micro_batch}")
            self.released.wait(10)
        return super().__call__(spec)


def test_with_two_slots_the_joint_screen_proposes_again_as_each_result_is_told(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 60: the joint screen's batches, asynchronous: with two slots, once a run of the
    # first batch is told the evidence proposes again, and a run it adds (one divisor down)
    # begins on the free slot while the first batch's slow run still runs; it does not
    # wait for the whole batch.
    from autotune.search.stages import joint

    batches: list[list[str]] = []
    real = joint.proposals

    def spy(ex):  # type: ignore[no-untyped-def]
        found = real(ex)
        batches.append([p.candidate.key() for p in found])
        return found

    monkeypatch.setattr(joint, "proposals", spy)
    events: list[tuple[str, str]] = []

    def fused(knobs: Knobs, m: int) -> float:  # (ties at 32, 1.15x one divisor down)
        return 1.0 if knobs.optimizer_impl != "fused" else 1.15 if m <= 16 else 1 / 1.1

    def device(kind: type[KnobDevice] = KnobDevice) -> KnobDevice:
        return kind(by_class(100, 150, 160, 200, 300, 330), factor=fused,
                    extra_mib=lambda k, m: 100.0 if k.optimizer_impl == "fused" else 0.0,
                    impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 1.0,
                                "fused": 1.1})

    dev = device(_HeldFirst)
    assert isinstance(dev, _HeldFirst)

    def on_trial(count, stage, candidate, record) -> None:  # type: ignore[no-untyped-def]
        if stage.startswith("joint"):
            events.append(("ended" if record else "began", candidate.key()))
            if record is None and candidate.key() not in batches[0]:
                dev.released.set()  # a later batch's run began: the held one may end

    two = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=dev,
                     slots=_slots(dev, 2), on_trial=on_trial)
    first = batches[0]
    slow = events[0][1]
    assert slow in first and "ckpt=alternate+opt=foreach" in slow, events
    during = events[1:events.index(("ended", slow))]
    assert any(what == "began" and key not in first for what, key in during), (events, first)
    monkeypatch.setattr(joint, "proposals", real)
    picks = [pick_winner_record(o) for o in (two, _search(device(), 1))]
    assert len({(p.knobs, p.micro_batch) for p in picks if p is not None}) == 1, picks


def test_a_crash_in_one_slot_loses_no_other_slots_result() -> None:
    ended: list[str] = []
    release = threading.Event()

    def run(spec: TrialSpec, slot: Slot, on_start: Callable[[Child], None]) -> TrialResult:
        if spec.micro_batch == 1:  # the runner itself fails while the other still runs
            raise RuntimeError("the slot's child could not be watched")
        release.wait(5)
        return TrialResult(status="ok", wall_s=1.0)

    specs = [replace(_spec(), micro_batch=m) for m in (1, 2)]

    def start(spec: TrialSpec) -> Begun[TrialSpec]:
        return Begun(spec)

    def end(spec: TrialSpec, token: object, done: Done) -> str:
        release.set()
        if done.error is not None:
            raise done.error
        ended.append(f"{spec.micro_batch}: {done.result.status}")  # type: ignore[union-attr]
        return "kept"

    slots = ThreadSlots([Slot(0, "cpu 0"), Slot(1, "cpu 1")], run)
    got = []
    with pytest.raises(RuntimeError, match="could not be watched"):
        for item, value in dispatch(slots, specs, start, end):
            got.append((item.micro_batch, value))
    assert ended == ["2: ok"] and got == [(2, "kept")]


def _spec() -> TrialSpec:
    from autotune.memory import probe_spec

    p = plan()
    return probe_spec(p.workload, "cpu", CLASSES[0], 1, p.budget_bytes, 60.0)


def test_ctrl_c_kills_the_running_children_and_records_none_as_a_result() -> None:
    killed = threading.Event()

    class _Killable(Child):
        pid = 0

        def kill(self) -> None:
            killed.set()

    def run(spec: TrialSpec, slot: Slot, on_start: Callable[[Child], None]) -> TrialResult:
        on_start(_Killable())
        killed.wait(5)  # a child runs until it is killed
        return TrialResult(status="crash", message="child killed by SIGKILL", wall_s=1.0)

    seen: list[Done] = []

    def start(spec: TrialSpec) -> Begun[TrialSpec]:
        if spec.micro_batch == 2:  # Ctrl-C while the first one runs
            raise KeyboardInterrupt
        return Begun(spec)

    def end(spec: TrialSpec, token: object, done: Done) -> None:
        seen.append(done)
        if done.error is not None:
            raise done.error

    specs = [replace(_spec(), micro_batch=m) for m in (1, 2)]
    slots = ThreadSlots([Slot(0, "cpu 0"), Slot(1, "cpu 1")], run)
    with pytest.raises(KeyboardInterrupt):
        list(dispatch(slots, specs, start, end))
    assert killed.is_set()  # not left to run out its timeout
    # The killed run's crash says nothing of its candidate: it ends as interrupted.
    assert [(d.result, type(d.error)) for d in seen] == [(None, KeyboardInterrupt)]


@pytest.mark.subprocess
def test_a_real_parallel_search_pins_every_child_and_says_its_cost(tmp_path: Path) -> None:
    if CORES < 2:
        pytest.skip("needs 2 cores")
    tuned = autotune.search(TINY, target_batch=4, device="cpu", parallel=2,
                            precisions=["fp32"], compile_modes=["off"], out=tmp_path,
                            settings=autotune.search.SearchSettings(cache=False,
                                                                    num_timed_steps=3))
    runs = tuned.config.runs
    cores = sorted(os.sched_getaffinity(0))
    labels = {f"cpu {cores[0]}", f"cpu {cores[1]}"}
    assert runs and {r.slot for r in runs} <= labels and f"cpu {cores[0]}" in {
        r.slot for r in runs}  # every run pinned: one made alone on the first slot
    cost = tuned.config.cost
    assert cost is not None and cost.parallel == 2 and cost.wall_s and cost.device_s
    assert "on 2 slots at once" in cost.describe()


def test_a_parallel_search_from_a_later_cuda_device_is_refused_with_the_way_to_choose() -> None:
    from autotune.api import TuneRequest
    from autotune.names import FLAGS
    from tests.scripted import GPU

    request = TuneRequest(target_batch=8, parallel=2)
    later = replace(GPU, device="cuda:3")
    said = request._parallel_problems(later, 8, FLAGS)
    assert said == ["--device cuda:3 with --parallel 2: a parallel search runs on the first 2 "
                    "visible devices, not from cuda:3; choose them with CUDA_VISIBLE_DEVICES "
                    "(e.g. CUDA_VISIBLE_DEVICES=3,4) and --device cuda"]
    assert request._parallel_problems(GPU, 8, FLAGS) == []
    assert "is more than this machine runs at once: 1 CUDA device(s)" in \
        request._parallel_problems(GPU, 1, FLAGS)[0]


def test_cpu_slots_share_the_memory_the_default_budget_split_and_a_larger_one_refused(
        tmp_path: Path) -> None:
    from autotune.api import TuneRequest, env
    from autotune.config import WorkloadSpec

    info = env("cpu")
    spec = WorkloadSpec(kind="file", target=TINY)
    _, one, *_ = TuneRequest(workload=spec, target_batch=2, device="cpu").validate(info)
    _, two, *_ = TuneRequest(workload=spec, target_batch=2, device="cpu",
                             parallel=2).validate(info)
    assert two.budget_bytes == min(one.budget_bytes, info.available_memory_bytes // 2)
    assert "split between 2 children at once (parallel=2)" in two.note
    result = _cli("--parallel", "2", "--memory-budget", "95%", "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "2 children at once on the CPU share its memory" in " ".join(result.output.split())


class _Seconds(KnobDevice):
    """``_stalled_pair``'s device whose second run of fused (a first re-measure of the confirm
    stage: far under what the other runs predict of it) waits until channels_last's second run
    has begun (``met``: it had, 10 s at most)."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        state = self.__dict__.setdefault("state", {"calls": {}, "met": None,
                                                   "second": threading.Event()})
        label = f"{spec.knobs.label()}/{spec.micro_batch}"
        n = state["calls"][label] = state["calls"].get(label, 0) + 1
        if n == 2 and label == "bf16/max-autotune+format=channels_last/32":
            state["second"].set()
        elif n == 2 and label == "bf16/max-autotune+opt=fused/32":
            state["met"] = state["second"].wait(timeout=10.0)
        return super().__call__(spec)


def test_with_two_slots_the_first_re_measures_of_the_confirm_stage_run_at_once() -> None:
    # Two single runs far under what the others predict of them are timed again before the
    # joint screen proposes once more: they are no finalists (those are chosen after), so
    # with two slots they run side by side; the finalists' re-measures after them run alone.
    from tests.test_search_generalises import _stalled_pair

    device = _stalled_pair(_Seconds)
    outcome = _search(device, 2)
    assert device.state["met"] is True, device.state
    picks = [pick_winner_record(o) for o in (outcome, _search(_stalled_pair(KnobDevice), 1))]
    assert len({(p.knobs, p.micro_batch) for p in picks}) == 1, picks
