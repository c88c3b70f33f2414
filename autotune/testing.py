"""Helpers for your tests: ``assert_fits`` checks a config's memory with the estimator.

Example (pytest, CPU-only CI)::

    from autotune.knobs import Knobs
    from autotune.testing import assert_fits

    def test_fits_on_a_24gib_gpu():
        assert_fits("gpt2", micro_batch=8, device_memory="24GiB", precision="bf16")

    def test_fits_checkpointed():
        assert_fits("gpt2", micro_batch=32, device_memory="24GiB",
                    knobs=Knobs(precision="bf16", checkpointing="blocks"))
"""

from __future__ import annotations

from autotune import api
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.estimate.calibration import Calibration
from autotune.knobs import Knobs
from autotune.workload import Workload


def assert_fits(workload: Workload | WorkloadSpec | str | None = None, *, micro_batch: int,
                device_memory: str | int, knobs: Knobs | None = None,
                precision: str | None = None, accumulate_steps: int = 1,
                headroom: float = 0.1, seq_len: int | None = None,
                compile_mode: str | None = None, calibration: float | None = None,
                kernels: str = "cuda") -> api.CheckResult:
    """Assert that one training step fits ``device_memory`` with ``headroom`` (estimator).

    Args:
        workload: a Workload, a spec, a HF model id or ``file.py:factory`` (default: built-in).
        micro_batch: samples per forward/backward.
        device_memory: e.g. ``"24GiB"`` or bytes.
        knobs: the knobs the step runs with (checkpointing, optimizer implementation, memory
            format are traced; default fp32 eager).
        precision: fp32, tf32, bf16 or fp16: a shortcut for ``Knobs(precision=...)``.
        accumulate_steps: micro-batches per optimizer step (for the message's suggestion).
        headroom: share of the device memory kept free.
        seq_len: worst-case sequence length for a HF model id.
        compile_mode: a shortcut as ``precision`` is; compiled steps are estimated as eager.
        calibration: a measured / estimate ratio: the estimate's growth is scaled by it (never
            by less than 1, so it cannot turn a miss into a fit).
        kernels: ``cuda`` or ``cpu`` (see ``autotune estimate --kernels``).

    Returns:
        The check result, when it fits.

    Raises:
        AssertionError: it does not fit; the message is ``autotune check``'s.
        ConfigError: ``knobs`` and a shortcut both given.
    """
    from autotune.units import parse_bytes

    shortcuts = {name: value for name, value in (("precision", precision),
                                                 ("compile_mode", compile_mode))
                 if value is not None}
    if knobs is not None and shortcuts:
        raise ConfigError(f"give {' and '.join(shortcuts)} in knobs ({knobs.label()}) or as "
                          "keywords, not both")
    knobs = knobs or Knobs(**shortcuts)  # type: ignore[arg-type]

    if isinstance(workload, str):
        spec: WorkloadSpec | None = (WorkloadSpec(kind="file", target=workload)
                                     if ":" in workload and workload.split(":")[0].endswith(".py")
                                     else WorkloadSpec(kind="hf", target=workload,
                                                       seq_len=seq_len))
    else:
        spec = workload if isinstance(workload, WorkloadSpec) else None
    memory = device_memory if isinstance(device_memory, int) else parse_bytes(device_memory)
    target = api.CheckTarget(
        workload=spec or WorkloadSpec(), micro_batch=micro_batch,
        accumulate_steps=accumulate_steps, target_batch=micro_batch * accumulate_steps,
        world_size=1, knobs=knobs, device_memory_bytes=memory, headroom=headroom,
        calibration=None if calibration is None else Calibration.ratio(calibration),
        device="cpu" if kernels == "cpu" else "cuda")
    result = api.check(target=target, measure=False,
                       workload=workload if isinstance(workload, Workload) else None)
    if not result.fits:
        raise AssertionError(result.message)
    return result
