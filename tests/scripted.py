"""Scripted devices for the search's tests: each run answered from a script of figures chosen
to force a decision (memory linear in the micro-batch, throughput per class), so the stages'
tests (``test_stage_*.py``) and the store's check what the search decides without a child.
Every spec the search asks for is still checked for what a real child would need (the budget
cap, timed steps, warm-up accumulation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from autotune.config import (
    DeviceInfo,
    Knobs,
    ProbeReport,
    TrialResult,
    TrialSpec,
    WorkloadSpec,
    WorkloadTraits,
)
from autotune.search import SearchSettings, run_search
from autotune.search.pick import pick_winner
from autotune.search.slots import Done, Slot, Slots
from autotune.timing import stop_reason
from autotune.units import MIB

GPU = DeviceInfo(device="cuda:0", name="scripted GPU", total_memory_bytes=2000 * MIB,
                 available_memory_bytes=2000 * MIB, supports_bf16=True, supports_fp16=False,
                 supports_tf32=False, native_bf16=True)


BUDGET = 1000 * MIB  # usable 900 MiB: micro-batch 32 fits (740 MiB), 64 does not (1380 MiB)


SETTINGS = SearchSettings(num_timed_steps=5, cache=False)
"""Studies in memory (the local store's SQLite costs seconds a search; test_store.py tests it)."""


MODES = ("off", "default", "max-autotune")


CLASSES = [Knobs(precision=p, compile_mode=m)  # type: ignore[arg-type]
           for p in ("fp32", "bf16") for m in MODES]


def by_class(fp32_off: float, fp32_default: float, fp32_max: float, bf16_off: float,
             bf16_default: float, bf16_max: float) -> dict[str, float]:
    """Samples/s of each class at micro-batch 32."""
    values = (fp32_off, fp32_default, fp32_max, bf16_off, bf16_default, bf16_max)
    return {c.label(): v for c, v in zip(CLASSES, values, strict=True)}


@dataclass
class ScriptedDevice:
    """A device whose memory and speed are known: each run is answered from the script."""

    speed: dict[str, float]
    """Samples/s at micro-batch 32, per class label."""
    shape: Callable[[int], float] = lambda m: 1 - 0.1 * math.log2(32 / m)
    """Throughput at micro-batch m relative to 32 (default: 10% slower per halving)."""
    shapes: dict[str, Callable[[int], float]] = field(default_factory=dict)
    """A class's own ``shape``, by label (others follow ``shape``)."""
    peak_mib: Callable[[int], float] = lambda m: 100 + 20 * m
    """Peak at micro-batch m, any class (default: linear; 32 fits the budget, 64 does not)."""
    peaks: dict[str, Callable[[int], float]] = field(default_factory=dict)
    """A class's own ``peak_mib``, by label (others follow ``peak_mib``)."""
    retries_at: int | None = None
    """Micro-batch whose runs report CUDA allocator retries (memory pressure)."""
    jitter: tuple[float, ...] = (0.0,)
    """Relative noise of successive timed steps (cycled): 0 is a perfectly quiet device."""
    update_share: float = 0.1
    """The optimizer update's share of a step (what an optimizer implementation can save)."""
    between_runs: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Per ``label/micro_batch``, each timed run's step-time factor in turn (1.8: a run that
    stalled 1.8x slower; past the tuple's end, 1.0): the noise between runs of one config."""
    timed_runs_of: dict[str, int] = field(default_factory=dict)
    oom_peak: bool = False
    """An out-of-memory run reports the peak it needed (as the replay's recorded tables keep
    it; a live run reports what it had reached when the allocation failed); else none."""
    specs: list[TrialSpec] = field(default_factory=list)
    timed_steps: list[int] = field(default_factory=list)
    """Timed steps of each run that fitted, in order."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        self.specs.append(spec)
        assert spec.memory_budget_bytes == BUDGET  # every run is capped
        # 2 micro-batches: gradients alive during a forward (more would only cost time)
        assert spec.warmup_micro_batches() == 2
        assert spec.num_timed_steps in (0, SETTINGS.num_timed_steps, SLOW.num_timed_steps)
        peak = int(self.peaks.get(spec.knobs.label(), self.peak_mib)(spec.micro_batch) * MIB)
        info = {"samples_per_step": spec.micro_batch * spec.accumulate_steps, "wall_s": 1.0}
        if peak > BUDGET:
            return TrialResult(status="oom", message="CUDA out of memory",
                               peak_bytes=peak if self.oom_peak else None, **info)
        shape = self.shapes.get(spec.knobs.label(), self.shape)
        sps = self.speed[spec.knobs.label()] * shape(spec.micro_batch)
        step_s = info["samples_per_step"] / sps
        step_s *= self.between_run_factor(spec)
        times: list[float] = []
        why = None
        while spec.num_timed_steps and why is None:  # the child's own rule (trial._train)
            times.append(step_s * (1 + self.jitter[len(times) % len(self.jitter)]))
            why = stop_reason(times, max_steps=spec.num_timed_steps, elapsed_s=sum(times),
                              min_elapsed_s=spec.min_timed_s, max_elapsed_s=spec.max_timed_s,
                              precision=spec.timing_precision,
                              stop_above_s=spec.stop_above_step_s)
        self.timed_steps.append(len(times))
        return TrialResult(status="ok", peak_bytes=peak, step_times_s=tuple(times),
                           timing_stop=why or "",
                           update_times_s=tuple(self.update_share * t for t in times),
                           first_loss=2.0, reference_loss=2.0,
                           num_graphs=None if spec.compile_mode == "off" else 1,
                           num_graph_breaks=None if spec.compile_mode == "off" else 0,
                           num_alloc_retries=3 if spec.micro_batch == self.retries_at else 0,
                           **info)

    def between_run_factor(self, spec: TrialSpec) -> float:
        """The step-time factor of this timed run of its config (``between_runs``)."""
        if not spec.num_timed_steps:
            return 1.0
        key = f"{spec.knobs.label()}/{spec.micro_batch}"
        nth = self.timed_runs_of[key] = self.timed_runs_of.get(key, 0) + 1
        factors = self.between_runs.get(key, ())
        return factors[nth - 1] if nth <= len(factors) else 1.0

    def runs(self) -> list[str]:
        """Each run as class/micro-batch, with ``(probe)`` when it timed nothing."""
        return [f"{s.precision}/{s.compile_mode}/{s.micro_batch}"
                + ("" if s.num_timed_steps else " (probe)") for s in self.specs]


def plan() -> ProbeReport:
    return ProbeReport(workload=WorkloadSpec(), device=GPU, target_batch=64, world_size=1,
                       headroom=0.1, budget_bytes=BUDGET, probes=())


def search(device: ScriptedDevice, settings: SearchSettings = SETTINGS):
    outcome = run_search(plan(), CLASSES, settings, run=device)
    records = {f"{r.precision}/{r.compile_mode}/{r.micro_batch}": r for r in outcome.records}
    return outcome, records


SLOW = SearchSettings(num_timed_steps=10, min_timed_s=0.0, cache=False)
"""Slow steps (no minimum window to fill): the spread alone decides how long a run times."""


@dataclass
class RerunDevice(ScriptedDevice):
    """A scripted device whose ``label/micro_batch`` in ``endings`` fits its first timed run
    and ends as given there (a status, or ``leak``) in every later one."""

    endings: dict[str, str] = field(default_factory=dict)
    timed_runs: dict[str, int] = field(default_factory=dict)
    from_run: int = 2
    """The first timed run of a candidate that ends as ``endings`` says."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        result = super().__call__(spec)
        key = f"{spec.knobs.label()}/{spec.micro_batch}"
        if not spec.num_timed_steps or not result.ok:
            return result
        self.timed_runs[key] = self.timed_runs.get(key, 0) + 1
        ending = self.endings.get(key) if self.timed_runs[key] >= self.from_run else None
        if ending == "leak":  # every step keeps 8 MiB more alive, as a kept loss would
            steps = 2 + len(result.step_times_s)
            return replace(result, step_memory_bytes=tuple(
                (400 + 8 * i) * MIB for i in range(steps)))
        if ending is not None:
            message = "CUDA out of memory" if ending == "oom" else "killed by SIGKILL"
            return TrialResult(status=ending, message=message, wall_s=1.0,  # type: ignore[arg-type]
                               samples_per_step=result.samples_per_step)
        return result


VALUES = {"checkpointing": ("off", "blocks", "alternate"),
          "optimizer_impl": ("default", "for-loop", "foreach", "fused"),
          "memory_format": ("contiguous", "channels_last")}


TRAITS = WorkloadTraits(num_blocks=4, blocks="4 x Block", optimizer="AdamW",
                        optimizer_impls=("for-loop", "foreach", "fused"),
                        optimizer_default="for-loop")


@dataclass
class KnobDevice(ScriptedDevice):
    """A scripted device on which checkpointing frees memory and costs speed."""

    ckpt_memory: dict[str, float] = field(default_factory=lambda: {
        "off": 1.0, "alternate": 0.6, "blocks": 0.3})
    """Share of the per-sample memory each checkpointing setting keeps."""
    ckpt_speed: dict[str, float] = field(default_factory=lambda: {
        "off": 1.0, "alternate": 0.9, "blocks": 0.8})
    impl_speed: dict[str, float] = field(default_factory=lambda: {
        "default": 1.0, "for-loop": 1.0, "foreach": 1.04, "fused": 1.1})
    impl_saves_mib: dict[str, float] = field(default_factory=dict)
    """Memory an optimizer implementation saves at any micro-batch (its temporaries)."""
    format_speed: float = 1.0
    format_saves_mib: float = 0.0
    """channels_last's speed factor and the memory it saves at any micro-batch."""
    pair_speed: dict[tuple[str, str], float] = field(default_factory=dict)
    """A further speed factor of an (optimizer implementation, memory format) pair."""
    traits: WorkloadTraits = TRAITS
    factor: Callable[[Knobs, int], float] = lambda knobs, m: 1.0
    """A further speed factor of any setting at a micro-batch (knobs that interact)."""
    extra_mib: Callable[[Knobs, int], float] = lambda knobs, m: 0.0
    """Memory a setting needs beyond the script at a micro-batch (an optimizer's state)."""
    update_of: Callable[[Knobs], float] = lambda knobs: 0.1
    """The optimizer update's share of a setting's step."""

    def __call__(self, spec: TrialSpec) -> TrialResult:
        base = spec.knobs.with_(checkpointing="off", optimizer_impl="default",
                                memory_format="contiguous")
        keep = self.ckpt_memory[spec.knobs.checkpointing]
        channels_last = spec.knobs.memory_format == "channels_last"
        scaled = replace(spec, knobs=base)
        result = ScriptedDevice(
            speed={base.label(): self.speed[base.label()]
                   * self.ckpt_speed[spec.knobs.checkpointing]
                   * self.impl_speed[spec.knobs.optimizer_impl]
                   * (self.format_speed if channels_last else 1.0)
                   * self.pair_speed.get((spec.knobs.optimizer_impl,
                                          spec.knobs.memory_format), 1.0)
                   * self.factor(spec.knobs, spec.micro_batch)
                   / self.between_run_factor(spec)},
            shape=self.shape, peak_mib=lambda m: 100 + (self.peaks.get(
                base.label(), self.peak_mib)(m) - 100) * keep
            - self.impl_saves_mib.get(spec.knobs.optimizer_impl, 0.0)
            - (self.format_saves_mib if channels_last else 0.0)
            + self.extra_mib(spec.knobs, m),
            retries_at=self.retries_at, update_share=self.update_of(spec.knobs),
            oom_peak=self.oom_peak)(scaled)
        self.specs.append(spec)
        return replace(result, traits=self.traits)


def knob_search(device: KnobDevice):
    outcome = run_search(plan(), CLASSES, SETTINGS, values=VALUES, run=device)
    return outcome, {f"{r.knobs.label()}/{r.micro_batch}": r for r in outcome.records}


CONV = replace(TRAITS, has_conv2d=True, image_input=True)


CPU = replace(GPU, device="cpu", name="scripted CPU")


@dataclass
class CompileCacheDevice:
    """A scripted device behind inductor's on-disk cache, as a CPU sees it: a compiled run
    whose graphs (``Knobs.graph()`` at its micro-batch) are not in the cache compiles them and
    peaks ``compile_mib`` higher, then caches them (unless it ran out of memory, or ran with
    ``cold_compile``: a cache of its own, thrown away); a later run of those graphs loads
    them."""

    inner: Callable[[TrialSpec], TrialResult]
    compile_mib: float
    cached: set[tuple[Knobs, int]] = field(default_factory=set)
    specs: list[TrialSpec] = field(default_factory=list)

    def __call__(self, spec: TrialSpec) -> TrialResult:
        self.specs.append(spec)
        result = self.inner(spec)
        if spec.compile_mode == "off":
            return result
        graph = (spec.knobs.graph(), spec.micro_batch)
        if graph in self.cached and not spec.cold_compile:
            return replace(result, compile_cache_hits=2, compile_cache_misses=0)
        if result.ok and result.peak_bytes is not None:
            peak = result.peak_bytes + int(self.compile_mib * MIB)
            result = replace(result, peak_bytes=peak) if peak <= BUDGET else TrialResult(
                status="oom", message="out of memory while compiling", wall_s=1.0,
                samples_per_step=result.samples_per_step)
        if result.ok and not spec.cold_compile:
            self.cached.add(graph)
        return replace(result, compile_cache_hits=0, compile_cache_misses=2)

    def cold_runs(self) -> list[str]:
        return [f"{s.knobs.label()}/{s.micro_batch}" + ("" if s.num_timed_steps else " (probe)")
                for s in self.specs if s.cold_compile]


def cpu_search(device: Callable[[TrialSpec], TrialResult], *, values=None,
               report: ProbeReport | None = None):
    report = report or replace(plan(), device=CPU)
    outcome = run_search(report, CLASSES, SETTINGS, values=values, run=device)
    return outcome, {f"{r.knobs.label()}/{r.micro_batch}": r for r in outcome.records}


def pick_winner_record(outcome):
    return pick_winner(outcome.records, SETTINGS)


@dataclass
class ClockedDevice:
    """A scripted device on a simulated clock (``run_search(clock=device.clock)``): each run
    takes ``start_s`` plus its compile (``compile_s`` where its graphs were compiled from
    nothing, ``loaded_s`` where they loaded from the cache) plus its timed steps; one past its
    spec's timeout is killed there, as the runner kills a child."""

    inner: Callable[[TrialSpec], TrialResult]
    compile_s: float = 30.0
    loaded_s: float = 2.0
    start_s: float = 5.0
    now_s: float = 0.0

    def clock(self) -> float:
        return self.now_s

    def __call__(self, spec: TrialSpec) -> TrialResult:
        result = self.inner(spec)
        compiled = spec.compile_mode != "off"
        compile_s = (self.compile_s if result.compile_cache_misses else self.loaded_s) \
            if compiled else 0.0
        wall = self.start_s + compile_s + sum(result.step_times_s)
        if wall > spec.timeout_s:
            self.now_s += spec.timeout_s
            return TrialResult(status="timeout", message=f"no result after {spec.timeout_s} s",
                               wall_s=spec.timeout_s, samples_per_step=result.samples_per_step)
        self.now_s += wall
        return replace(result, wall_s=wall,
                       compile_s=compile_s if compiled and result.ok else None)


class OrderedSlots(Slots):
    """``width`` slots on a clock of their own, so that which run ends first is scripted, not
    a thread's luck: a run submitted at t is answered by ``device`` at once and ends at t +
    ``wall(spec)``; ``wait`` gives the earliest end (the replay's ``SimSlots`` without its
    table)."""

    def __init__(self, device: Callable[[TrialSpec], TrialResult], width: int,
                 wall: Callable[[TrialSpec], float]) -> None:
        self.device, self.width, self.wall, self.alone = device, width, wall, "slot 0"
        self.now_s = 0.0
        self._free = [Slot(i, f"slot {i}") for i in range(width)]
        self._ends: list[tuple[float, int, int, Slot, TrialResult]] = []
        self._seq = 0

    def run_alone(self, spec: TrialSpec) -> TrialResult:
        self.now_s += self.wall(spec)
        return self.device(spec)

    def submit(self, ticket: int, spec: TrialSpec) -> Slot:
        slot = self._free.pop(0)
        self._seq += 1
        heapq.heappush(self._ends, (self.now_s + self.wall(spec), self._seq, ticket, slot,
                                    self.device(spec)))
        return slot

    def wait(self) -> Done:
        end, _, ticket, slot, result = heapq.heappop(self._ends)
        self.now_s = max(self.now_s, end)
        self._free.append(slot)
        self._free.sort(key=lambda s: s.index)
        return Done(ticket, slot, result)
