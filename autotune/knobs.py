"""Every knob of the search in one place: its values, where it applies, and what it does.

A knob is one row of ``KNOBS``: its values per device, its CLI option and help, whether a
workload can use a value (``needs``, over ``autotune.traits.WorkloadTraits``;
``knob_rules.skip_reason``), whether the compiler alone applies it, and its words in the report
and the generated script (``knob_rules.describe``). ``Knobs`` is one point of the space
without the micro-batch; the child's trial, the estimator and ``autotune.load`` apply it
through ``autotune.step`` (the generated script through its plain copy),
``autotune.knob_adapters`` hands it to a child's environment, Hugging Face
``TrainingArguments`` and Accelerate. No torch here: ``config``, ``schema``,
``space`` and ``codegen`` use the values without it.

Adding a knob (docs/contributing.md): a field of ``Knobs``, a row of ``KNOBS``, how it applies
(``step.py``, and its plain copy in the generated script's template); its CLI option comes
from the row (``cli.knob_options``). A value only the compiler applies (a compile scope, a
compiler recompute budget) is in ``Knob.compiled_only``: the space then never pairs it with
compile mode ``off``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from autotune import traits
from autotune.errors import ConfigError
from autotune.traits import WorkloadTraits

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
CompileMode = Literal[
    "off", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"
]
Checkpointing = Literal["off", "blocks", "alternate", "budget-0.5"]
OptimizerImpl = Literal["default", "for-loop", "foreach", "fused"]
MemoryFormat = Literal["contiguous", "channels_last"]
Allocator = Literal["default", "expandable_segments"]
Strategy = Literal["none", "ddp", "ddp-bucket-view", "fsdp", "fsdp-no-reshard"]
CompileScope = Literal["model", "blocks"]
Shapes = Literal["max", "buckets", "dynamic", "longest"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")

_STRICT: dict[str, Any] = {"extra": "forbid", "strict": True}


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """One point of the knob space, the micro-batch aside: what a memory probe holds fixed.

    Each field's default is what an untuned user runs; the baseline is ``Knobs()``.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT

    precision: Precision = "fp32"
    """fp32: full precision. tf32: fp32 storage, TensorFloat-32 matmuls (Ampere+). bf16/fp16:
    autocast halves many activations and speeds matmuls; fp16 adds a GradScaler."""
    compile_mode: CompileMode = "off"
    """torch.compile mode, or ``off`` (eager). Compiled code fuses ops (less activation memory,
    faster steps) at a compile cost; CUDA-graph modes keep static buffers."""
    checkpointing: Checkpointing = "off"
    """Activation checkpointing of the repeated blocks: ``blocks`` (every one) or
    ``alternate`` (every second): their activations are recomputed in backward instead of
    kept, so a larger micro-batch fits, at about one more forward of those blocks.
    ``budget-0.5`` (compiled modes only): torch.compile's partitioner keeps about half the
    activations it would keep and recomputes the cheapest of the rest
    (``activation_memory_budget``, ``memory_budget``)."""
    optimizer_impl: OptimizerImpl = "default"
    """The workload's optimizer as built (``default``), or rebuilt with the same groups and
    hyper-parameters as ``for-loop``, ``foreach`` (fewer kernel launches, temporaries the
    size of the parameters) or ``fused`` (one kernel per step)."""
    memory_format: MemoryFormat = "contiguous"
    """``channels_last`` stores 4-D images and conv weights NHWC: faster convolutions on
    tensor cores and oneDNN, the same memory."""
    allocator: Allocator = "default"
    """CUDA caching allocator: ``expandable_segments`` grows segments instead of caching
    fixed blocks: less fragmentation (reserved beyond allocated), so more fits."""
    strategy: Strategy = "none"
    """How the ranks of the job share the work: ``none`` (one process), ``ddp``
    (DistributedDataParallel: every rank holds the whole model; gradients all-reduced once per
    optimizer step, ``no_sync`` on the other micro-batches), ``ddp-bucket-view`` (its gradients
    are views into the all-reduce buckets: one copy of the gradients less), ``fsdp`` (FSDP2
    ``fully_shard`` per repeated block and the root: parameters, gradients and optimizer state
    sharded over the ranks, parameters gathered per block and freed after its forward) or
    ``fsdp-no-reshard`` (parameters kept gathered from forward to backward: one all-gather
    less per block, the memory of unsharded parameters)."""
    compile_scope: CompileScope = "model"
    """What ``torch.compile`` compiles when the compile mode is not ``off``: the whole model
    (``model``), or each repeated block on its own, in place, the rest eager (``blocks``,
    PyTorch's "regional compilation"): the blocks share one compiled graph, so the cold
    compile is about one block's instead of the whole model's; the eager rest (embeddings,
    head, loss) can make a step slower."""
    shapes: Shapes = "max"
    """How batches of varying length run (a workload that declares ``lengths``): padded to the
    worst case (``max``: one graph, compute spent on padding), to the next of a few bucket
    lengths (``buckets``: one static graph per bucket, kept under the recompile limit) or at
    their own length with the sequence dimension compiled dynamic (``dynamic``: one graph, no
    padding beyond the batch's longest sample, kernels not specialized to one length), or
    each padded to its own longest sample and run eager (``longest``: what a collate does,
    the baseline where lengths are declared; compiled, that padding is ``dynamic``). Memory
    is the worst case's under every policy."""

    @property
    def compiled(self) -> bool:
        """Run by ``torch.compile`` (any mode but ``off``)."""
        return self.compile_mode != "off"

    @property
    def distributed(self) -> bool:
        """A job of ranks sharing the work (any strategy but ``none``)."""
        return self.strategy != "none"

    @property
    def replicated(self) -> bool:
        """Every rank holds the whole model (``ddp``, ``ddp-bucket-view``)."""
        return self.strategy.startswith("ddp")

    @property
    def sharded(self) -> bool:
        """Parameters, gradients and optimizer state sharded over the ranks (``fsdp``,
        ``fsdp-no-reshard``)."""
        return self.strategy.startswith("fsdp")

    def label(self) -> str:
        """``bf16/default``, with every knob away from its default after it, e.g.
        ``fp32/off+ckpt=blocks+opt=fused``: unique, and read back by ``from_label``."""
        extras = "".join(f"+{k.tag}={getattr(self, k.name)}" for k in KNOBS[2:]
                         if getattr(self, k.name) != k.default)
        return f"{self.precision}/{self.compile_mode}{extras}"

    @classmethod
    def from_label(cls, text: str) -> Knobs:
        """The knobs a ``label()`` names.

        Raises:
            ConfigError: not a label of known knobs and values.
        """
        if not isinstance(text, str):
            raise ConfigError(f"{text!r} is not a knob label (not text)")
        return _knobs_of_label(text)

    @classmethod
    def checked(cls, **values: str) -> Knobs:
        """Knobs from user values (unknown names and values are all reported at once).

        Raises:
            ConfigError: each bad name or value, with the values there are.
        """
        problems = [f"{name} {value!r} is not one of {', '.join(KNOB[name].values)}"
                    if name in KNOB else f"{name!r} is not a knob"
                    for name, value in values.items()
                    if name not in KNOB or value not in KNOB[name].values]
        if problems:
            raise ConfigError("; ".join(problems))
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: str) -> Knobs:
        """A copy with some knobs changed."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def changed(self) -> tuple[str, ...]:
        """Names of the knobs beyond precision and compile mode set away from their default."""
        return tuple(k.name for k in KNOBS[2:] if getattr(self, k.name) != k.default)

    @property
    def cuda_graphs(self) -> bool:
        """Whether the compile mode replays CUDA graphs: a replay's outputs are static buffers
        that the next replay of the same graph overwrites (``step.train_step`` copies the
        gradients of a step's first micro-batch for that reason)."""
        return self.compile_mode in CUDA_GRAPH_MODES

    def graph(self) -> Knobs:
        """The knobs with those that leave the compiled model alone (``Knob.in_graph``) at
        their defaults: two settings with the same ``graph()`` compile the same graphs at one
        micro-batch, so the second loads them from inductor's cache."""
        return dataclasses.replace(self, **{  # type: ignore[arg-type]
            k.name: k.default for k in KNOBS if not k.in_graph})


@functools.lru_cache(maxsize=4096)
def _knobs_of_label(text: str) -> Knobs:
    """``Knobs.from_label``, kept per label (Knobs are frozen; a bad label raises each time):
    the search's records and the replay's tables name candidates by label, read back many
    thousand times a replayed search."""
    base, *extras = text.split("+")
    precision, sep, mode = base.partition("/")
    values: dict[str, str] = {"precision": precision, "compile_mode": mode}
    by_tag = {k.tag: k for k in KNOBS}
    for extra in extras:
        tag, _, value = extra.partition("=")
        if tag not in by_tag:
            raise ConfigError(f"{text!r}: unknown knob {tag!r} (known: "
                              f"{', '.join(k.tag for k in KNOBS[2:])})")
        values[by_tag[tag].name] = value
    problems = [f"{k.name} {values[k.name]!r} is not one of {', '.join(k.values)}"
                for k in KNOBS if k.name in values and values[k.name] not in k.values]
    if not sep or problems:
        raise ConfigError(f"{text!r} is not a knob label ({'; '.join(problems) or 'no /'})")
    return Knobs(**values)  # type: ignore[arg-type]


class HasKnobs:
    """The two knobs every reader asks for, on a value that holds ``knobs`` (a trial spec, a
    trial record, the tuned config)."""

    @property
    def precision(self) -> str:
        """``knobs.precision``."""
        return self.knobs.precision  # type: ignore[attr-defined]

    @property
    def compile_mode(self) -> str:
        """``knobs.compile_mode``."""
        return self.knobs.compile_mode  # type: ignore[attr-defined]

    @property
    def compiled(self) -> bool:
        """``knobs.compiled``: run by ``torch.compile``."""
        return self.knobs.compiled  # type: ignore[attr-defined]


BASELINE = Knobs()
"""fp32 eager, nothing else changed: what an untuned user runs on one process."""


def job_baseline(strategy: str = "none") -> Knobs:
    """What an untuned user runs in a job of ``strategy``: fp32 eager, nothing else changed
    (the baseline of a search of several ranks keeps their strategy)."""
    return BASELINE.with_(strategy=strategy)


def timed_baseline(knobs: Knobs, has_lengths: bool) -> Knobs:
    """The setting the baseline is timed as: ``knobs`` (fp32 eager, or what rescued it where
    it fits nothing), and where the workload declares lengths each batch padded to its own
    longest sample (``shapes=longest``), as a user's collate pads it. Its memory is its
    probe's at the worst case (``knobs``): the longest possible batch must fit."""
    return knobs.with_(shapes="longest") if has_lengths else knobs


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One knob: its values, where it applies, and what it does (for help and the report)."""

    name: str
    """Its field of ``Knobs`` and key in ``autotune.json``."""
    tag: str
    """Its short name in labels (``ckpt=blocks``)."""
    option: str
    """Its CLI option (comma-separated values)."""
    values: tuple[str, ...]
    default: str
    help: str
    """What it does, and its memory and speed trade-off (the CLI's help, the README's)."""
    words: dict[str, str] = dataclasses.field(default_factory=dict)
    """What each value does, in a phrase: its line in the report and the generated script
    (``describe``; every knob beyond precision and compile mode has one per value)."""
    eager_words: str = ""
    """Its phrase for every value where nothing is compiled (``compile_scope``: what the
    compiler compiles means nothing eager); empty: ``words``."""
    cuda_only: tuple[str, ...] = ()
    """Values only a CUDA device runs (precision and compile mode: the device backend says)."""
    needs: Callable[[str, WorkloadTraits], str | None] = lambda value, traits: None
    """Why the workload cannot use a value (None: it can)."""
    frees_memory: tuple[str, ...] = ()
    """Values that free memory, most first: each is worth a boundary probe of its own where
    memory binds (and may make fit what did not fit at all), never where it does not."""
    by_default: tuple[str, ...] | None = None
    """The values a search tries when its option is not given (None: every value)."""
    default_help: str = ""
    """What its option's help says is tried when the option is not given, where that is not
    every value (``by_default``, or a default that depends on the workload or the ranks)."""
    families: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Names its option also takes for several values (``--strategy ddp``: plain DDP and its
    memory option)."""
    in_graph: bool = True
    """Whether its value changes what ``torch.compile`` compiles (False: the optimizer, which
    runs eager, and the allocator)."""
    compiled_only: tuple[str, ...] = ()
    """Values that act only where the model is compiled (the compiler applies them): beside
    compile_mode off such a value means nothing, so the space holds the knob's default there
    (``meaningful``: no duplicate runs), the search skips it with the reason
    (``skip_reason``) and a file pairing the two is refused."""
    per_class: bool = False
    """Whether its best value depends on the memory class (``shapes``: padding and recompiles
    cost eager and compiled code differently): besides the leader, the knobs stage screens it
    on each other class's best setting that could still win with it."""
    runs_as: dict[tuple[str, bool], tuple[str, str]] = dataclasses.field(default_factory=dict)
    """Values that run as another value where the model is compiled (True) or eager (False),
    with why: the search times that one (``meaningful``; ``skip_reason`` says it)."""
    said_at_default: bool = True
    """Whether the generated script's tuned block says it at its default (False: ``shapes``,
    whose default is what a fixed-shape workload runs: its script stays as it was)."""


KNOBS: tuple[Knob, ...] = (
    Knob(name="precision", tag="precision", option="--precisions", values=PRECISIONS,
         default="fp32", help="fp32, tf32 (CUDA), bf16 (autocast), fp16 (autocast + GradScaler): "
         "lower precision halves activations and speeds matmuls where the device has units for it"),
    Knob(name="compile_mode", tag="compile", option="--compile-modes", values=COMPILE_MODES,
         default="off", help="torch.compile mode or off: fused kernels, less activation memory, "
         "a compile cost"),
    Knob(name="checkpointing", tag="ckpt", option="--checkpointing",
         values=get_args(Checkpointing), default="off", needs=traits.checkpointing_needs,
         frees_memory=("blocks", "budget-0.5", "alternate"), compiled_only=("budget-0.5",),
         words={"off": "no activation checkpointing",
                "blocks": "activation checkpointing of every repeated block",
                "alternate": "activation checkpointing of every second block",
                "budget-0.5": "the compiler recomputes (activation_memory_budget 0.5: about "
                              "half the activations kept)"},
         help="activation checkpointing of the repeated blocks (every one, or every second): "
         "frees their activations for a larger micro-batch, costs about one more forward of "
         "them; budget-0.5 (compiled modes only): torch.compile keeps about half the "
         "activations and recomputes the cheapest rest (activation_memory_budget)"),
    Knob(name="optimizer_impl", tag="opt", option="--optimizer-impls",
         values=get_args(OptimizerImpl), default="default", needs=traits.optimizer_needs,
         in_graph=False,
         words={"default": "the workload's optimizer as built",
                "for-loop": "optimizer rebuilt for-loop", "foreach": "optimizer rebuilt foreach",
                "fused": "optimizer rebuilt fused"},
         help="the workload's optimizer as built, or rebuilt for-loop, foreach (fewer "
         "launches, temporaries as large as the parameters) or fused (one kernel)"),
    Knob(name="memory_format", tag="format", option="--memory-formats",
         values=get_args(MemoryFormat), default="contiguous", needs=traits.format_needs,
         words={"contiguous": "contiguous tensors",
                "channels_last": "channels_last model and images"},
         help="channels_last for 2-D convolutions on 4-D images: faster convolutions, the same "
         "memory"),
    Knob(name="allocator", tag="alloc", option="--allocators", values=get_args(Allocator),
         default="default", cuda_only=("expandable_segments",),
         frees_memory=("expandable_segments",), in_graph=False,
         words={"default": "the default CUDA allocator",
                "expandable_segments": "CUDA allocator expandable_segments"},
         help="CUDA allocator setting expandable_segments: less fragmentation, so more fits"),
    Knob(name="strategy", tag="dp", option="--strategy", values=get_args(Strategy),
         default="none", frees_memory=("fsdp", "ddp-bucket-view"), by_default=("none",),
         families={"ddp": ("ddp", "ddp-bucket-view"), "fsdp": ("fsdp", "fsdp-no-reshard")},
         default_help="Default: none with one process, ddp with --nproc-per-node above 1.",
         words={"none": "one process, no process group",
                "ddp": "DistributedDataParallel, no_sync but on the last micro-batch",
                "ddp-bucket-view": "DistributedDataParallel, gradient_as_bucket_view",
                "fsdp": "FSDP2 fully_shard per block and root, resharded after forward",
                "fsdp-no-reshard": "FSDP2 fully_shard, parameters kept from forward to "
                                   "backward"},
         help="how the ranks of --nproc-per-node share the work: none (one process), ddp "
         "(DistributedDataParallel; ddp-bucket-view: one copy of the gradients less) or fsdp "
         "(FSDP2: parameters, gradients and optimizer state sharded over the ranks; "
         "fsdp-no-reshard: faster, parameters stay gathered from forward to backward); ddp "
         "and fsdp name both of their values"),
    Knob(name="compile_scope", tag="scope", option="--compile-scopes",
         values=get_args(CompileScope), default="model", needs=traits.scope_needs,
         compiled_only=("blocks",),
         words={"model": "torch.compile of the whole model",
                "blocks": "each repeated block compiled on its own (regional compilation), "
                          "the rest eager"},
         eager_words="nothing compiled (eager)",
         help="what torch.compile compiles in a compiled setting: the whole model, or each "
         "repeated block on its own (regional compilation: the blocks share one graph, so a "
         "much shorter cold compile, the rest of the model eager)"),
    Knob(name="shapes", tag="shapes", option="--shapes", values=get_args(Shapes),
         default="max", needs=traits.shapes_needs, said_at_default=False, per_class=True,
         default_help="Default: every value where the workload declares lengths, max alone "
         "otherwise.",
         runs_as={("dynamic", False): ("longest", "nothing compiled reads the dynamic mark"),
                  ("longest", True): ("dynamic", "the same padding; marked dynamic, one graph "
                                      "serves every length (unmarked, a static graph is "
                                      "compiled first and a dynamic one at the next length)")},
         words={"max": "every batch padded to the worst-case length",
                "buckets": "batches padded to the next bucket length, one static graph each",
                "dynamic": "batches at their own length, sequence dimension compiled dynamic",
                "longest": "each batch padded to its own longest sample (as a collate pads)"},
         help="how batches of varying length run, where the workload declares lengths: max "
         "(padded to the worst case: one graph, compute spent on padding), buckets (padded to "
         "the next of a few lengths from the distribution: one static graph each, under the "
         "recompile limit), dynamic (the sequence dimension compiled dynamic: one graph, no "
         "padding) or longest (each batch padded to its longest sample, eager: what a collate "
         "does, the baseline); memory is always the worst case's"),
)
"""Every knob, precision and compile mode first (they form a label's base)."""
KNOB = {k.name: k for k in KNOBS}


class KnobUnsupported(Exception):
    """A knob value cannot apply to this workload (e.g. ``fused`` for an optimizer without
    it): the run's outcome is ``unsupported``, a reason to skip, never a failure."""





def memory_budget(checkpointing: str) -> float | None:
    """The ``torch._functorch.config.activation_memory_budget`` a checkpointing value sets
    (``budget-0.5``: 0.5), or None for one that checkpoints blocks (or none)."""
    prefix, _, share = checkpointing.partition("-")
    return float(share) if prefix == "budget" else None
