"""``autotune.json``'s types: the tuned config, versioned, with every trial. No torch import
here.

The file is complete enough to reproduce the winner and to check it later: knobs, memory facts,
measured throughput and the baseline's, device and versions, workload fingerprint, and each
trial with its outcome and why it lost (DESIGN.md section 7).

A field's range or pattern is in its type, never only in a rule: ``autotune.tuned_file`` reads
a file against these types (``read_tuned``) and prints the JSON Schema of them that
``autotune schema`` shows (``json_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import Field

from autotune.config import DeviceInfo, ProbeReport, StopReason, TrialStatus, WorkloadSpec
from autotune.knobs import HasKnobs, Knobs
from autotune.schema_study import SearchCost, StudyRecord
from autotune.schema_types import Batch, Count, Float, Positive
from autotune.serialize import STRICT_FIELDS, Text
from autotune.skip_sentences import Context, render

SCHEMA_VERSION: Final = 3
"""3: what the search did not run is typed (``skips``: each with its rule id, what it is about
and its figures) instead of sentences (``skipped``); schema 2 files are read with each sentence
a ``note`` (``tuned_file._from_schema_2``). 2: precision and compile mode moved into ``knobs``
with the other knobs; schema 1 files are read by moving them there
(``tuned_file._from_schema_1``)."""

Verdict = Literal[
    "winner", "ok", "slower", "numerics", "over_budget", "oom", "compile_error", "non_finite",
    "timeout", "crash", "error", "workload_error", "unsupported",
]
RunnerUp = Literal["", "behind", "behind-once", "within-noise", "rounds"]
"""How the winner stands against the runner-up (``TunedConfig.runner_up``)."""


@dataclass(frozen=True, kw_only=True)
class TrialRecord(HasKnobs):
    """One measured candidate and what became of it."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    number: Count
    micro_batch: Batch
    accumulate_steps: Batch
    knobs: Knobs
    """Precision, compile mode and every other knob of the candidate."""
    verdict: Verdict
    """``winner``; ``ok`` (ran, lost by a little); ``slower`` (stopped early: clearly slower);
    ``numerics`` (loss far from fp32 eager); ``over_budget`` (ran, but its peak is over the
    budget minus headroom: a memory probe's miss); ``unsupported`` (a knob value the workload
    cannot take, e.g. ``fused`` for an optimizer without it); or the failure status of the
    child."""
    reason: Text = ""
    """Why it lost or failed, in words."""
    is_baseline: bool = False
    median_step_s: Float | None = None
    """Median wall time of one optimizer step (micro_batch x accumulate_steps samples)."""
    spread: Float | None = None
    """(p90 - p10) / median of the timed steps."""
    halfwidth: Float | None = None
    """Half-width of the 95% interval of the median step time, over the median: how sure the
    figure is (``autotune.timing.relative_halfwidth``; None with fewer than 2 timed steps)."""
    update_s: Float | None = None
    """Of the median step, the optimizer update's seconds (the rest is the micro-batches')."""
    num_timed_steps: Count = 0
    samples_per_s: Float | None = None
    tokens_per_s: Float | None = None
    peak_bytes: Count | None = None
    fragmentation_bytes: Count | None = None
    """CUDA: reserved minus allocated at the peak (the allocator's fragmentation and cache)."""
    compile_s: Float | None = None
    first_loss: Float | None = None
    num_skipped_steps: Count = 0
    num_graphs: Count | None = None
    num_graph_breaks: Count | None = None
    num_alloc_retries: Count = 0
    tflops_per_s: Float | None = None
    """Model TFLOP/s achieved (the baseline's counted FLOPs per sample x samples/s)."""
    mfu: Float | None = None
    """Model FLOPs utilization: TFLOP/s over the device's dense peak in this precision, when
    the peak is known (``datasheets.PEAK_TFLOPS``)."""
    speedup: Float | None = None
    """samples/s over the baseline's."""
    time_to_train_s: Float | None = None
    """compile_s + train_steps x median_step_s, when an objective in steps was given."""
    wall_s: Float | None = None
    num_runs: Positive = 1
    """Times it was measured; a close race is re-measured: its figures are the median of
    three or more full runs; of two, their geometric mean within the drift other configs
    showed, else the better (``search._records.typical_run``)."""
    timed_s: Float | None = None
    """Seconds of timed steps over all its runs (what the search spent timing it)."""
    round_shares: tuple[Float, ...] = ()
    """Where stage 5 ran it in interleaved rounds against one other candidate (runs of one
    config drifted further apart than their gap): its samples/s over the other's in each
    round, the two run back to back. The one ahead in most rounds is picked of the two,
    whatever their best runs say."""


    def label(self) -> str:
        """E.g. ``bf16/default 16x4`` or ``fp32/off+ckpt=blocks 32x2``."""
        return f"{self.knobs.label()} {self.micro_batch}x{self.accumulate_steps}"


@dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    """Memory facts behind the tuned config."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    device_total_bytes: Count
    budget_bytes: Positive
    """The hard cap each trial ran under."""
    headroom: Annotated[float, Field(ge=0, lt=1)]
    """Share of the budget kept free, in [0, 1)."""
    usable_bytes: Count
    """Budget minus headroom: the winner's peak stays under this."""
    peak_bytes: Count | None
    """The winner's measured peak."""
    max_micro_batch: dict[Text, Count] = field(default_factory=dict)
    """Largest fitting micro-batch per setting of the knobs probed (``Knobs.label()``, e.g.
    ``bf16/default`` or ``fp32/off+ckpt=blocks``)."""
    calibration: dict[Text, dict[Text, Count]] = field(default_factory=dict)
    """Per ``Knobs.label()``: ``measured_peak_bytes`` and the estimator's ``estimate_bytes`` for
    the same config, so ``autotune check`` can scale a later estimate."""
    allocator: Text = ""
    peak_definition: Text = ""
    peak_verified: bool | None = None
    """Whether the search checked that the winner fits as a user's first launch runs it:
    false where it is compiled on a device whose peak counts the compile (CPU) and no run of
    it compiled its graphs afresh (a limit stopped the search first, or that run ended
    otherwise), so its peak is that of runs that loaded their graphs from inductor's cache,
    which lowers it (``autotune verify`` measures a first launch); true otherwise; None in a
    file written before it was recorded."""
    peak_unverified: Text = ""
    """Why ``peak_verified`` is false, in words ("" otherwise)."""


RunKind = Literal["probe", "trial", "re-measure"]
"""A memory ``probe`` (timed nothing), a timed ``trial``, or the ``re-measure`` of a contender."""


@dataclass(frozen=True, kw_only=True)
class RunRecord(HasKnobs):
    """One child run of the search, in the order it ran: what the report's memory plot, and
    its timeline, are drawn from."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    number: Count
    kind: RunKind
    knobs: Knobs
    micro_batch: Positive
    status: TrialStatus
    """The child's outcome (``ok``, ``oom``, ``crash``, ...)."""
    fits: bool = False
    """Ran to the end with its peak within the usable bytes (budget minus headroom)."""
    peak_bytes: Count | None = None
    start_s: Float = 0.0
    """When it started, in seconds after the search started (a stored run: 0)."""
    wall_s: Float | None = None
    """Whole child process time, start-up included."""
    compile_s: Float | None = None
    """Of that, compiling (compiled runs)."""
    timed_s: Float = 0.0
    """Of that, timed steps."""
    stored_at: Text | None = None
    """A run reused from the study store: when it was measured (ISO 8601, UTC); None for a
    run of this search."""
    cut: bool = False
    """``--time-budget`` cut it short: its timeout was what was left of the budget, not
    ``--trial-timeout`` (its status says ``timeout``; it says nothing of its candidate)."""
    slot: Text = ""
    """The slot that ran it in a search of several at once (``--parallel``: ``cuda:3``,
    ``cpu 0-3``); "" one at a time."""
    node: Text = ""
    """The node that ran it in a study several nodes share (``--join``: ``host:pid``, as its
    claim in the study names it); "" for a search of one node."""

    def label(self) -> str:
        """E.g. ``bf16/default 16`` (the micro-batch)."""
        return f"{self.knobs.label()} {self.micro_batch}"

    def where(self) -> str:
        """Where it ran: ``node5:4121 cuda:3`` (node and slot), "" one at a time on one node."""
        return " ".join(filter(None, (self.node, self.slot)))


RuleId = Annotated[str, Field(pattern=r"^[a-z][a-z-]{0,39}$")]
"""A rule's stable id (``autotune.search.rules.RULES``), or ``note`` for a note of the space."""
VariantId = Annotated[str, Field(pattern=r"^([a-z][a-z-]{0,39})?$")]
"""One of a rule's sentences (``autotune.skip_sentences.TEMPLATES``), "" for its first."""


