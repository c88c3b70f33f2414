"""Workloads: what to train. Model, worst-case batch, loss and optimizer factories.

A workload holds code, so it never crosses a process boundary: a ``WorkloadSpec`` does, and
``load_workload`` rebuilds the workload inside the child process that runs it.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.config import WorkloadSpec
from autotune.errors import ConfigError, WorkloadError
from autotune.files import not_a_file
from autotune.names import KEYWORDS, Names
from autotune.serialize import control_character

Batch = Any  # a tensor, a tuple/list of tensors, or a dict of tensors


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to train: the factories autotune calls inside each child process.

    Example:
        >>> autotune.Workload(
        ...     name="my-model",
        ...     build_model=lambda: MyModel(),
        ...     make_batch=lambda micro_batch: {"x": torch.randn(micro_batch, 512)},
        ...     loss=lambda model, batch: model(**batch).loss,
        ... )
    """

    name: str
    """Shown in reports and stored in ``autotune.json``."""
    build_model: Callable[[], nn.Module]
    """Returns the model on the CPU; called inside the child process (never in the parent)."""
    make_batch: Callable[..., Batch]
    """Returns the WORST-CASE batch of ``micro_batch`` samples (max sequence length, largest
    image): probes must see the largest memory the real data can ask for. A workload that
    declares ``lengths`` takes the length too, ``make_batch(micro_batch, length)``: a batch
    whose sequence dimension (dim 1) is ``length``."""
    loss: Callable[[nn.Module, Batch], torch.Tensor] | None = None
    """Scalar mean loss of one micro-batch. Default: ``model(**batch).loss`` for dict batches
    (Hugging Face outputs), ``model(*batch).loss`` for tuples, ``model(batch).loss`` else."""
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None
    """Default: AdamW(lr=1e-4): two fp32 state tensors per parameter."""
    count_loss_items: Callable[[Batch], torch.Tensor | int] | None = None
    """How many items (e.g. label tokens) a micro-batch's mean loss averages over. When given,
    micro-batch losses are weighted by their share of the whole effective batch, so a token
    loss is normalized once over all tokens of the optimizer step."""
    tokens_per_sample: int | None = None
    """For tokens/s in reports (sequence length for language models). With ``lengths``, the
    worst-case length (default: the longest length)."""
    lengths: Sequence[int] | Callable[[], Sequence[int]] | None = None
    """Real sequence lengths (a sample of the dataset's token counts, or a function returning
    one, e.g. read from the dataset): batches vary in length, and the ``shapes`` knob tunes how
    they are padded and compiled (``docs/shapes.md``). Memory is probed at the worst case;
    speed on batches drawn from these lengths. None: every batch has the worst-case shape."""
    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
    """The model's repeated blocks, for activation checkpointing (and FSDP's per-block
    wrapping). Default: the longest run of same-type modules in a ``ModuleList`` or
    ``Sequential`` (``knobs.find_blocks``)."""

    def __post_init__(self) -> None:
        """Refuse a name with a control character: it is stored in ``autotune.json`` and
        written into the files made from it (comments of ``autotune export``'s TOML and YAML,
        the script's header), where a line break would start configuration or code.

        Raises:
            ConfigError: the name holds a control character (a line break, a tab, ...).
        """
        bad = control_character(self.name) if isinstance(self.name, str) else None
        if bad is not None:
            raise ConfigError(f"Workload(name={self.name!r}) holds the control character "
                              f"{bad}: a workload's name is one line of text; pass a name "
                              "without line breaks, tabs or escapes")

    def compute_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The workload's loss on one micro-batch."""
        if self.loss is not None:
            return self.loss(model, batch)
        if isinstance(batch, dict):
            args, kwargs, call = (), batch, "model(**batch)"
        elif isinstance(batch, (tuple, list)):
            args, kwargs, call = tuple(batch), {}, "model(*batch)"
        else:
            args, kwargs, call = (batch,), {}, "model(batch)"
        try:
            out = model(*args, **kwargs)
        except TypeError as exc:
            inner = _unwrapped(model)
            if not _refuses(inner, args, kwargs):
                raise  # a TypeError inside the model's own code: the model's to fix
            raise WorkloadError(
                f"workload {self.name!r}: the default loss calls {call}, and "
                f"{type(inner).__name__}.forward does not take that batch ({exc}); pass "
                "loss=lambda model, batch: ... (e.g. loss=lambda model, batch: "
                "torch.nn.functional.mse_loss(model(batch[0]), batch[1])) to autotune.Workload"
            ) from exc
        loss = getattr(out, "loss", None)
        if loss is None:
            raise WorkloadError(
                f"workload {self.name!r}: the default loss is {call}.loss, and the model "
                f"returned {type(out).__name__}, which has no .loss; pass loss=lambda model, "
                "batch: ... to autotune.Workload"
            )
        return loss

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The workload's optimizer, AdamW by default."""
        if self.build_optimizer is not None:
            return self.build_optimizer(params)
        return torch.optim.AdamW(params, lr=1e-4)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The user's model under a compile or DDP wrapper (whose forward takes anything)."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return getattr(model, "_orig_mod", model)


