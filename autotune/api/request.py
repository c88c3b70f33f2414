"""Settings every command shares: which workload, how much memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.api.settings import check_settings
from autotune.builtin_workloads import CPU_DEMO
from autotune.child import start_method
from autotune.config import DeviceInfo, Knobs, WorkloadSpec
from autotune.device import backend_for
from autotune.errors import ConfigError
from autotune.files import not_a_file
from autotune.knobs import KNOB
from autotune.lengths import check_lengths, read_lengths
from autotune.names import KEYWORDS, Names
from autotune.serialize import control_character
from autotune.space import compiled_values, exact_target, knob_values, memory_classes
from autotune.units import MIB, format_bytes, parse_budget
from autotune.user_code import split_factory


def workload_spec(*, workload: str | None = None, model: str | None = None,
                  seq_len: int | None = None, pretrained: bool = False,
                  lengths: str | Path | None = None, name: Names = KEYWORDS) -> WorkloadSpec:
    """Name a workload the CLI way: nothing (the default), ``--model`` or ``--workload``.

    Args:
        name: how the user wrote the settings (``FLAGS`` on the command line).

    Raises:
        ConfigError: both given, a bad ``file.py:factory``, a missing file, a bad seq len,
            or a bad ``--lengths`` file (``lengths.read_lengths``) or one without ``--model``.
    """
    for setting, value, form in (("workload", workload, "a FILE.py:FACTORY"),
                                 ("model", model, "a model id")):
        if value is not None and not value.strip():
            raise ConfigError(f"{name(setting)} is empty (got {value!r}): name {form}, or leave "
                              "it out to tune the built-in workload")
        if value is not None and (bad := control_character(value)) is not None:
            raise ConfigError(f"{name(setting)} {value!r} holds the control character {bad}: "
                              "it is stored in autotune.json, whose text is one line; name "
                              f"{form} without control characters (line breaks, tabs)")
    if workload and model:
        raise ConfigError(f"give either {name.given('workload', 'FILE.py:FACTORY')} or "
                          f"{name.given('model', 'NAME')}, not both")
    if seq_len is not None and seq_len <= 0:
        raise ConfigError(f"{name('seq_len')} must be a positive number of tokens, got {seq_len}")
    if lengths is not None and not model:
        raise ConfigError(f"{name.given('lengths', str(lengths))} applies to {name('model')}; a "
                          f"{name('workload')} declares its lengths itself (autotune.Workload("
                          "lengths=...)), and the built-in workload has a fixed shape")
    if workload:
        path, factory = split_factory(workload, name)
        # Absolute, so autotune.json works from any folder (check, codegen, load).
        return WorkloadSpec(kind="file", target=f"{path.resolve()}:{factory}")
    if model:
        found = None if lengths is None else check_lengths(
            read_lengths(lengths), name.given("lengths", str(lengths)), seq_len)
        return WorkloadSpec(kind="hf", target=model, seq_len=seq_len, pretrained=pretrained,
                            lengths=found)
    if seq_len is not None:
        raise ConfigError(f"{name('seq_len')} applies to {name('model')}; the default workload "
                          "has a fixed shape")
    return WorkloadSpec()


def workload_file_here(workload: WorkloadSpec, config_path: str | Path) -> None:
    """Refuse a config whose file workload is not where ``workload.target`` says (moved, or
    not a regular file): the one message ``check`` and ``codegen`` give.

    Raises:
        ConfigError: naming the field, the path, what is there, and ``--workload``.
    """
    if workload.kind != "file":
        return
    file = Path(workload.target.rpartition(":")[0])
    if file.is_file():
        return
    what = not_a_file(file)
    raise ConfigError(
        f"workload.target in {config_path} names the workload file {file}, which "
        + (f"is {what}, not a regular file" if what else "is not here")
        + " (a relative path there counts from the folder of the autotune.json): pass "
        "--workload path/to/file.py:factory to use the file where it is now")


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The memory a run may use on one device."""

    budget_bytes: int
    """Hard cap for each child."""
    usable_bytes: int
    """Budget minus headroom: a fitting peak stays under this."""
    headroom: float
    note: str = ""
    """Why a default budget is less than what the device has free (a hard limit), else ""."""


