"""The text of ``train_autotuned.py``, filled in by ``autotune.codegen``. No torch import here.

``$name`` placeholders are filled by ``string.Template`` (the Python code itself has no ``$``).
``SCRIPT`` is the script's frame: its docstring, the tuned values, the allocator's setting, the
compiled artifacts' loader, ``train_step`` and ``main``. Its parts come from beside it: the
workload (``codegen_workloads``: ``$workload``), the knobs' changes to the model, the optimizer
and the batches (``codegen_knobs``: ``$knob_functions``), the shape policy (``codegen_shapes``:
``$shapes_block``), the peak-memory count (``codegen_memory``: ``$memory``) and the
out-of-memory fallback (``codegen_fallback``: ``$fallback``). Values enter as literals; the
code only some configs run is marked ``#[if PART]`` ... ``#[end]`` and cut for the others
(``codegen_parts``), with ``$guard`` stopping a run whose values need code that was cut.
"""

from __future__ import annotations

SCRIPT = '''$docstring

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
tuned_peak_bytes = $peak_bytes  # the peak memory autotune measured$peak_comment
$artifacts
#[if expandable]

if allocator == "expandable_segments":
    # Read when CUDA starts, not when torch is imported: set here, before any CUDA call.
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
    alloc_conf = [p for p in alloc_conf if p and not p.startswith("expandable_segments")]
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join([*alloc_conf, "expandable_segments:True"])
#[end]

# ----------------------------------------------------------------------------------------------
$workload


# ----------------------------------------------------------------------------------------------
# The knobs that change the model, the optimizer and the batches, as autotune applied them.

$knob_functions
#[if compiled]


class RecompileLimitNote(logging.Filter):
    """Says in one line when torch.compile hits its recompile limit: that code runs eager."""

    def filter(self, record):
        if str(record.msg).startswith("torch._dynamo hit config."):
            print("note: torch.compile hit its recompile limit: that code runs eager from now "
                  "on, slower than tuned (its input shapes keep changing); pad batches to a few "
                  "fixed lengths, set compile_dynamic = True above, or raise "
                  "torch._dynamo.config.recompile_limit", flush=True)
        return True
#[if artifacts]


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
#[end]


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
#[end]
$memory

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
#[if fsdp]
        if isinstance(inner, (DDP, FSDPModule)):
#[else]
        if isinstance(inner, DDP):
#[end]
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
#[if cuda_graphs]
        if compile_mode in ("reduce-overhead", "max-autotune") and i == 0 and not last:
            # CUDA graphs: this backward left each .grad in the graph's own output buffer,
            # which the next micro-batch's replay overwrites (pytorch/pytorch#169545): copy.
            with torch.no_grad():
                for param in model.parameters():
                    if param.grad is not None:
                        param.grad = param.grad.clone()
#[end]
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

$guard
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1  # launched by torchrun
    if distributed:
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ["LOCAL_RANK"])
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    else:
        rank, world_size = 0, 1
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    memory = PeakMemory(device)  # before the device is first used: its context counts
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
    memory.start(model)
#[if checkpoint]
    checkpoint_blocks(model, checkpointing, model_blocks)
#[end]
#[if channels_last]
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
#[end]
    model = parallelize(model, parallel, precision, device)
#[if rebuild_optimizer]
    optimizer = rebuild_optimizer(make_optimizer(model.parameters()), optimizer_impl)
#[else]
    optimizer = make_optimizer(model.parameters())
#[end]
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
#[if compiled]
    if compile_mode != "off":  # after the DDP/FSDP wrap, as autotune measured it
        mode = None if compile_mode == "default" else compile_mode
        logging.getLogger("torch._dynamo.convert_frame").addFilter(RecompileLimitNote())
#[if artifacts]
        if compile_artifacts is not None:
            note = load_compile_artifacts(model, device)
            if master:
                print(note, flush=True)
#[end]
        model = compile_model(model, mode)
#[if recompute]
        model = compiler_recompute(model, checkpointing)
#[end]
#[end]
    torch.manual_seed(args.seed + 1 + rank)  # a different data stream on each rank

    if master:
        print(f"training {args.steps} steps of {target_batch} samples: micro-batch "
              f"{micro_batch} x {accumulate_steps} accumulation x {world_size} device(s), "
              f"{precision}, compile {compile_mode}, checkpointing {checkpointing}, optimizer "
              f"{optimizer_impl}, memory format {memory_format}, strategy {parallel}, on "
              f"{device}")
#[if fsdp]
    if parallel.startswith("fsdp"):
        # FSDP gathers and scatters inside each block: a rank that runs out of memory there
        # leaves the others in another collective, so the ranks cannot agree on a fallback.
        if args.oom_fallbacks and master:  # asked for: say why it is not there
            print("note: the out-of-memory fallback (--oom-fallbacks) is off under FSDP")
        args.oom_fallbacks = 0
    elif args.oom_fallbacks is None:
        args.oom_fallbacks = 3
#[else]
    if args.oom_fallbacks is None:
        args.oom_fallbacks = 3
#[end]
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
#[if compiled]
        if master and step == 1 and compile_mode != "off" and compile_cache_counts():
            hits, misses = compile_cache_counts()
            print(f"first optimizer step after {time.perf_counter() - start:.1f} s (compile "
                  f"included); inductor caches: {hits} hits, {misses} misses", flush=True)
#[end]
        if master and (step % args.log_every == 0 or step in (1, args.steps)):
            loss = loss.item()  # waits for the device: only when printing
            elapsed = time.perf_counter() - start
            print(f"step {step}/{args.steps} | loss {loss:.4f} | "
                  f"{step * target_batch / elapsed:,.1f} samples/s | {elapsed:.1f} s")
    if master:
        print(memory.line($tuned_device), flush=True)

    # The module under the wrappers: the compiled one's keys would carry "_orig_mod.".
    raw_model = getattr(model, "_orig_mod", model)
    raw_model = raw_model.module if isinstance(raw_model, DDP) else raw_model
#[if fsdp]
    if isinstance(raw_model, FSDPModule):
        # Gathering the full state dicts is a collective: every rank takes part, rank 0 saves.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(raw_model, options=options)
        optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
    elif master:
        model_state, optimizer_state = raw_model.state_dict(), optimizer.state_dict()
#[end]
    if master:
#[if not fsdp]
        model_state, optimizer_state = raw_model.state_dict(), optimizer.state_dict()
#[end]
        saved_to = args.checkpoint or os.path.join(args.out, "checkpoint.pt")
        os.makedirs(os.path.dirname(saved_to) or ".", exist_ok=True)
        torch.save({"model": model_state, "optimizer": optimizer_state, "step": args.steps},
                   saved_to)
        print(f"saved {saved_to}")
    if distributed:
        # FSDP's modules hold the process group: freed first, it closes with the group (left to
        # the interpreter's exit, its threads can outlive it and abort the process).
        del model, raw_model, optimizer, scheduler
        gc.collect()
        dist.barrier()  # no rank tears the group down while another still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