def _refuses(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the model's forward cannot take these arguments (its signature refuses them)."""
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:  # no signature to read (a builtin)
        return False
    return False


def check_batch(batch: Batch, micro_batch: int, name: str) -> None:
    """Check that ``make_batch(micro_batch)`` returned tensors with ``micro_batch`` rows.

    Raises:
        WorkloadError: wrong type, no tensors, or a leading dimension that is not the micro-batch.
    """
    tensors = _tensors(batch)
    if tensors is None or not tensors:
        raise WorkloadError(
            f"workload {name!r}: make_batch({micro_batch}) returned {type(batch).__name__}; "
            "it must return a tensor, a tuple of tensors or a dict of tensors"
        )
    for key, tensor in tensors:
        if tensor.dim() == 0 or tensor.shape[0] != micro_batch:
            raise WorkloadError(
                f"workload {name!r}: make_batch({micro_batch}) returned {key} with shape "
                f"{tuple(tensor.shape)}; its first dimension must be the micro-batch "
                f"({micro_batch})"
            )


def _tensors(batch: Batch) -> list[tuple[str, torch.Tensor]] | None:
    if isinstance(batch, torch.Tensor):
        return [("the tensor", batch)]
    if isinstance(batch, dict):
        items = list(batch.items())
    elif isinstance(batch, (tuple, list)):
        items = [(f"item {i}", v) for i, v in enumerate(batch)]
    else:
        return None
    if not all(isinstance(v, torch.Tensor) for _, v in items):
        return None
    return [(str(k), v) for k, v in items]


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Move a batch (tensor, tuple/list or dict of tensors) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return type(batch)(to_device(v, device) for v in batch)


def batch_bytes(batch: Batch) -> int:
    """Bytes of a batch's tensors."""
    if isinstance(batch, torch.Tensor):
        return batch.nelement() * batch.element_size()
    values = batch.values() if isinstance(batch, dict) else batch
    return sum(batch_bytes(v) for v in values if isinstance(v, (torch.Tensor, dict, tuple, list)))


def load_workload(spec: WorkloadSpec, device: str = "cpu") -> Workload:
    """Rebuild the workload a spec names.

    Args:
        spec: which workload.
        device: sizes the built-in default (tiny on CPU, GPT-2 small on CUDA).

    Raises:
        WorkloadError: the file or factory fails, or returns something that is not a Workload.
        ConfigError: the spec is malformed (e.g. ``file`` without ``:factory``).
    """
    if spec.kind == "default":
        return default_workload(device)
    if spec.kind == "hf":
        return hf_workload(spec.target, seq_len=spec.seq_len, pretrained=spec.pretrained,
                           lengths=spec.lengths)
    path, factory_name = split_factory(spec.target)
    module = _import_file(path)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise WorkloadError(
            f"{path} has no callable {factory_name!r}; define a function that returns "
            "autotune.Workload and name it after the colon"
        )
    try:
        workload = factory()
    except SystemExit as exc:
        raise _exited(exc) from exc
    except Exception as exc:
        raise WorkloadError(_with_traceback(
            f"workload factory {spec.target} raised {type(exc).__name__}: {exc}", exc)) from exc
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload factory {spec.target} returned {type(workload).__name__}; "
            "it must return autotune.Workload(name=..., build_model=..., make_batch=...)"
        )
    return workload


