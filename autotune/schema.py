"""``autotune.json``: the tuned config, versioned, with every trial. No torch import here.

The file is complete enough to reproduce the winner and to check it later: knobs, memory facts,
measured throughput and the baseline's, device and versions, workload fingerprint, and each
trial with its outcome and why it lost (DESIGN.md section 7).

It is validated in one place, on read (``read_tuned``): pydantic checks every field's type and
range against the dataclasses below (strict: no coercion, no unknown field), then the rules
that tie fields together. Every problem is reported at once, each with its dotted path.
A field's range or pattern is in its type, never only in a rule, so the JSON Schema that
``autotune schema`` prints (``json_schema``, from the same types) says what the reader accepts;
beyond it are only the rules between fields (``_rules``), which it says in ``$comment``s
(``READ_RULES``: JSON Schema cannot state a product of fields).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError

from autotune.config import (
    CONTROL_CHARACTERS,
    MAX_BATCH,
    STRICT_FIELDS,
    TEXT_PATTERN,
    DeviceInfo,
    ProbeReport,
    StopReason,
    Text,
    TrialStatus,
    WorkloadSpec,
    control_character,
    not_a_file,
    to_json_dict,
)
from autotune.errors import ConfigError, OutputExistsError
from autotune.knobs import KNOBS, HasKnobs, Knobs
from autotune.names import FLAGS, Names
from autotune.skip_sentences import Context, render

SCHEMA_VERSION: Final = 3
"""3: what the search did not run is typed (``skips``: each with its rule id, what it is about
and its figures) instead of sentences (``skipped``); schema 2 files are read with each sentence
a ``note`` (``_from_schema_2``). 2: precision and compile mode moved into ``knobs`` with the
other knobs; schema 1 files are read by moving them there (``_from_schema_1``)."""
_READS_OLDER: Final = (1, 2)
_READS: Final = (*_READS_OLDER, SCHEMA_VERSION)
"""Schema versions this autotune reads: its own, and 1 and 2 (moved into it on read)."""

Verdict = Literal[
    "winner", "ok", "slower", "numerics", "over_budget", "oom", "compile_error", "non_finite",
    "timeout", "crash", "error", "workload_error", "unsupported",
]


def _non_finite(value: Any) -> Any:
    """``to_json_dict`` writes inf and nan as the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


Float = Annotated[float, BeforeValidator(
    _non_finite, json_schema_input_type=float | Literal["inf", "-inf", "nan"])]
"""A float field of the file: a JSON number, or ``"inf"`` / ``"-inf"`` / ``"nan"``."""
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]
"""A count of samples, micro-batches or devices: at most ``MAX_BATCH`` (the sums on it stay
quick)."""


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
    the peak is known (``config.PEAK_TFLOPS``)."""
    speedup: Float | None = None
    """samples/s over the baseline's."""
    time_to_train_s: Float | None = None
    """compile_s + train_steps x median_step_s, when an objective in steps was given."""
    wall_s: Float | None = None
    num_runs: Positive = 1
    """Times it was measured; a close race is re-measured and each keeps its better run."""
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


