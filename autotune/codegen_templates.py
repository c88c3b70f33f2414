"""The text of ``train_autotuned.py``, filled in by ``autotune.codegen``. No torch import here.

``$name`` placeholders are filled by ``string.Template`` (the Python code itself has no ``$``).
``TINY_GPT`` is ``autotune.workload.TinyGPT`` as plain source; a test keeps the two identical.
``SCRIPT`` carries ``autotune.knobs``' changes to the model, the optimizer and the batches as
plain functions (``find_blocks``, ``checkpoint_blocks``, ``rebuild_optimizer``, ``parallelize``,
``to_device``); tests keep them equal to the library's (the same blocks, the same gradients,
also over DDP and FSDP ranks, the same optimizer groups). The script's code is the same for
every value of a knob: values enter as literals.
"""

from __future__ import annotations

import string

TINY_GPT = '''
class Block(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc_out(nn.functional.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """A GPT-2-style causal LM (pre-norm blocks, SDPA attention, tied embeddings)."""

    def __init__(self, *, vocab_size, seq_len, dim, num_layers, num_heads):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids, labels):
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


model_args = $sizes


def build_model():
    return TinyGPT(**model_args)


def get_batch(micro_batch):
    """Random tokens at the full sequence length: replace with your data."""
    ids = torch.randint(0, model_args["vocab_size"], (micro_batch, model_args["seq_len"]))
    return {"input_ids": ids, "labels": ids}


def compute_loss(model, batch):
    return model(**batch)


def count_loss_items(batch):
    """Label tokens the loss averages over (shifted by one, -100 ignored)."""
    return (batch["labels"][:, 1:] != -100).sum()


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


model_blocks = None  # the repeated blocks to checkpoint: found by find_blocks() below
'''

HF = '''
model_name = $name  # a Hub id, or a local directory holding config.json
seq_len = $seq_len
$shipped


@functools.cache
def hf_config():
    """The model's config, read when first needed (so --help needs no network): from a local
    directory, the Hub or the local HF cache (HF_HUB_OFFLINE=1: the cache only)."""
    if shipped_config is not None and not os.path.isdir(model_name):
        try:  # the local cache, else the copy above: no network round trips
            return transformers.AutoConfig.from_pretrained(model_name, local_files_only=True)
        except (OSError, ValueError):
            return transformers.AutoConfig.for_model(**shipped_config)
    try:
        return transformers.AutoConfig.from_pretrained(model_name)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"cannot load the config of {model_name!r} ({exc}). Set model_name above to a local "
            "directory holding its config.json, or run once with network access (after that "
            "HF_HUB_OFFLINE=1 reads it from the local HF cache)") from None


def build_model():
    return transformers.$auto.$build


def get_batch(micro_batch, length=seq_len):
    """Random tokens at the full sequence length: replace with your data."""
    ids = torch.randint(0, hf_config().vocab_size, (micro_batch, length))
    labels = $labels
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def compute_loss(model, batch):
    return model(**batch).loss

$count
def make_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


model_blocks = None  # checkpointing uses the model's own switch
'''

HF_COUNTS = {
    "causal-lm": ('''
def count_loss_items(batch):
    """Label tokens the loss averages over (shifted by one, -100 ignored)."""
    return (batch["labels"][:, 1:] != -100).sum()

'''),
    "masked-lm": ('''
def count_loss_items(batch):
    """Label tokens the loss averages over (-100 ignored)."""
    return (batch["labels"] != -100).sum()

'''),
    "classifier": ("\ncount_loss_items = None  # one label per sample: micro-batches weigh alike"
                   "\n\n"),
}

HF_AUTO = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
            "classifier": "AutoModelForSequenceClassification"}

FILE = '''
# Your workload factory, imported by path under a private name (a file named model.v2.py or
# time.py imports as itself); its folder goes on sys.path for its own imports.
workload_file = $path
sys.path.insert(0, str(workload_file.parent))
workload_spec = importlib.util.spec_from_file_location("_autotune_workload", workload_file)
workload_module = importlib.util.module_from_spec(workload_spec)
sys.modules[workload_spec.name] = workload_module  # dataclasses and pickle look it up here
workload_spec.loader.exec_module(workload_module)
workload = vars(workload_module)[$factory]()  # the factory autotune.json names

build_model = workload.build_model
get_batch = workload.make_batch  # worst-case batches: replace with your data
compute_loss = workload.compute_loss
count_loss_items = workload.count_loss_items
make_optimizer = workload.make_optimizer
model_blocks = getattr(workload, "blocks", None)  # None: found by find_blocks() below
'''


