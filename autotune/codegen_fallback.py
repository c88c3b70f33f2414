"""The out-of-memory fallback of ``train_autotuned.py``, as plain code (no torch import here).

``autotune.codegen`` puts ``FALLBACK`` into ``codegen_templates.SCRIPT`` (``$fallback``). It does
what ``autotune.fallback`` does, with ``autotune.trial_status.is_out_of_memory``'s classifier;
tests keep them equal (the same messages, the same micro-batches, the same gradients, over
ranks too).
"""

FALLBACK = '''
# ----------------------------------------------------------------------------------------------
# The out-of-memory fallback (--oom-fallbacks): a step that runs out of memory is redone from
# its first micro-batch with the next smaller divisor of the per-device batch, the same samples
# regrouped with more accumulation: the effective batch and the gradient do not change.

OOM_MESSAGES = (
    "out of memory",  # CUDA, HIP, MPS, XPU
    "can't allocate memory",  # the CPU allocator
    "cannot allocate memory",  # ENOMEM from the OS
    "could not create a primitive",  # oneDNN when its scratchpad allocation fails
    "std::bad_alloc",
    "not enough memory",
)


def is_out_of_memory(exc):
    """An out-of-memory error, or an error it caused: torch.OutOfMemoryError, MemoryError,
    ENOMEM, or the messages CPU allocators and other backends raise as a RuntimeError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            return True
        if isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in OOM_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


CPU_ALLOCATOR_OOM = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to "
                               r"allocate (\\d{1,20}) bytes")
CUDA_OOM = re.compile(r"^(CUDA out of memory)\\. Tried to allocate ([\\d.]+ [KMGT]?i?B)\\."
                      r"(?: GPU \\d+ has a total capacity of ([\\d.]+ [KMGT]?i?B) of which "
                      r"([\\d.]+ [KMGT]?i?B) is free)?")


def oom_cause(exc):
    """What ran out, said in one clause: the allocator's size where its error gives one, else
    the error's type and first line (autotune's oom_text.oom_cause, kept equal by a test)."""
    text = str(exc)
    if cpu := CPU_ALLOCATOR_OOM.search(text):
        return f"the CPU allocator could not allocate {format_bytes(int(cpu.group(1)))} more"
    if cuda := CUDA_OOM.match(text):
        free = f", {cuda.group(4)} free of {cuda.group(3)}" if cuda.group(3) else ""
        return f"{cuda.group(1)}: could not allocate {cuda.group(2)} more{free}"
    lines = text.strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def batch_size(batch):
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, dict) else batch
    return next(batch_size(v) for v in values if isinstance(v, (torch.Tensor, dict, tuple, list)))


def batch_part(batch, start, stop):
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {key: batch_part(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(batch_part(value, start, stop) for value in batch)
    return batch


def join_parts(parts):
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts) if len(parts) > 1 else parts[0]
    if isinstance(parts[0], dict):
        return {key: join_parts([part[key] for part in parts]) for key in parts[0]}
    if isinstance(parts[0], (tuple, list)):
        return type(parts[0])(join_parts(column) for column in zip(*parts, strict=True))
    return parts[0]


def sample_shapes(batch):
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape[1:])]
    values = batch.values() if isinstance(batch, dict) else batch
    if not isinstance(batch, (dict, tuple, list)):
        return []
    return [shape for value in values for shape in sample_shapes(value)]


def is_ragged(micro_batches):
    """Micro-batches of different shapes (lengths): a new micro-batch never joins two."""
    return any(sample_shapes(b) != sample_shapes(micro_batches[0]) for b in micro_batches)


def smaller_micro_batch(per_device, current, must_divide=()):
    """The next smaller divisor of the per-device batch (dividing each of must_divide); 0: none."""
    return next((d for d in range(min(current, per_device + 1) - 1, 0, -1)
                 if per_device % d == 0 and all(s % d == 0 for s in must_divide)), 0)


def split_micro_batches(micro_batches, size):
    """The samples of the micro-batches, in order, as micro-batches of size samples."""
    sizes = [batch_size(b) for b in micro_batches]
    if all(s == size for s in sizes):
        return list(micro_batches)
    if is_ragged(micro_batches):
        return [batch_part(b, i, i + size) for b, s in zip(micro_batches, sizes, strict=True)
                for i in range(0, s, size)]
    out, group, room = [], [], size
    for batch, samples in zip(micro_batches, sizes, strict=True):
        start = 0
        while start < samples:
            take = min(room, samples - start)
            group.append(batch_part(batch, start, start + take))
            start, room = start + take, room - take
            if room == 0:
                out.append(join_parts(group))
                group, room = [], size
    return out


def reduce_over_ranks(value, op, device):
    """value reduced over the ranks (all-reduce), or itself without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    tensor = torch.tensor([int(value)], device=device if str(device).startswith("cuda") else "cpu")
    dist.all_reduce(tensor, op=op)
    return int(tensor.item())


class PeerOutOfMemory(RuntimeError):
    """Another rank ran out of memory in this attempt of the step."""


class OomFallback:
    """Runs train_step, redone with a smaller micro-batch after an out-of-memory error on any
    rank; stops after max_in_a_row fallbacks without a completed step. Every rank checks in
    after each forward and after the last backward (one all-reduce of a flag); a rank that ran
    out of memory checks in once with the flag raised, so all leave the attempt together."""

    def __init__(self, max_in_a_row, device, master):
        self.max_in_a_row, self.device, self.master = max_in_a_row, device, master
        self.micro_batch = micro_batch  # samples per forward/backward now
        self.in_a_row = 0
        self.checks = 0

    def check(self):
        self.checks += 1
        if reduce_over_ranks(0, dist.ReduceOp.MAX, self.device):
            raise PeerOutOfMemory("another rank ran out of memory")

    def train_step(self, model, optimizer, scaler, micro_batches, autocast):
        sizes = [batch_size(b) for b in micro_batches]
        per_device = sum(sizes)
        # What a forward changes besides activations (normalization layers' running
        # statistics): put back after a failed attempt, so the redo updates them once.
        saved = {f"{name}.{key}": buffer.detach().clone()
                 for name, module in model.named_modules()
                 if isinstance(module, nn.modules.batchnorm._NormBase)
                 and module.track_running_stats
                 for key, buffer in module.named_buffers(recurse=False) if buffer is not None}
        while True:
            size, self.checks, failure = self.micro_batch, 0, ""
            batches = split_micro_batches(micro_batches, size)
            try:
                loss = train_step(model, optimizer, scaler, batches, autocast, self.check)
            except PeerOutOfMemory as exc:
                failure = str(exc)
            except Exception as exc:
                # Not memory; or in the last backward under DDP, whose all-reduce the other
                # ranks wait in: re-raised.
                in_all_reduce = self.checks == len(batches) and isinstance(
                    getattr(model, "_orig_mod", model), DDP)
                if not is_out_of_memory(exc) or in_all_reduce:
                    raise
                failure = oom_cause(exc)
                if self.checks > len(batches):  # every rank passed the last check: the update
                    raise SystemExit(
                        f"out of memory in the optimizer's update, which a smaller micro-batch "
                        f"does not shrink ({failure}): free memory elsewhere, or shard the "
                        "optimizer state (strategy fsdp)") from exc
                reduce_over_ranks(1, dist.ReduceOp.MAX, self.device)  # the others leave too
            else:
                self.in_a_row = 0
                return loss
            # The failed attempt's activations went with its exception; no gradient is kept.
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, buffer in model.named_buffers():
                    if name in saved:
                        buffer.copy_(saved[name])
            inner = getattr(model, "_orig_mod", model)
            if isinstance(inner, DDP):
                # A rank whose last micro-batch's forward ran (outside no_sync) has DDP's
                # reducer waiting for its backward: every rank resets it, as DDP's own
                # _update_process_group does (buckets rebuilt at the next step, alike).
                inner._has_rebuilt_buckets = False
                inner.reducer._reset_state()
            del batches
            gc.collect()
            if str(self.device).startswith("cuda"):
                torch.cuda.empty_cache()
            must_divide = sizes if is_ragged(micro_batches) else ()
            smaller = reduce_over_ranks(smaller_micro_batch(per_device, size, must_divide),
                                        dist.ReduceOp.MIN, self.device)
            self.in_a_row += 1
            if smaller == 0:
                raise SystemExit(
                    f"out of memory at micro-batch {size} ({failure}) after no smaller "
                    f"micro-batch: the step of {per_device} samples per device does not fit; "
                    "lower target_batch, free memory (checkpointing, a smaller precision) or "
                    "re-run autotune search under the memory you have")
            if self.in_a_row > self.max_in_a_row:  # the limit, not the memory, ends it
                left = [d for d in range(size - 1, 0, -1)
                        if per_device % d == 0 and all(s % d == 0 for s in must_divide)]
                shown = ", ".join(map(str, left[:4])) + (", ..." if len(left) > 4 else "")
                limit = self.max_in_a_row
                raise SystemExit(
                    f"out of memory at micro-batch {size} ({failure}): {limit} fallback"
                    f"{'s' if limit > 1 else ''} in a row used up (--oom-fallbacks {limit}) "
                    f"with smaller micro-batches left to try ({shown}): raise --oom-fallbacks "
                    f"(--oom-fallbacks {limit + len(left)} tries them all), or lower "
                    "micro_batch at the top of this script")
            self.micro_batch = smaller
            if self.master:
                print(f"out of memory at micro-batch {size} ({failure}): redoing the step with "
                      f"micro-batch {smaller} x {per_device // smaller} accumulation (effective "
                      f"batch unchanged; fallback {self.in_a_row} of {self.max_in_a_row} in a "
                      "row)", flush=True)
'''