@dataclass(frozen=True, kw_only=True)
class SearchCost:
    """Where a search's time went, over every child run (memory probes included)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    num_runs: Count
    child_s: Float
    """Wall time of the child runs, start-up included."""
    compile_s: Float
    """Of that, compiling (the compiled runs' warm-up beyond the same steps once compiled)."""
    num_compiled_runs: Count = 0
    num_cached_compiles: Count = 0
    """Compiled runs whose graphs all came from inductor's on-disk caches (compiled before,
    by another child of the same setting and micro-batch, or an earlier search)."""
    timed_s: Float
    """Of that, timed steps."""

    def describe(self) -> str:
        """``12 child runs, 310 s (compile 95 s, timed steps 120 s; 2 of 6 compiled runs
        reused inductor's cache)``."""
        cached = (f"; {self.num_cached_compiles} of {self.num_compiled_runs} compiled runs "
                  "reused inductor's cache" if self.num_compiled_runs else "")
        return (f"{self.num_runs} child runs, {self.child_s:,.0f} s (compile "
                f"{self.compile_s:,.0f} s, timed steps {self.timed_s:,.0f} s{cached})")


@dataclass(frozen=True, kw_only=True)
class StudyRecord:
    """The Optuna study the search recorded its runs in."""

    __pydantic_config__: ClassVar[dict[str, Any]] = STRICT_FIELDS

    storage: Text = ""
    """Its storage URL (the local study store, or ``--storage``); empty: kept in memory only."""
    name: Text = ""
    note: Text = ""
    """What the store said: why it was not used, or a damaged file moved aside."""

    @property
    def failed(self) -> bool:
        """Whether the store failed during the search (its note says so, ``STORE_FAILED``):
        the runs from then on are not recorded."""
        return self.note.startswith(STORE_FAILED) or f"; {STORE_FAILED}" in self.note


STORE_FAILED = "failed while "
"""How the study's note says the store failed during the search (``search._ledger``)."""


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

    def label(self) -> str:
        """E.g. ``bf16/default 16`` (the micro-batch)."""
        return f"{self.knobs.label()} {self.micro_batch}"


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


def check_output(path: Path, *, force: bool = False, name: Names = FLAGS) -> None:
    """Refuse to write an output at ``path``: the one check of every output autotune writes
    (``write_json_atomic``; a search checks its outputs with it before it starts).

    Raises:
        OutputExistsError: a file is there and ``force`` is False.
        ConfigError: something else than a regular file is there (a folder, a FIFO, a device,
            a link to one), ``force`` or not: a rename over it would replace the device node
            or the pipe itself; or a folder above ``path`` is a file.

    ``name`` says the settings the user's way (``--force`` or ``force=True``).
    """
    path = Path(path)
    kind = not_a_file(path)
    if kind is not None:
        link = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ConfigError(f"{path}{link} is {kind}, not a regular file: autotune writes its "
                          f"outputs as files and replaces nothing else, also with "
                          f"{name.given('force', True)}; choose another path")
    if path.exists() and not force:
        raise OutputExistsError(path, f"{path} already exists and was not overwritten: pass "
                                f"{name.given('force', True)} to replace it, or choose "
                                f"another {name('out')} folder")
    for folder in path.parents:  # the nearest one that exists must be a folder
        try:
            if stat.S_ISDIR(folder.stat().st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet), or under a file: its parent says
        except (OSError, ValueError):
            return  # unreadable: writing it says why
        raise ConfigError(f"cannot write {path}: {folder} is a file, not a folder; choose "
                          f"another {name('out')} folder, or move the file")


def write_json_atomic(path: Path, text: str | bytes, *, force: bool = False) -> None:
    """Write ``text`` (or bytes) to ``path`` atomically, with the user's umask, never over
    another file, and over nothing but a regular file (``check_output``).

    The text goes to a temporary file beside ``path``, which then takes the name in one step: a
    hard link (fails if the name exists, also when another process wrote it after the check
    at the start) or, with ``force``, a rename over it. Readers never see a half-written file.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is False.
        ConfigError: not a regular file at ``path``, a file above it, the folder not writable.
    """
    path = Path(path)
    check_output(path, force=force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with (os.fdopen(fd, "wb") if isinstance(text, bytes) else
                  os.fdopen(fd, "w", encoding="utf-8")) as f:
                f.write(text)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
            if force:
                check_output(path, force=True)  # again: the write took a while
                os.replace(tmp, path)
            else:
                _link_exclusive(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose a writable "
                          "--out folder") from exc


def _link_exclusive(tmp: str, path: Path) -> None:
    """Give the complete ``tmp`` the name ``path`` unless that name exists."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputExistsError(path) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        # A file system without hard links: claim the name exclusively (an empty file for an
        # instant, never a partial one), then move the complete file onto it.
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            raise OutputExistsError(path) from None
        os.replace(tmp, path)


def _umask() -> int:
    """The process's umask: read from /proc on Linux (setting it to read it back races with
    other threads creating files), else set and restored."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tuned(config: TunedConfig, path: Path, *, force: bool = False) -> None:
    """Write ``autotune.json`` atomically (never a half-written file, never over another one
    without ``force``), a file workload's path relative to it where they travel together
    (``stored_workload_target``), a control character in its text escaped
    (``_escape_controls``)."""
    data = to_json_dict(config)
    if config.workload.kind == "file":
        data["workload"]["target"] = stored_workload_target(config.workload.target,
                                                            Path(path).absolute().parent)
    write_json_atomic(path, json.dumps(_escape_controls(data), indent=2) + "\n", force=force)


def _escape_controls(data: Any) -> Any:
    """JSON data with each control character in its text as its escape (a tab as ``\\t``):
    the reader refuses them (``Text``), and the search records text it did not choose (the
    first line of an error, which may hold a tab or a colour code). The names a user gives
    are refused before a search starts (``Workload``, ``--workload``, ``--model``)."""
    if isinstance(data, str):
        return re.sub(f"[{CONTROL_CHARACTERS}]", lambda c: repr(c.group())[1:-1], data)
    if isinstance(data, dict):
        return {_escape_controls(k): _escape_controls(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_escape_controls(v) for v in data]
    return data


def stored_workload_target(target: str, folder: Path) -> str:
    """A ``file.py:factory`` as ``autotune.json`` in ``folder`` stores it: relative to that
    folder when the file lies in the same tree (under the folder, or under the git checkout
    that holds it), so the two move together (a CI checkout); absolute otherwise.
    ``read_tuned`` resolves a relative one from the folder again."""
    path_text, _, factory = target.rpartition(":")
    if not Path(path_text).is_absolute():
        return target
    try:  # a folder above that cannot be read leaves the path as it was, never the write
        file, folder = Path(path_text).resolve(), folder.resolve()
        root = next((p for p in (folder, *folder.parents) if (p / ".git").exists()), folder)
    except OSError:
        return target
    if not file.is_relative_to(root):
        return target
    return f"{Path(os.path.relpath(file, folder)).as_posix()}:{factory}"


def _resolve_workload(config: TunedConfig, path: Path) -> TunedConfig:
    """The config with a relative file workload's path resolved from ``path``'s folder."""
    path_text, _, factory = config.workload.target.rpartition(":")
    if config.workload.kind != "file" or Path(path_text).is_absolute():
        return config
    file = os.path.normpath(path.absolute().parent.resolve() / path_text)
    return replace(config, workload=replace(config.workload, target=f"{file}:{factory}"))


READ_RULES: Final = {
    ("schema",): f"files of schema {' and '.join(map(str, _READS_OLDER))} are read too (moved "
                 f"to schema {SCHEMA_VERSION} on read)",
    ("target_batch",): "micro_batch x accumulate_steps x world_size must equal target_batch",
    ("nproc_per_node",): "world_size must be a multiple of nproc_per_node (nodes x ranks per "
                         "node); above 1, knobs.strategy must not be none",
    ("knobs",): "a knob value only the compiler applies ("
                + ", ".join(f"{k.name} {v}" for k in KNOBS for v in k.compiled_only)
                + ") needs knobs.compile_mode other than off",
    ("memory", "usable_bytes"): "must not exceed memory.budget_bytes",
    ("workload", "target"): "with workload.kind file: 'path/to/file.py:factory' (the factory "
                            "a Python identifier)",
}
"""What the reader checks beyond each field's own type (``_from_schema_*``, ``_rules``), by
the field it is said at: ``json_schema`` writes each as a ``$comment`` there (JSON Schema
cannot state a product of fields)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``autotune.json`` (what ``autotune schema`` prints): generated from
    the types ``read_tuned`` validates with, so their ranges, enums and patterns are its own;
    ``schema`` required as the reader requires it (``_check_schema_field``: it has a default
    in the type, never in a file), and the rules between fields (``READ_RULES``) said
    where they apply."""
    schema = _adapter().json_schema()
    schema["required"] = ["schema", *(f for f in schema["required"] if f != "schema")]
    for path, rule in READ_RULES.items():
        node = schema
        for key in path[:-1]:  # the field's own node, not a definition others share
            node = node["properties"][key]
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        node["properties"][path[-1]]["$comment"] = rule
    schema["$comment"] = "What the reader checks beyond each field's type: " + "; ".join(
        f"{'.'.join(path)}: {rule}" for path, rule in READ_RULES.items())
    return schema


def read_tuned(path: str | Path) -> TunedConfig:
    """Read and validate ``autotune.json``: the one place its values are checked.

    Pydantic checks each field's type and range (strict: ``"8"`` is not 8, no unknown field),
    then ``_rules`` checks the fields against each other. All problems are reported at once.

    Raises:
        ConfigError: missing, a directory, not JSON, not an autotune file, from another schema,
            or with bad fields (each named by its dotted path, with the value seen and why).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not an autotune.json file: give the file's "
                          f"path, e.g. {path / 'autotune.json'}")
    kind = not_a_file(path)
    if kind is not None:
        raise ConfigError(f"{path} is {kind}, not a regular file: give the path of an "
                          "autotune.json file")
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: run `autotune search` to create it")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: a number of over 4300 digits too
        raise ConfigError(f"{path} is not valid JSON ({exc}); re-run `autotune search`") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    version = _check_schema_field(path, data)
    problems: list[str] = []
    if version == 1:
        data, problems = _from_schema_1(data)
    if version in (1, 2):
        data, moved = _from_schema_2(data)
        problems += moved
        try:
            text = json.dumps(data)
        except RecursionError as exc:
            raise ConfigError(f"{path} is nested too deeply to read; re-run `autotune "
                              "search`") from exc
    config = None
    try:
        config = _adapter().validate_json(text)
    except ValidationError as exc:
        problems += [_problem(error, version) for error in exc.errors()]
    problems += _rules(data)
    if problems or config is None:
        raise ConfigError(
            f"{path} is not a valid autotune config ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}): " + "; ".join(problems)
            + ". Fix these fields, or re-run `autotune search` to write a fresh file")
    return _resolve_workload(config, path)


@functools.cache
def _adapter() -> TypeAdapter[TunedConfig]:
    """Pydantic's validator for the file, compiled once per process on first use."""
    return TypeAdapter(TunedConfig)




def _check_schema_field(path: Path, data: Any) -> int:
    """The file is a JSON object with a ``schema`` this autotune reads; returns it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not an autotune.json file: it holds {_describe(data)}, "
                          "not a JSON object; re-run `autotune search` to write one")
    if "schema" not in data:
        raise ConfigError(f"{path} is not an autotune.json file (no 'schema' field)")
    version = data["schema"]
    if type(version) is not int:
        raise ConfigError(
            f"{path}: the field 'schema' must be the number {SCHEMA_VERSION}, got "
            f"{_describe(version)}; fix it, or re-run `autotune search` to write a fresh file")
    if version not in _READS:
        raise ConfigError(
            f"{path} has schema {version}; this autotune reads schema "
            f"{', '.join(map(str, _READS[:-1]))} and {_READS[-1]}"
            + (": upgrade autotune (pip install -U torch-autotune)" if version > SCHEMA_VERSION
               else ": re-run `autotune search` to write a current file"))
    return version


def _from_schema_1(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A schema 1 file as schema 2: ``precision`` and ``compile_mode`` (top level and in each
    trial) move into ``knobs``; the other knobs keep their defaults (schema 1 had none).

    Returns:
        The moved data, and what ``knobs`` would hide: a missing ``precision`` or
        ``compile_mode`` (it would take the default), a ``knobs`` field (not schema 1's).
    """
    problems = []
    trials = data.get("trials")
    holders = [("", data), *((f"trials[{i}].", t) for i, t in enumerate(
        trials if isinstance(trials, list) else []) if isinstance(t, dict))]
    for where, holder in holders:
        if "knobs" in holder:
            problems.append(f"{where}knobs: got {_shown(holder['knobs'])}: "
                            + _REASONS["extra_forbidden"].format(version=1))
        holder["knobs"] = {k: holder.pop(k) for k in ("precision", "compile_mode") if k in holder}
        problems += [f"{where}{k}: {_REASONS['missing']}" for k in ("precision", "compile_mode")
                     if k not in holder["knobs"]]
    return {**data, "schema": 2}, problems


def _from_schema_2(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A schema 2 file as schema 3: each sentence of ``skipped`` becomes a skip of rule
    ``note`` (schema 2 did not record the rules). Returns the moved data, and a ``skipped``
    that is not a list of strings or a ``skips`` field (not schema 2's) as problems."""
    data = dict(data)
    problems = []
    if "skips" in data:
        problems.append(f"skips: got {_shown(data['skips'])}: "
                        + _REASONS["extra_forbidden"].format(version=2))
    skipped = data.pop("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(t, str) for t in skipped):
        problems.append(f"skipped: got {_shown(skipped)}: a list of sentences (strings) in "
                        "schema 2")
        skipped = []
    data["skips"] = [{"rule": "note", "text": text} for text in skipped]
    return {**data, "schema": SCHEMA_VERSION}, problems


def _describe(value: Any) -> str:
    """A JSON value in words, e.g. ``the string '1'``."""
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {_shown(value)}"
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def _shown(value: Any, limit: int = 60) -> str:
    """``repr`` of a value seen in the file, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("trials", 0, "precision")`` as ``trials[0].precision``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":  # pydantic's mark for a dict's key (the part before names it)
            out += " (the key)"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{_shown(part, 40)}]"
    return out or "(the file)"


_REASONS = {
    "missing": "missing (this field is required)",
    "less_than_equal": f"over the limit of {MAX_BATCH} (2**20) autotune tunes for",
    "unexpected_keyword_argument": "unknown field (not part of schema {version})",
    "extra_forbidden": "unknown field (not part of schema {version})",
}
_MEANINGS = {
    "memory.headroom": "must be a fraction in [0, 1), e.g. 0.1 for 10%",
    "memory.budget_bytes": "must be positive",
    "device.device": "must be 'cpu' or 'cuda:N'",
    "workload.seq_len": "must be at least 1, or null",
}
"""What a field's range or pattern (in its type: the JSON Schema says it too) means, in words:
said in place of pydantic's message for a value outside it."""


def _problem(error: Any, version: int = SCHEMA_VERSION) -> str:
    """One pydantic error as ``dotted.path: got VALUE: reason``. In a schema 1 file the path
    is the file's own: ``precision``, not the ``knobs.precision`` it was moved to."""
    loc = tuple(error["loc"])
    if version == 1 and loc[:1] == ("knobs",):
        loc = loc[1:]
    elif version == 1 and loc[:1] == ("trials",) and loc[2:3] == ("knobs",):
        loc = loc[:2] + loc[3:]
    where = _dotted(loc)
    if error["type"] == "missing":
        return f"{where}: {_REASONS['missing']}"
    reason = (_REASONS[error["type"]].format(version=version) if error["type"] in _REASONS
              else _MEANINGS.get(where, error["msg"]))
    if error.get("ctx", {}).get("pattern") == TEXT_PATTERN:
        reason = (f"holds the control character {control_character(error['input'])}, which "
                  "no text field may (in a file made from it, what follows would become "
                  "configuration or code): remove it")
    return f"{where}: got {_shown(error.get('input'))}: {reason}"


def _rules(data: dict[str, Any]) -> list[str]:
    """What pydantic cannot see field by field: the rules between fields. Each rule runs on
    the raw JSON where its inputs have the right type (a wrong type is pydantic's problem)."""
    problems = []
    batch = [_int(data, name) for name in ("micro_batch", "accumulate_steps", "world_size")]
    target = _int(data, "target_batch")
    in_range = all(n is not None and n <= MAX_BATCH for n in (*batch, target))  # else said
    if in_range and batch[0] * batch[1] * batch[2] != target:  # type: ignore[operator]
        problems.append(
            f"micro_batch x accumulate_steps x world_size: got {batch[0]} x {batch[1]} x "
            f"{batch[2]} = {batch[0] * batch[1] * batch[2]}: must equal target_batch "
            f"({target})")
    ranks, world = _int(data, "nproc_per_node"), batch[2]
    if ranks is not None and world is not None and ranks > 0 and world % ranks:
        problems.append(f"nproc_per_node: got {ranks}: world_size ({world}) must be a multiple "
                        "of it (nodes x ranks per node)")
    knobs = data.get("knobs")
    strategy = knobs.get("strategy", "none") if isinstance(knobs, dict) else "none"
    if ranks is not None and ranks > 1 and strategy == "none":
        problems.append(f"nproc_per_node: got {ranks}: ranks need knobs.strategy ddp or fsdp "
                        "(it is none)")
    if isinstance(knobs, dict) and knobs.get("compile_mode") == "off":
        problems += [f"knobs.{k.name}: got {_shown(knobs[k.name])}: needs a compiled mode "
                     "(knobs.compile_mode is off)" for k in KNOBS
                     if isinstance(knobs.get(k.name), str) and knobs[k.name] in k.compiled_only]
    memory = data.get("memory")
    if isinstance(memory, dict):
        budget, usable = _int(memory, "budget_bytes"), _int(memory, "usable_bytes")
        if budget is not None and usable is not None and usable > budget:
            problems.append(f"memory.usable_bytes: got {usable}: must not exceed "
                            f"memory.budget_bytes ({budget})")
    workload = data.get("workload")
    if isinstance(workload, dict):
        target_text = workload.get("target")
        if workload.get("kind") == "file" and isinstance(target_text, str) and not _is_factory(
                target_text):
            problems.append(f"workload.target: got {_shown(target_text)}: a file workload "
                            "must be 'path/to/file.py:factory' (factory a Python identifier)")
    return problems


def _is_factory(target: str) -> bool:
    """``path/to/file.py:factory`` with an identifier after the colon."""
    path_text, sep, name = target.rpartition(":")
    return bool(sep) and path_text.endswith(".py") and name.isidentifier() and "\0" not in target


def _int(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    return value if type(value) is int else None




@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What ``autotune.search`` returns: the tuned config, where it was written, the probes."""

    config: TunedConfig
    path: Path | None
    """Where ``autotune.json`` was written (None when not written)."""
    probe: ProbeReport
    stop_reason: StopReason = field(default_factory=StopReason)