SHAPES = '''
# Batches of varying length (the workload declares its lengths): each is padded as the tuned
# shape policy says. Memory was measured at the worst case; speed on these lengths.
shapes = $shapes  # max (pad to the worst case), buckets (to bucket_lengths) or dynamic
# A sample of real sequence lengths (None: every batch at one shape).
lengths = $lengths
# The worst-case length (memory was measured there).
worst_length = $worst


def bucket_lengths_of(lengths, micro_batch, count=$count, multiple=$multiple):
    """Up to `count` lengths, ascending, the last the longest: one static graph each. A batch
    is padded to its longest sample: each bucket is a quantile k/count of that longest length
    (the lengths' quantile (k/count) ** (1/micro_batch)), rounded up to `multiple`."""
    ordered = sorted(lengths)
    chosen = set()
    for k in range(1, count + 1):
        at = ordered[max(0, math.ceil((k / count) ** (1 / micro_batch) * len(ordered)) - 1)]
        chosen.add(min(ordered[-1], -(-at // multiple) * multiple))
    return sorted(chosen)


def pad_to(longest):
    """The length a batch whose longest sample has `longest` tokens is padded to."""
    if shapes == "dynamic":
        return longest
    if shapes == "buckets":
        return next((b for b in bucket_lengths if b >= longest), worst_length)
    return worst_length


if lengths:
    bucket_lengths = bucket_lengths_of(lengths, micro_batch)
    if shapes == "buckets":
        compile_dynamic = False  # one static graph per bucket, under the recompile limit
    make_batch_at = get_batch
    move_batch = to_device

    def get_batch(micro_batch):
        """Synthetic: the longest of micro_batch lengths drawn from the sample, padded to
        pad_to(longest). Your collate pads each batch of real data to pad_to(its longest)."""
        longest = max(random.choices(lengths, k=micro_batch))
        return make_batch_at(micro_batch, pad_to(longest))

    def to_device(batch, device):
        batch = move_batch(batch, device)
        if shapes == "dynamic":  # one graph for every length: the sequence dim is dynamic
            for tensor in batch.values() if isinstance(batch, dict) else batch:
                if tensor.dim() >= 2:
                    torch._dynamo.mark_dynamic(tensor, 1)
        return batch

'''