def asked_budget(memory_budget: str | int, total_bytes: int, device: str,
                 name: Names = KEYWORDS) -> int:
    """A memory budget the user asked for (``2GiB``, ``80%`` of ``total_bytes``, or bytes),
    at most what ``device`` has: ``search``'s and ``check``'s one validation of it.

    Raises:
        ConfigError: an unparsable or non-positive budget, or more than the device has.
    """
    budget = (memory_budget if isinstance(memory_budget, int) else
              parse_budget(memory_budget, total_bytes))
    if budget <= 0:
        raise ConfigError(f"{name.given('memory_budget', memory_budget)} must be a positive "
                          "size such as '2GiB' or a share such as '80%'")
    if budget > total_bytes:
        raise ConfigError(
            f"{name.given('memory_budget', memory_budget)} ({format_bytes(budget)}) is more than "
            f"{device} has ({format_bytes(total_bytes)})")
    return budget


def resolve_budget(device: DeviceInfo, memory_budget: str | int | None,
                   headroom: float, name: Names = KEYWORDS) -> Budget:
    """The budget: the user's (``2GiB``, ``80%``) or what the device has free, within what a
    child's cap can hold here (``DeviceBackend.budget_limit``: on CPU a hard ``ulimit -v``).

    Args:
        name: how the user wrote the settings (``FLAGS`` on the command line).

    Raises:
        ConfigError: an unparsable budget, a headroom outside [0, 1), a budget larger than
            the device or than a child's cap can hold, or no room left for one.
    """
    if not 0 <= headroom < 1:
        raise ConfigError(f"{name('headroom')} must be a fraction in [0, 1) such as 0.1 for "
                          f"10%, got {headroom}")
    limit = backend_for(device.device).budget_limit()
    note = ""
    if memory_budget is None:
        budget = device.available_memory_bytes
        if limit is not None and limit[0] < budget:
            budget = limit[0]
            note = (f"memory budget {format_bytes(budget)}, less than the "
                    f"{format_bytes(device.available_memory_bytes)} free: {limit[1]}")
    else:
        budget = asked_budget(memory_budget, device.total_memory_bytes, device.device, name)
    room, why = limit if limit is not None else (budget, "")
    if limit is not None and (budget > room or (memory_budget is None and budget < MIB)):
        what = ("no memory budget is left for training" if memory_budget is None else
                f"{name.given('memory_budget', memory_budget)} ({format_bytes(budget)}) is "
                "more than a "
                "child process's memory cap can be here")
        raise ConfigError(
            f"{what}: {why}. " + (f"Give --memory-budget {room // MIB}MiB or less, or "
                                  if room >= MIB else "")
            + "raise the hard limit where it is set (the ulimit -v of the shell or job "
            "script, the container's or scheduler's limit)")
    return Budget(budget_bytes=budget, usable_bytes=int(budget * (1 - headroom)),
                  headroom=headroom, note=note)