def split_factory(target: str, name: Names = KEYWORDS) -> tuple[Path, str]:
    """Split ``path/to/file.py:factory`` and check the file exists.

    Args:
        target: the workload as given.
        name: how the user wrote the setting (``--workload`` or ``workload=``).

    Raises:
        ConfigError: no ``:factory`` part, or the file does not exist.
    """
    given = name.given("workload", target)
    path_text, sep, factory = target.rpartition(":")
    if not sep or not path_text or not factory.isidentifier():
        raise ConfigError(
            f"{given} must look like path/to/file.py:factory "
            "(a Python file and the function in it that returns autotune.Workload)"
        )
    path = Path(path_text)
    if path.is_dir():
        raise ConfigError(
            f"workload file {path_text!r} is a directory, not a Python file (from {given}): "
            f"name the .py file that defines {factory}, e.g. {path_text}/model.py")
    kind = not_a_file(path)
    if kind is not None:
        raise ConfigError(
            f"workload file {path_text!r} is {kind}, not a regular file (from {given}): name "
            f"the .py file that defines {factory}")
    if not path.is_file():
        raise ConfigError(f"workload file {path_text!r} does not exist (from {given})")
    return path, factory


def _import_file(path: Path) -> Any:
    module_name = f"autotune_user_workload_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise _exited(exc) from exc
    except Exception as exc:
        raise WorkloadError(_with_traceback(
            f"importing workload file {path} raised {type(exc).__name__}: {exc}", exc)) from exc
    return module


def _exited(exc: SystemExit) -> WorkloadError:
    error = WorkloadError.from_exit(exc)
    return WorkloadError(_with_traceback(str(error), exc))


def _with_traceback(message: str, exc: BaseException) -> str:
    frames = user_traceback(exc)
    return f"{message}\n{frames}" if frames else message


_MAX_USER_FRAMES = 6
_NOT_USER_CODE = tuple(
    os.path.realpath(p) + os.sep
    for p in (Path(__file__).parent, Path(torch.__file__).parent, sysconfig.get_paths()["stdlib"])
)


def user_traceback(exc: BaseException) -> str:
    """The workload's own frames of the traceback of ``exc`` (of its cause, when ``exc`` is a
    ``WorkloadError`` wrapping one), most recent last: at most 6 frames, 2 lines each.

    Frames in autotune's, torch's and the standard library's files are left out: the user needs
    the line of their code that failed, not ours. Empty when no frame is the workload's.
    """
    if isinstance(exc, WorkloadError) and exc.__cause__ is not None:
        exc = exc.__cause__
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<")
              and not os.path.realpath(frame.filename).startswith(_NOT_USER_CODE)]
    if not frames:
        return ""
    lines = ["Traceback (the workload's frames, most recent call last):"]
    if len(frames) > _MAX_USER_FRAMES:
        lines.append(f"  ... {len(frames) - _MAX_USER_FRAMES} earlier frames")
    for frame in frames[-_MAX_USER_FRAMES:]:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    return "\n".join(lines)


def check_model(model: Any, name: str) -> None:
    """Check that ``build_model()`` returned an ``nn.Module`` with something to train.

    Raises:
        WorkloadError: not a module, or no parameter that requires grad.
    """
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"workload {name!r}: build_model returned {type(model).__name__}; it must return a "
            "torch.nn.Module"
        )
    params = list(model.parameters())
    if not any(p.requires_grad for p in params):
        what = (f"all {len(params)} of its parameter tensors are frozen (requires_grad=False)"
                if params else "it has no parameters")
        raise WorkloadError(
            f"workload {name!r}: the model build_model returned has nothing to train: {what}; "
            "leave at least one parameter trainable"
        )