SCRIPT = string.Template('''$docstring

$imports

$tuned_block
target_batch = $target_batch  # samples per optimizer step, all devices together
micro_batch = $micro_batch  # samples per forward/backward on each device
precision = $precision  # fp32, tf32, bf16 (autocast) or fp16 (autocast + GradScaler)
compile_mode = $compile_mode  # off, default, reduce-overhead, max-autotune-no-cudagraphs, ...
compile_dynamic = $compile_dynamic  # None: automatic dynamic shapes, True: dynamic, False: static
checkpointing = $checkpointing  # off, blocks (every repeated block) or alternate (every second)
# ... or budget-0.5 (compiled only): the compiler keeps about half the activations, recomputes
optimizer_impl = $optimizer_impl  # default (as built), for-loop, foreach or fused
memory_format = $memory_format  # contiguous, or channels_last (2-D convolutions, 4-D images)
allocator = $allocator  # default, or expandable_segments (CUDA)
strategy = $strategy  # none, ddp, ddp-bucket-view, fsdp or fsdp-no-reshard (under torchrun)
compile_scope = $compile_scope  # model (the whole model) or blocks (each repeated block)
tuned_world_size = $world_size  # devices the search assumed
$artifacts

if allocator == "expandable_segments":
    # Read when CUDA starts, not when torch is imported: set here, before any CUDA call.
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
    alloc_conf = [p for p in alloc_conf if p and not p.startswith("expandable_segments")]
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join([*alloc_conf, "expandable_segments:True"])

# ----------------------------------------------------------------------------------------------
$workload


# ----------------------------------------------------------------------------------------------
# The knobs that change the model, the optimizer and the batches, as autotune applied them.


def find_blocks(model):
    """The repeated blocks: the longest run of consecutive same-type children (each with
    parameters) of any ModuleList or Sequential; ties go to more parameters."""
    best = []

    def weight(run):
        return len(run), sum(p.numel() for block in run for p in block.parameters())

    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        run = []
        for child in [*module.children(), None]:
            if child is None or not run or type(child) is not type(run[0]):
                if len(run) >= 2 and weight(run) > weight(best):
                    best = run
                run = []
            if child is not None and any(True for _ in child.parameters()):
                run.append(child)
    return best


def checkpoint_blocks(model, setting, blocks=None):
    """Activation checkpointing of every repeated block ("blocks") or every second one
    ("alternate"): their activations are recomputed in backward instead of kept."""
    if setting not in ("blocks", "alternate"):  # off, or the compiler's budget (below)
        return
    found = list(blocks(model)) if blocks is not None else find_blocks(model)
    if blocks is None and getattr(model, "supports_gradient_checkpointing", False):
        # A Hugging Face model checkpoints its own layers (every one, or every second).
        every = 1 if setting == "blocks" else 2
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable({"use_reentrant": False}, every_n_layers=every)
            return
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = [block for block in found if hasattr(block, "gradient_checkpointing")]
        for i, layer in enumerate(layers):  # each layer's flag says which
            layer.gradient_checkpointing = i % every == 0
        return
    if len(found) < 2:
        raise SystemExit("checkpointing: the model has no repeated blocks (no ModuleList or "
                         "Sequential of 2 or more same-type modules)")
    for i, block in enumerate(found):
        if setting == "blocks" or i % 2 == 0:
            # Wrapping forward (not the module) keeps the parameter names as they were.
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def compiler_recompute(model, setting):
    """checkpointing "budget-F": torch.compile's partitioner keeps about F of the activations
    and recomputes the cheapest rest in backward. It reads the budget when the model compiles
    (at its first call, and any recompile), so it is set around each call of the compiled
    model, and only there."""
    if not setting.startswith("budget-"):
        return model
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "activation_memory_budget"):
        raise SystemExit(f"checkpointing {setting}: torch {torch.__version__} has no "
                         "activation_memory_budget; set checkpointing = 'off' above")
    budget, forward = float(setting[len("budget-"):]), model.forward

    @functools.wraps(forward)
    def budgeted(*args, **kwargs):
        with functorch_config.patch(activation_memory_budget=budget):
            return forward(*args, **kwargs)

    model.forward = budgeted
    return model


def rebuild_optimizer(optimizer, impl):
    """The same optimizer (class, parameter groups, hyper-parameters, step hooks) rebuilt
    for-loop, foreach (fewer kernel launches) or fused (one kernel per step)."""
    if impl == "default":
        return optimizer
    if ("fused" if impl == "fused" else "foreach") not in optimizer.defaults:
        raise SystemExit(f"{type(optimizer).__name__} cannot be rebuilt {impl}")
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    flags = {key: value for key, value in flags.items() if key in optimizer.defaults}
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {key: value for key, value in {**optimizer.defaults, **flags}.items()
                if key in accepted}
    groups = [{**group, **flags} for group in optimizer.param_groups]
    rebuilt = type(optimizer)(groups, **defaults)
    for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        getattr(rebuilt, hooks).update(getattr(optimizer, hooks))
    return rebuilt


def parallelize(model, parallel, precision, device):
    """The model as the tuned strategy runs it over the ranks: DistributedDataParallel ("ddp";
    "ddp-bucket-view": its gradients are views into the all-reduce buckets, one copy less) or
    FSDP2 ("fsdp": fully_shard on each repeated block, then the root, parameters freed after
    each block's forward; "fsdp-no-reshard": kept gathered from forward to backward). Build the
    optimizer over the parameters of the model it returns: fully_shard swaps them for shards."""
    if parallel == "none":
        return model
    if parallel.startswith("ddp"):
        ids = [torch.device(device)] if str(device).startswith("cuda") else None
        return DDP(model, device_ids=ids, gradient_as_bucket_view=parallel == "ddp-bucket-view")
    # bf16/fp16: parameters gathered in the autocast dtype for compute, gradients reduced in fp32.
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype,
                                  reduce_dtype=torch.float32 if dtype is not None else None)
    blocks = list(model_blocks(model)) if model_blocks is not None else find_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=parallel == "fsdp", mp_policy=policy)
    fully_shard(model, reshard_after_forward=parallel == "fsdp", mp_policy=policy)
    return model


def compile_model(model, mode):
    """torch.compile of the whole model (compile_scope "model"), or of each repeated block's
    forward in place, the rest eager (compile_scope "blocks", regional compilation: the
    blocks share one compiled graph, a much shorter cold compile)."""
    if compile_scope != "blocks":
        return torch.compile(model, mode=mode, dynamic=compile_dynamic)
    inner = model.module if isinstance(model, DDP) else model
    blocks = list(model_blocks(inner)) if model_blocks is not None else find_blocks(inner)
    if len(blocks) < 2:
        raise SystemExit("compile_scope blocks: the model has no repeated blocks (no "
                         "ModuleList or Sequential of 2 or more same-type modules)")
    for block in blocks:
        block.forward = torch.compile(block.forward, mode=mode, dynamic=compile_dynamic)
    return model


def to_device(batch, device):
    """The batch on the device; with channels_last, its 4-D float tensors (images) too."""

    def move(tensor):
        tensor = tensor.to(device)
        if memory_format == "channels_last" and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    if isinstance(batch, dict):
        return {key: move(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move(value) for value in batch)
    return move(batch)


class RecompileLimitNote(logging.Filter):
    """Says in one line when torch.compile hits its recompile limit: that code runs eager."""

    def filter(self, record):
        if str(record.msg).startswith("torch._dynamo hit config."):
            print("note: torch.compile hit its recompile limit: that code runs eager from now "
                  "on, slower than tuned (its input shapes keep changing); pad batches to a few "
                  "fixed lengths, set compile_dynamic = True above, or raise "
                  "torch._dynamo.config.recompile_limit", flush=True)
        return True


def device_name(device):
    """The device's name as the search recorded it for the compiled artifacts."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.machine()


def graphs_key(model):
    """Hash of what the compiled graphs depend on: the model's parameters and the settings."""
    parts = [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in model.named_parameters()]
    parts += [f"{name}={globals().get(name)!r}" for name in graph_settings]
    return hashlib.sha256("\\n".join(parts).encode()).hexdigest()[:16]


def load_compile_artifacts(model, device):
    """Load the search's compiled artifacts into torch's caches before the first compile, so
    it reads what the search compiled; only when this torch, this device and these graphs are
    the ones they were saved for, and the file is the one the search wrote (its sha256).
    torch's loader unpickles the file: trust it like code. Returns the line saying what it did."""
    where = os.path.join(os.path.dirname(os.path.abspath(__file__)), compile_artifacts["file"])
    refused = f"note: compiled artifacts {where} not loaded: "
    cold = "; compiling from nothing"
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    if load is None:
        return f"{refused}torch {torch.__version__} cannot load them (2.7 or later can){cold}"
    if compile_artifacts["torch_version"] != torch.__version__:
        return (f"{refused}saved by torch {compile_artifacts['torch_version']}, this is torch "
                f"{torch.__version__}{cold}")
    if compile_artifacts["device_name"] != device_name(device):
        return (f"{refused}saved on {compile_artifacts['device_name']!r}, this is "
                f"{device_name(device)!r}{cold}")
    if compile_artifacts["graphs_key"] != graphs_key(model):
        return (f"{refused}saved for other graphs (the model, micro_batch or a setting above "
                f"changed){cold}")
    try:  # without waiting: a FIFO opened to read waits for a writer forever
        with open(os.open(where, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return f"{refused}it is not a regular file (a FIFO, device or folder){cold}"
            data = f.read(compile_artifacts["size_bytes"] + 1)
    except OSError as exc:
        return f"{refused}{exc.strerror or exc}{cold}"
    if (len(data) != compile_artifacts["size_bytes"]
            or hashlib.sha256(data).hexdigest() != compile_artifacts["sha256"]):
        return f"{refused}not the file the search wrote (truncated, damaged or replaced){cold}"
    try:
        info = load(data)
    except Exception as exc:  # torch's loader on a file it cannot take
        return f"{refused}torch could not load it ({type(exc).__name__}: {exc}){cold}"
    if info is None:
        return f"{refused}torch could not read it{cold}"
    entries = sum(len(keys) for keys in info.artifacts.values())
    return f"compiled artifacts loaded from {where}: {entries} cache entries"


def compile_cache_counts():
    """Graphs read from inductor's caches, and graphs compiled, so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    hits = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"][
        "fxgraph_cache_hit"]
    misses = counters["aot_autograd"]["autograd_cache_miss"] + counters["inductor"][
        "fxgraph_cache_miss"]
    return hits, misses


# ----------------------------------------------------------------------------------------------


def train_step(model, optimizer, scaler, micro_batches, autocast, check=None):
    """One optimizer step over the micro-batches of one effective batch; returns its loss.
    check(), when given, runs after each micro-batch's forward and after the last backward
    (the out-of-memory fallback's check-in of the ranks)."""
    # Normalize the loss once over the whole effective batch: each micro-batch's mean loss
    # weighs its share of all loss items (e.g. label tokens) in the step, so the gradient is
    # the one a single big batch gives, however the padding falls across micro-batches.
    inner = getattr(model, "_orig_mod", model)  # under torch.compile's wrapper
    if count_loss_items is None:
        weights = [1.0 / len(micro_batches)] * len(micro_batches)
    else:
        counts = [count_loss_items(batch) for batch in micro_batches]
        total = sum(counts)
        if isinstance(inner, (DDP, FSDPModule)):
            # DDP and FSDP average gradients over ranks: normalize by the mean count of all ranks.
            total = torch.as_tensor(total, device=next(model.parameters()).device).float()
            dist.all_reduce(total)
            total /= dist.get_world_size()
        weights = [count / total for count in counts]
    step_loss = 0.0
    for i, (weight, batch) in enumerate(zip(weights, micro_batches, strict=True)):
        # Under DDP, gradients are all-reduced once, in the last micro-batch's backward (FSDP
        # reduce-scatters them at every one: its gradients are sharded, never kept whole).
        last = i == len(micro_batches) - 1
        with nullcontext() if last or not isinstance(inner, DDP) else inner.no_sync():
            with autocast:
                loss = compute_loss(model, batch) * weight
            if check is not None:
                check()
            scaler.scale(loss).backward()
        step_loss += loss.detach().float()
        if compile_mode in ("reduce-overhead", "max-autotune") and i == 0 and not last:
            # CUDA graphs: this backward left each .grad in the graph's own output buffer,
            # which the next micro-batch's replay overwrites (pytorch/pytorch#169545): copy.
            with torch.no_grad():
                for param in model.parameters():
                    if param.grad is not None:
                        param.grad = param.grad.clone()
    if check is not None:
        check()
    scaler.step(optimizer)  # optimizer.step(), unscaled first when fp16 enabled the scaler
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return step_loss


$shapes_block$fallback

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to run")
    parser.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", default=os.path.splitext(os.path.basename(__file__))[0] + "_out",
                        help="folder for the checkpoint (default: %(default)s)")
    parser.add_argument("--checkpoint", default=None,
                        help="the checkpoint written at the end (default: OUT/checkpoint.pt)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--oom-fallbacks", type=int, default=None,
                        help="on out of memory, redo the step with a smaller micro-batch, at most "
                        "this many times in a row (0: off; default: 3, off under FSDP)")
    args = parser.parse_args()
    if args.oom_fallbacks is not None and args.oom_fallbacks < 0:
        parser.error(f"--oom-fallbacks must be 0 (off) or more, got {args.oom_fallbacks}")

    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1  # launched by torchrun
    if distributed:
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ["LOCAL_RANK"])
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
        if device != "cpu":
            torch.cuda.set_device(device)
    else:
        rank, world_size = 0, 1
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    master = rank == 0
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    if target_batch % (micro_batch * world_size):
        raise SystemExit(f"target_batch {target_batch} is not a multiple of micro_batch "
                         f"{micro_batch} x {world_size} devices")
    accumulate_steps = target_batch // (micro_batch * world_size)
    if master and world_size != tuned_world_size:
        print(f"note: tuned for {tuned_world_size} device(s), running on {world_size}: "
              f"accumulating {accumulate_steps} micro-batches per step instead")
    # torchrun without a tuned strategy runs plain DDP; one process runs none.
    parallel = ("ddp" if strategy == "none" else strategy) if distributed else "none"
    if master and strategy != "none" and not distributed:
        print(f"note: tuned for strategy {strategy} over {tuned_world_size} processes; without "
              f"torchrun this runs one process without a process group. Run it as: torchrun "
              f"--nproc_per_node={tuned_world_size} {os.path.basename(__file__)}")

    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast(device_type, dtype=dtype) if dtype else nullcontext()
    # fp16's small range underflows gradients without loss scaling; disabled it is a no-op.
    scaler = torch.amp.GradScaler(device_type, enabled=precision == "fp16")

    torch.manual_seed(args.seed)  # the same initial weights on every rank (FSDP broadcasts none)
    model = build_model().to(device)
    checkpoint_blocks(model, checkpointing, model_blocks)
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    model = parallelize(model, parallel, precision, device)
    optimizer = rebuild_optimizer(make_optimizer(model.parameters()), optimizer_impl)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    if compile_mode != "off":  # after the DDP/FSDP wrap, as autotune measured it
        mode = None if compile_mode == "default" else compile_mode
        logging.getLogger("torch._dynamo.convert_frame").addFilter(RecompileLimitNote())
        if compile_artifacts is not None:
            note = load_compile_artifacts(model, device)
            if master:
                print(note, flush=True)
        model = compiler_recompute(compile_model(model, mode), checkpointing)
    torch.manual_seed(args.seed + 1 + rank)  # a different data stream on each rank

    if master:
        print(f"training {args.steps} steps of {target_batch} samples: micro-batch "
              f"{micro_batch} x {accumulate_steps} accumulation x {world_size} device(s), "
              f"{precision}, compile {compile_mode}, checkpointing {checkpointing}, optimizer "
              f"{optimizer_impl}, memory format {memory_format}, strategy {parallel}, on "
              f"{device}")
    if parallel.startswith("fsdp"):
        # FSDP gathers and scatters inside each block: a rank that runs out of memory there
        # leaves the others in another collective, so the ranks cannot agree on a fallback.
        if args.oom_fallbacks and master:  # asked for: say why it is not there
            print("note: the out-of-memory fallback (--oom-fallbacks) is off under FSDP")
        args.oom_fallbacks = 0
    elif args.oom_fallbacks is None:
        args.oom_fallbacks = 3
    fallback = OomFallback(args.oom_fallbacks, device, master) if args.oom_fallbacks > 0 else None
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        size = fallback.micro_batch if fallback else micro_batch  # smaller after a fallback
        micro_batches = [to_device(get_batch(size), device)
                         for _ in range(micro_batch * accumulate_steps // size)]
        if fallback:
            loss = fallback.train_step(model, optimizer, scaler, micro_batches, autocast)
        else:
            loss = train_step(model, optimizer, scaler, micro_batches, autocast)
        scheduler.step()  # once per optimizer step, not per micro-batch
        if master and step == 1 and compile_mode != "off" and compile_cache_counts():
            hits, misses = compile_cache_counts()
            print(f"first optimizer step after {time.perf_counter() - start:.1f} s (compile "
                  f"included); inductor caches: {hits} hits, {misses} misses", flush=True)
        if master and (step % args.log_every == 0 or step in (1, args.steps)):
            loss = loss.item()  # waits for the device: only when printing
            elapsed = time.perf_counter() - start
            print(f"step {step}/{args.steps} | loss {loss:.4f} | "
                  f"{step * target_batch / elapsed:,.1f} samples/s | {elapsed:.1f} s")

    # The module under the wrappers: the compiled one's keys would carry "_orig_mod.".
    raw_model = getattr(model, "_orig_mod", model)
    raw_model = raw_model.module if isinstance(raw_model, DDP) else raw_model
    if isinstance(raw_model, FSDPModule):
        # Gathering the full state dicts is a collective: every rank takes part, rank 0 saves.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(raw_model, options=options)
        optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
    elif master:
        model_state, optimizer_state = raw_model.state_dict(), optimizer.state_dict()
    if master:
        checkpoint = args.checkpoint or os.path.join(args.out, "checkpoint.pt")
        os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
        torch.save({"model": model_state, "optimizer": optimizer_state, "step": args.steps},
                   checkpoint)
        print(f"saved {checkpoint}")
    if distributed:
        # FSDP's modules hold the process group: freed first, it closes with the group (left to
        # the interpreter's exit, its threads can outlive it and abort the process).
        del model, raw_model, optimizer, scheduler
        gc.collect()
        dist.barrier()  # no rank tears the group down while another still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
''')