@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """What to tune: the workload, the effective batch, the device and memory, the knob
    subsets. ``autotune probe`` / ``search`` and ``api.probe`` / ``search`` take one; its
    ``validate`` reports every problem at once."""

    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    target_batch: int
    """Effective batch: samples per optimizer step over all devices."""
    world_size: int = 1
    device: str | None = None
    """``cpu``, ``cuda`` or ``cuda:N`` (default: CUDA when available)."""
    memory_budget: str | int | None = None
    """``2GiB``, ``80%`` or bytes (default: what the device has free)."""
    headroom: float = 0.1
    precisions: Sequence[str] | None = None
    compile_modes: Sequence[str] | None = None
    knob_values: Mapping[str, Sequence[str] | None] = field(default_factory=dict)
    """Per knob beyond precision and compile mode (``checkpointing``, ...), the values to try;
    a missing knob tries every value the device runs."""
    allow_inexact: bool = False
    """Tune the nearest exact effective batch when the world size does not divide the target."""
    nproc_per_node: int = 1
    """Ranks each probe and trial runs as one job on this machine (``--nproc-per-node``):
    with ``strategy`` ddp or fsdp. ``world_size`` left at 1 means this many."""
    parallel: int | str = 1
    """Child runs at once, each on its own device(s) or cores (``--parallel``): a whole
    number, or ``auto`` for every visible device (CPU: cores // cores a job needs)."""

    def __post_init__(self) -> None:
        if self.world_size == 1 and isinstance(self.nproc_per_node, int) and (
                self.nproc_per_node > 1):
            object.__setattr__(self, "world_size", self.nproc_per_node)

    def _job(self, device: DeviceInfo, name: Names) -> dict[str, Sequence[str] | None]:
        """The knob values with the strategy's settled: ``none`` for one process, DDP's
        values when ranks are asked for without a strategy.

        Raises:
            ConfigError: ranks that do not fit the machine or the world, or a strategy that
                does not fit the ranks.
        """
        values = dict(self.knob_values)
        ranks, problems = self.nproc_per_node, []
        if ranks < 1:
            raise ConfigError(f"{name('nproc_per_node')} must be a whole number of at least 1, "
                              f"got {ranks!r}")
        most = backend_for(device.device).max_ranks()
        problems += self._parallel_problems(device, most, name)
        if ranks > most:
            problems.append(
                f"{name.given('nproc_per_node', ranks)} is more than this machine runs: "
                + (f"{most} CUDA device(s)" if device.is_cuda else
                   f"{most} CPU core(s) (a CPU rank needs a core of its own, or its timings "
                   "are another rank's)") + f"; use at most {most}, and {name('world_size')} "
                "for the whole job on several nodes")
        if self.world_size % ranks:
            problems.append(
                f"{name.given('world_size', self.world_size)} is not a multiple of "
                f"{name.given('nproc_per_node', ranks)}: the world is nodes x ranks per node")
        strategy = values.get("strategy")
        if strategy is None:
            values["strategy"] = ["none"] if ranks == 1 else ["ddp"]
        elif ranks > 1 and "none" in strategy:
            problems.append(
                f"{name.given('strategy', strategy)} with {name.given('nproc_per_node', ranks)}: "
                f"ranks need a strategy to share the work; use {name.given('strategy', ['ddp'])}"
                " or fsdp (or both)")
        elif "none" in strategy and len(strategy) > 1:
            problems.append(
                f"{name.given('strategy', strategy)}: none is one process, the others a job of "
                "ranks; give none alone, or ddp/fsdp")
        if problems:
            raise ConfigError("; ".join(problems))
        return values

    def slots(self, device: DeviceInfo) -> int:
        """How many child runs go at once (``parallel``, ``auto`` resolved): every visible
        device a job of ``nproc_per_node`` ranks can have its own of (CPU: the cores, one
        per rank), at least 1."""
        if self.parallel != "auto":
            return int(self.parallel)
        return max(1, backend_for(device.device).max_ranks() // max(1, self.nproc_per_node))

    def _shared(self, budget: Budget, device: DeviceInfo, name: Names) -> Budget:
        """On CPU the slots of a parallel search share the machine's memory: the default
        budget is what is free split between them (said in its note); a budget given that N
        children at once would take more than is free is refused. On CUDA each slot has its
        own device and the budget is per device.

        Raises:
            ConfigError: N x the budget given is more than the CPU has free.
        """
        width = self.slots(device) if self.parallel == "auto" or (
            isinstance(self.parallel, int) and self.parallel > 1) else 1
        if device.is_cuda or width <= 1:
            return budget
        free = device.available_memory_bytes
        if self.memory_budget is None:
            share = min(budget.budget_bytes, free // width)
            return replace(budget, budget_bytes=share,
                           usable_bytes=int(share * (1 - budget.headroom)),
                           note="; ".join(filter(None, [budget.note, (
                               f"memory budget {format_bytes(share)}: the "
                               f"{format_bytes(free)} free split between {width} children at "
                               f"once ({name.given('parallel', self.parallel)})")])))
        if width * budget.budget_bytes > free:
            raise ConfigError(
                f"{name.given('memory_budget', self.memory_budget)} with "
                f"{name.given('parallel', self.parallel)}: {width} children at once on the CPU "
                f"share its memory, {width} x {format_bytes(budget.budget_bytes)} is more than "
                f"the {format_bytes(free)} free; give {name('memory_budget')} "
                f"{free // width // MIB}MiB or less, or fewer at once")
        return budget

    def _parallel_problems(self, device: DeviceInfo, most: int, name: Names) -> list[str]:
        """``parallel`` beyond what this machine has: more jobs than devices (CPU: cores),
        counting each job's ``nproc_per_node`` devices (its type and range:
        ``check_settings``)."""
        width, ranks = self.slots(device), max(1, self.nproc_per_node)
        if device.is_cuda and width > 1 and device.device not in ("cuda", "cuda:0"):
            return [f"{name.given('device', device.device)} with "
                    f"{name.given('parallel', self.parallel)}: a parallel search runs on the "
                    f"first {width * ranks} visible devices, not from {device.device}; choose "
                    "them with CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=3,4) and "
                    f"{name.given('device', 'cuda')}"]
        if width * ranks <= most:
            return []
        what = f"{most} CUDA device(s)" if device.is_cuda else (
            f"{most} CPU core(s) (a child needs a core of its own, or its timings are "
            "another's)")
        job = (f": a job of {name.given('nproc_per_node', ranks)} takes {ranks} devices, so "
               f"{width} jobs need {width * ranks}" if ranks > 1 else "")
        return [f"{name.given('parallel', self.parallel)} is more than this machine runs at "
                f"once: {what}{job}; use at most {max(1, most // ranks)}, or "
                f"{name.given('parallel', 'auto')}"]

    def _shapes_apply(self, name: Names) -> None:
        """Refuse shape policies other than ``max`` for a workload known here to declare no
        lengths (the built-in one; ``--model`` without ``--lengths``): each would time the
        very batches ``max`` times. A ``--workload`` declares its lengths in its own code,
        read only in a child: there such a run is ``unsupported`` (``KNOB["shapes"].needs``).

        Raises:
            ConfigError: naming the values, why they cannot apply and how to declare lengths.
        """
        asked = [v for v in self.knob_values.get("shapes") or () if v in KNOB["shapes"].values]
        spec = self.workload
        if spec.kind == "file" or spec.lengths or all(v == "max" for v in asked):
            return
        said = name.given("shapes", asked)
        beyond = ",".join(v for v in asked if v != "max")
        if spec.kind == "default":
            raise ConfigError(
                f"{said}: the built-in workload declares no lengths (every batch has one "
                f"shape), so {beyond} would time the same batches as max; shapes other than "
                f"max need declared lengths: {name.given('model', 'NAME')} "
                f"{name.given('lengths', 'FILE')}, or a {name('workload')} whose "
                f"Workload(lengths=...) declares them; or leave {name('shapes')} out")
        raise ConfigError(
            f"{said}: {name.given('model', spec.target)} declares no lengths without "
            f"{name.given('lengths', 'FILE')} (every batch is {name('seq_len')} tokens long), "
            f"so {beyond} would time the same batches as max; shapes other than max need "
            f"declared lengths: add {name.given('lengths', 'FILE')} (one integer a line, or a "
            f"JSON list), or leave {name('shapes')} out")

    def demo_defaults(self, device: DeviceInfo) -> tuple[TuneRequest, tuple[str, ...]]:
        """This request with the built-in CPU demo's defaults where the user gave none
        (``builtin_workloads.CPU_DEMO``: the built-in workload on CPU only), and the lines that say
        which applied."""
        if self.workload.kind != "default" or device.is_cuda:
            return self, ()
        budget, modes = self.memory_budget is None, self.compile_modes is None
        if not (budget or modes):
            return self, ()
        return replace(
            self, memory_budget=CPU_DEMO.memory_budget if budget else self.memory_budget,
            compile_modes=CPU_DEMO.compile_modes if modes else self.compile_modes,
        ), CPU_DEMO.notes(budget=budget, compile_modes=modes)

    def validate(self, device: DeviceInfo, name: Names = KEYWORDS
                 ) -> tuple[int, Budget, tuple[Knobs, ...], dict[str, tuple[str, ...]],
                            tuple[str, ...]]:
        """Check every field's value against the device; all problems are reported together
        (their types first: ``check_settings``).

        Args:
            device: the device the request is for.
            name: how the user wrote the settings (``FLAGS`` on the command line).

        Returns:
            (the exact target batch, the budget, the (precision, compile mode) settings, the
            further knobs' values, notes on what the device skips).

        Raises:
            ConfigError: each problem, with the value seen and what to do.
        """
        check_settings(name, self)  # a value of the wrong type is not judged further
        request, demo = self.demo_defaults(device)
        if request is not self:
            target, budget, classes, values, notes = request.validate(device, name)
            return target, budget, classes, values, (*demo, *notes)
        problems: list[str] = []
        results: list[Any] = []
        for check in (
            lambda: exact_target(self.target_batch, self.world_size, self.allow_inexact, name),
            lambda: self._shared(resolve_budget(device, self.memory_budget, self.headroom,
                                                name), device, name),
            lambda: knob_values(device, self._job(device, name), name),
            lambda: self._shapes_apply(name),
        ):
            try:
                results.append(check())
            except ConfigError as exc:
                problems.append(str(exc))
                results.append(None)
        target, budget, extra, _ = results
        try:  # read at each child's start: a bad value must not wait for the first one
            start_method()
        except ConfigError as exc:
            problems.append(str(exc))
        classes: tuple[Knobs, ...] = ()
        skipped: tuple[str, ...] = ()
        try:  # checked also when the other knobs failed: every problem is said at once
            classes, skipped = memory_classes(device, self.precisions, self.compile_modes,
                                              base=extra[1] if extra is not None else None)
        except ConfigError as exc:
            problems.append(str(exc))
        if problems:
            raise ConfigError("; ".join(problems))
        values, _, notes = extra
        values, eager_notes = compiled_values(values, classes, name)  # budget-F: compiled only
        return target, budget, classes, values, (
            *filter(None, [budget.note]), *skipped, *notes, *eager_notes)