@dataclass(frozen=True, kw_only=True)
class SkipRecord:
    """One thing the search did not run, or a note on the space, with the rule that decided
    it (``docs/search.md`` states each rule)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    rule: RuleId = "note"
    target: Text = ""
    """The setting's label or the candidate's key it is about ("" for the search)."""
    text: Text
    """The sentence as it was said (``skip_sentences.render``), for readers of the JSON; read
    back, ``sentence`` makes it again from the figures where the rule has a template."""
    figures: dict[Text, int | Float | Text] = field(default_factory=dict)
    """The bound's figures (e.g. ``share``: its samples/s over the leader's); an int stays
    one (a micro-batch, bytes)."""
    variant: VariantId = ""
    """Which of the rule's sentences (``skip_sentences.TEMPLATES``; "" its first)."""
    context: Context = ""
    """The words another decision said it in (``skip_sentences.CONTEXTS``: "not tried")."""

    def sentence(self) -> str:
        """Its sentence, rendered from the figures; the stored ``text`` for a rule said in
        words, or a file written before its template (fewer figures)."""
        return render(self, self.text)


def notes(*texts: str) -> tuple[SkipRecord, ...]:
    """Sentences as skips of rule ``note`` (the space's notes: no rule of the search)."""
    return tuple(SkipRecord(text=text) for text in texts)


