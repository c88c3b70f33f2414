"""The peak-memory count of ``train_autotuned.py``, as plain code (no torch import here).

``autotune.codegen`` puts ``MEMORY`` into ``codegen_templates.SCRIPT`` (``$memory``). It counts as
the search's trials do (``autotune.device``): on CUDA, ``torch.cuda.max_memory_reserved()`` plus
the CUDA context as ``device/cuda.py`` measures it (NVML's device use over the use before this
process's context, beyond the allocator's reserve); on CPU, the rise of the kernel's VmPeak
over a baseline taken once the model is built (``device/cpu.py``: its thread pool, torch._dynamo
and, compiled, inductor's compile threads started first; the gap up to the high-water mark
reserved) plus the model's tensor bytes. A test runs the script and reads its line.
"""

MEMORY = '''

# ----------------------------------------------------------------------------------------------
# The peak memory, counted as autotune's search counts it: what it compared with the budget.


def nvml_used_bytes(device):
    """Device memory in use by every process, from NVML (no CUDA context needed), or None."""
    try:
        import pynvml

        index = torch.device(device).index or 0
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        if index < len(visible) and visible[index].isdigit():
            index = int(visible[index])
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
    except Exception:  # NVML missing: the context is measured around its first allocation
        return None


def proc_status(key):
    """A size from /proc/self/status (VmPeak, VmSize), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def tensor_bytes(model):
    """Bytes of the model's parameters and buffers (each storage once: tied weights share)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}.values())


def format_bytes(num_bytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.2f} {unit}"
        num_bytes /= 1024


class PeakMemory:
    """Created before the device is used (CUDA: its context not yet made); start() once the
    model is built; line() at the end."""

    def __init__(self, device):
        self.device, self.cuda = torch.device(device), str(device).startswith("cuda")
        if self.cuda:
            self.nvml_before = nvml_used_bytes(device)
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
            free_before, _ = torch.cuda.mem_get_info(self.device)  # makes the context
            torch.empty(1, device=self.device)
            torch.cuda.synchronize(self.device)
            free_after, _ = torch.cuda.mem_get_info(self.device)
            fallback = free_before - free_after - torch.cuda.memory_reserved(self.device)
            self.context = self.outside_allocator() or max(0, fallback)

    def outside_allocator(self):
        """Device memory this process holds outside torch's allocator (NVML), or None."""
        now = nvml_used_bytes(self.device)
        if self.nvml_before is None or now is None:
            return None
        return max(0, now - self.nvml_before - torch.cuda.memory_reserved(self.device))

    def start(self, model):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self.model_bytes = tensor_bytes(model)
        # What the search starts before its baseline, so that it is not counted as training:
        # the thread pool, torch._dynamo (every optimizer imports it at its first step) and
#[if compiled]
        # inductor's compile threads (a stack of 8 MiB of address space each).
#[else]
        # (compiled) inductor's compile threads.
#[end]
        torch.ones(64, 64) @ torch.ones(64, 64)
        importlib.import_module("torch._dynamo")
#[if compiled]
        try:
            from torch._inductor.async_compile import AsyncCompile, get_compile_threads
        except ImportError:  # a torch that compiles in the calling thread
            threads = 1
        else:
            threads = get_compile_threads()
        if threads > 1:  # each task waits for all the others: the pool starts one per task
            try:
                import tqdm

                tqdm.tqdm.monitor_interval = 0  # its progress bar's monitor thread: none
            except ImportError:
                pass
            barrier = threading.Barrier(threads + 1)
            futures = [AsyncCompile.pool().submit(barrier.wait) for _ in range(threads)]
            barrier.wait()
            for future in futures:
                future.result()
#[end]
        # The kernel's high-water mark VmPeak may sit above the address space VmSize (glibc
        # trims arenas, large freed blocks are unmapped): reserve the gap, inaccessible and
        # never committed, so that training cannot fill it unseen by the peak.
        gap = proc_status("VmPeak") - proc_status("VmSize")
        gap -= gap % mmap.PAGESIZE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        self.padding = mmap.mmap(-1, gap, flags=flags, prot=0) if gap > 0 else None
        self.baseline = proc_status("VmPeak")

    def line(self, tuned_device):
        """The peak with how it was counted, and what the search measured beside it."""
        if self.cuda:
            # Kernel modules load as they are first used: the context grows during the steps.
            self.context = max(self.context, self.outside_allocator() or 0)
            peak = torch.cuda.max_memory_reserved(self.device) + self.context
            how = "reserved by torch's allocator plus the CUDA context, as autotune counts it"
        else:
            peak = proc_status("VmPeak") - self.baseline + self.model_bytes
            how = ("address-space growth over the process's baseline plus the model's tensors, "
                   "as autotune counts it")
            if not any(name.startswith("MALLOC_") for name in os.environ):
                how += (", but with glibc's default allocator, which maps more: the search ran "
                        "its children with MALLOC_ARENA_MAX=1 MALLOC_TRIM_THRESHOLD_=0, set "
                        "them to compare")
        measured = (f"autotune measured {format_bytes(tuned_peak_bytes)} on {tuned_device}"
                    if tuned_peak_bytes is not None else "autotune measured none")
        return f"peak memory {format_bytes(peak)} ({how}; {measured})"
'''