def check_loss(loss: Any, name: str) -> None:
    """Check that a workload's loss is a scalar floating-point tensor that requires grad.

    Reads only metadata (type, ``dim``, ``dtype``, ``requires_grad``): no device sync, and it
    works on fake tensors.

    Raises:
        WorkloadError: what the loss is instead, and how to fix it.
    """
    if not isinstance(loss, torch.Tensor):
        seen = type(loss).__name__
        if isinstance(loss, (int, float, bool)):
            seen += f" {loss!r}"
        raise WorkloadError(
            f"workload {name!r}: loss returned {seen}; it must return a scalar torch.Tensor "
            "that requires grad"
        )
    if loss.dim() != 0:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor of shape {tuple(loss.shape)}; it must be "
            "a scalar: reduce it, e.g. .mean()"
        )
    if not loss.dtype.is_floating_point:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor of dtype {loss.dtype}; it must be "
            "floating point (e.g. .float() before reducing)"
        )
    if not loss.requires_grad:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor that does not require grad; it must be "
            "computed from the model's output (not under torch.no_grad(), not detached)"
        )


# ----------------------------------------------------------------------------------------------
# The built-in default: a GPT in plain torch, sized to the device.


class _Block(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc_out(nn.functional.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """A GPT-2-style causal LM (pre-norm blocks, SDPA attention, tied embeddings)."""

    def __init__(self, *, vocab_size: int, seq_len: int, dim: int, num_layers: int,
                 num_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(_Block(dim, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)  # GPT-2's init: loss starts near ln(V)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over label tokens that are not -100."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )


@dataclass(frozen=True)
class Demo:
    """What the built-in workload's search tries on CPU where the user said nothing: a first
    search that ends in minutes on a small CPU and shows what the tool is for (the target
    batch not fitting as one micro-batch, reached by micro-batch x accumulation, and the knob
    that frees memory for a larger micro-batch), measured as every search measures. Each
    default is said on the search's first lines, with the flag that changes it."""

    memory_budget: str = "120MiB"
    """A budget that the tiny GPT's target batch of 64 overflows in fp32 eager (about 250 MiB
    at 64, 110 MiB at 16 on the CPUs on record), as a model fills a GPU."""
    compile_modes: tuple[str, ...] = ("off",)
    """Compiles are left out: each costs 30-60 s of a 2-core CPU, and on the CPUs on record
    compiled code ran this model 0.44x-1.1x eager."""

    def notes(self, *, budget: bool, compile_modes: bool) -> tuple[str, ...]:
        """The lines that say which defaults applied."""
        return tuple(text for used, text in (
            (budget, f"the built-in CPU demo's memory budget {self.memory_budget}, so the "
                     "target batch does not fit as one micro-batch (--memory-budget to change)"),
            (compile_modes, "the built-in CPU demo leaves torch.compile out (a compile takes "
                            "30-60 s of a small CPU; --compile-modes off,default to try it)"),
        ) if used)


CPU_DEMO = Demo()


def default_workload(device: str = "cpu") -> Workload:
    """The built-in workload: a small GPT on CPU, a GPT-2-small-sized one on CUDA.

    On CPU it is tiny (2 layers, width 128, 128 tokens) so a whole search takes minutes;
    on CUDA it is GPT-2 small (12 layers, width 768, 1024 tokens, 124M parameters).
    """
    if str(device).startswith("cuda"):
        sizes = dict(vocab_size=50304, seq_len=1024, dim=768, num_layers=12, num_heads=12)
        name = "default-gpt2-small"
    else:
        sizes = dict(vocab_size=1024, seq_len=128, dim=128, num_layers=2, num_heads=4)
        name = "default-tiny-gpt"
    vocab_size, seq_len = sizes["vocab_size"], sizes["seq_len"]

    def make_batch(micro_batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab_size, (micro_batch, seq_len))
        return {"input_ids": ids, "labels": ids}

    return Workload(
        name=name,
        build_model=lambda: TinyGPT(**sizes),
        make_batch=make_batch,
        loss=lambda model, batch: model(**batch),
        count_loss_items=causal_lm_label_count,
        tokens_per_sample=seq_len,
    )


def causal_lm_label_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label tokens a causal-LM loss averages over (shifted by one, -100 ignored)."""
    return (batch["labels"][:, 1:] != -100).sum()


def masked_lm_label_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label tokens a masked-LM loss averages over (-100 ignored)."""
    return (batch["labels"] != -100).sum()


# ----------------------------------------------------------------------------------------------
# Hugging Face models, built from their config with random weights.

_MAX_DEFAULT_SEQ_LEN = 1024


def hf_workload(name: str, *, seq_len: int | None = None, pretrained: bool = False,
                lengths: Sequence[int] | None = None) -> Workload:
    """A Hugging Face causal-LM, masked-LM or sequence classifier, from its config.

    Args:
        name: a model id (needs the network or the local HF cache) or a local directory.
        seq_len: worst-case sequence length; default the model's maximum, capped at 1024.
        pretrained: load real weights (a download); random weights otherwise.
        lengths: real sequence lengths (``--lengths``): batches are then built at a length.

    Raises:
        WorkloadError: the config cannot be found or the architecture is not supported.
    """
    import transformers

    config = hf_config(name)
    arch = " ".join(getattr(config, "architectures", None) or [])
    if "MaskedLM" in arch or "ForPreTraining" in arch:
        auto, task = transformers.AutoModelForMaskedLM, "masked-lm"
    elif "SequenceClassification" in arch:
        auto, task = transformers.AutoModelForSequenceClassification, "classifier"
    else:
        auto, task = transformers.AutoModelForCausalLM, "causal-lm"
    max_len = _max_positions(config)
    seq = seq_len or min(max_len or _MAX_DEFAULT_SEQ_LEN, _MAX_DEFAULT_SEQ_LEN)
    if max_len and seq > max_len:
        raise ConfigError(f"--seq-len {seq} is longer than {name}'s maximum of {max_len} tokens")
    vocab_size = int(config.vocab_size)
    num_labels = int(getattr(config, "num_labels", 2) or 2)

    def build_model() -> nn.Module:
        if pretrained:
            return auto.from_pretrained(name)
        return auto.from_config(config)

    def make_batch(micro_batch: int, length: int = seq) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab_size, (micro_batch, length))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if task == "classifier":
            batch["labels"] = torch.randint(0, num_labels, (micro_batch,))
        else:
            batch["labels"] = ids.clone()
        return batch

    counts = {"causal-lm": causal_lm_label_count, "masked-lm": masked_lm_label_count}
    return Workload(
        name=f"{name} ({task}, seq {seq})",
        build_model=build_model,
        make_batch=make_batch,
        count_loss_items=counts.get(task),
        tokens_per_sample=seq,
        lengths=lengths,
    )


def hf_config(name: str) -> Any:
    """Load a Hugging Face config without weights.

    A local directory or the Hub (or the local HF cache) first; offline, a few well-known model
    ids (gpt2, distilgpt2, gpt2-medium, bert-base-uncased, roberta-base) come from configs shipped
    in ``autotune.hf_configs``.

    Raises:
        WorkloadError: not a local directory, not reachable (offline) and not shipped, or unknown.
    """
    import transformers

    from autotune.hf_configs import known_config

    shipped = known_config(name)
    try:
        if shipped is not None and not Path(name).is_dir():
            # The local cache, else the shipped copy: no network round trips (and retries).
            try:
                return transformers.AutoConfig.from_pretrained(name, local_files_only=True)
            except Exception:
                return transformers.AutoConfig.for_model(shipped.pop("model_type"), **shipped)
        return transformers.AutoConfig.from_pretrained(name)
    except Exception as exc:
        raise WorkloadError(
            f"cannot load the Hugging Face config for {name!r} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Give a local directory holding "
            "config.json, or a model id with network access (or in the local HF cache); "
            "offline, autotune ships configs only for gpt2, distilgpt2, gpt2-medium, "
            "bert-base-uncased and roberta-base"
        ) from exc


def _max_positions(config: Any) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and 0 < value < 10**7:
            return value
    return None


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