@dataclass(frozen=True, kw_only=True)
class CompileArtifacts:
    """The winner's compiled artifacts, saved beside ``autotune.json`` for the user's first
    launch (``torch.compiler.save_cache_artifacts``: inductor's and AOT autograd's cache
    entries), and what they are valid for. ``train_autotuned.py`` and ``Tuned.compile`` load
    them only when torch, the device and ``graphs_key`` match, and only a file whose size and
    sha256 are these (docs/compile.md: trust it like code)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    file: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")]
    """Its name, in the folder of ``autotune.json`` (a name, never a path)."""
    size_bytes: Positive
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    torch_version: Text
    """``torch.__version__`` of the run that saved them: another torch never loads them."""
    device_name: Text
    """The device's name as the loaders read it (CPU: /proc/cpuinfo's model name; CUDA:
    ``torch.cuda.get_device_name``)."""
    graphs_key: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    """Hash of what the graphs depend on: the model's parameter names, shapes and dtypes, the
    micro-batch, ``compile_dynamic`` and the knobs that change the graphs
    (``autotune.artifacts.graphs_key``)."""
    entries: dict[Text, Count] = field(default_factory=dict)
    """Cache entries saved, by kind (``inductor``, ``aot_autograd``, ...)."""
    compile_s: Float | None = None
    """The saving run's one optimizer step, compile included (from the search's warm cache)."""
    cache_hits: Count | None = None
    """Of the saving run's compiles, graphs read from inductor's caches (FX graph, AOT autograd)."""
    cache_misses: Count | None = None

    def describe(self) -> str:
        """``autotune.compile-cache.bin (2.2 MiB, 6 cache entries: inductor 4, aot_autograd 2;
        saved in 91 s, 6 cache hits, 0 misses), loaded when torch 2.13.0 runs on AMD EPYC``."""
        entries = ", ".join(f"{kind} {n}" for kind, n in self.entries.items())
        run = ("" if self.compile_s is None else f"; saved in {self.compile_s:,.0f} s"
               + ("" if self.cache_hits is None else
                  f", {self.cache_hits} cache hits, {self.cache_misses} misses"))
        return (f"{self.file} ({self.size_bytes / 2**20:.1f} MiB, "
                f"{sum(self.entries.values())} cache entries"
                + (f": {entries}" if entries else "") + f"{run}), loaded when torch "
                f"{self.torch_version} runs on {self.device_name}")


@dataclass(frozen=True, kw_only=True)
class TunedConfig(HasKnobs):
    """The content of ``autotune.json``."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    schema: Literal[3] = SCHEMA_VERSION
    autotune_version: Text
    created_at: Text
    workload: WorkloadSpec
    workload_name: Text
    workload_fingerprint: Text
    target_batch: Batch
    """Effective batch tuned for: samples per optimizer step over all devices."""
    requested_batch: Batch | None = None
    """What the user asked for, when --allow-inexact tuned the nearest exact batch instead."""
    world_size: Batch
    micro_batch: Batch
    """Samples per forward/backward on each device."""
    accumulate_steps: Batch
    """Micro-batches per optimizer step: target_batch / (micro_batch x world_size)."""
    knobs: Knobs
    """The tuned precision, compile mode, checkpointing, optimizer implementation, memory
    format, allocator and the ranks' strategy."""
    nproc_per_node: Positive = 1
    """Ranks each probe and trial ran as one job (``--nproc-per-node``); ``world_size`` may
    be larger (several nodes)."""
    compile_dynamic: bool | None = None
    """``torch.compile``'s ``dynamic`` in every delivered path (``Tuned.compile``, the
    Accelerate plugin, ``train_autotuned.py``): None, torch's automatic dynamic shapes (the
    trials' graphs at their one shape; a dim that changes compiles once more, dynamic: data of
    varying length costs one recompile, not one per length); true, dynamic from the first
    compile; false, one static graph per shape (more than ``recompile_limit`` shapes run eager)."""
    extras: dict[Text, Text] = field(default_factory=dict)
    memory: MemoryRecord
    device: DeviceInfo
    objective: Literal["throughput", "time_to_train"] = "throughput"
    train_steps: Positive | None = None
    median_step_s: Float | None = None
    samples_per_s: Float | None = None
    tokens_per_s: Float | None = None
    flops_per_sample: Float | None = None
    """Model FLOPs of one sample's forward and backward, counted on the baseline's step."""
    mfu: Float | None = None
    """The winner's model FLOPs utilization, when the device's peak is known."""
    baseline_samples_per_s: Float | None = None
    speedup: Float | None = None
    break_even_steps: Float | None = None
    """Optimizer steps after which the compiled winner's compile time has paid for itself."""
    reason: Text = ""
    """One line: why the winner won."""
    runner_up: RunnerUp = ""
    """How the winner stands against the runner-up (the fastest other candidate timed in
    full), as the search's interval comparison says it (``Interval.beats``: the winner's
    samples/s with the lead's noise around it, widened to the drift two runs of one config
    showed): ``behind``, beyond the noise; ``behind-once``, beyond each run's own spread but
    one of the two ran once (the drift between runs is not in that); ``within-noise``, either
    would do; ``rounds``, interleaved rounds decided between the two; "" no runner-up, its
    spread not measured, an objective in steps, or a file written before it was recorded."""
    trials: tuple[TrialRecord, ...] = ()
    skips: tuple[SkipRecord, ...] = ()
    """Candidates or classes not measured, each with its rule and reason (``skipped``: the
    sentences alone)."""
    interrupted: bool = False
    """True when the search stopped early (a limit, Ctrl-C or SIGTERM): best so far."""
    stopped_by: Text = ""
    """What stopped it early, e.g. ``--max-trials reached (60 child runs)`` or ``interrupted
    (Ctrl-C)``; empty when it ran to its end (and in files written before it was recorded)."""
    not_reached: tuple[Text, ...] = ()
    """A search stopped early: the stages and knobs it never began, e.g. ``knob screening
    (checkpointing, optimizer_impl)``, ``the re-measure of the leaders`` (empty when it ran
    to its end)."""
    cost: SearchCost | None = None
    """What the search spent (None: written before it was recorded)."""
    study: StudyRecord | None = None
    """Where the runs are recorded (None: older files)."""
    runs: tuple[RunRecord, ...] = ()
    """Every child run, in order, with those reused from the study store first (older files:
    none recorded)."""
    compile_artifacts: CompileArtifacts | None = None
    """A compiled winner's artifacts for the user's first launch (None: eager, not saved, or
    an older file; ``skips`` says why a compiled winner has none)."""

    def effective_batch(self) -> int:
        """micro_batch x accumulate_steps x world_size."""
        return self.micro_batch * self.accumulate_steps * self.world_size

    @property
    def skipped(self) -> tuple[str, ...]:
        """What was not measured, each as its sentence (``skips`` with their rules)."""
        return tuple(s.sentence() for s in self.skips)

    def stopped_early(self) -> str:
        """A sentence saying what stopped the search before its end ("" when it ran to it):
        a limit reached is not an interruption."""
        if not self.interrupted:
            return ""
        return (f"The search stopped early ({self.stopped_by or 'the reason was not recorded'})"
                ": this is the best config found before it stopped.")

    def memory_class(self) -> str:
        """The knobs' label, the key of ``memory.max_micro_batch``: e.g. ``bf16/default``."""
        return self.knobs.label()


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What ``autotune.search`` returns: the tuned config, where it was written, the probes."""

    config: TunedConfig
    path: Path | None
    """Where ``autotune.json`` was written (None when not written)."""
    probe: ProbeReport
    stop_reason: StopReason = field(default_factory=StopReason)
