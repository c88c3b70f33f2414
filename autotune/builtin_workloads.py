"""The workloads a spec names (``load_workload``): the built-in default (a GPT in plain
torch, sized to the device: ``default_workload``), a Hugging Face model by name
(``hf_workload``), or a user's file and factory (``user_code``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.config import WorkloadSpec
from autotune.errors import ConfigError, WorkloadError
from autotune.user_code import exited, import_file, split_factory, with_traceback
from autotune.workload import Workload


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
    module = import_file(path)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise WorkloadError(
            f"{path} has no callable {factory_name!r}; define a function that returns "
            "autotune.Workload and name it after the colon"
        )
    try:
        workload = factory()
    except SystemExit as exc:
        raise exited(exc) from exc
    except Exception as exc:
        raise WorkloadError(with_traceback(
            f"workload factory {spec.target} raised {type(exc).__name__}: {exc}", exc)) from exc
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload factory {spec.target} returned {type(workload).__name__}; "
            "it must return autotune.Workload(name=..., build_model=..., make_batch=...)"
        )
    return workload
