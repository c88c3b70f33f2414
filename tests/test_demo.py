"""The built-in workload's first search on CPU: the demo's defaults (``builtin_workloads.CPU_DEMO``)
apply where the user gave nothing, are said, and never override what the user gave."""

from __future__ import annotations

import pytest

from autotune import api
from autotune.builtin_workloads import CPU_DEMO
from autotune.config import DeviceInfo, WorkloadSpec
from autotune.units import GIB, MIB, parse_budget

CPU = DeviceInfo(device="cpu", name="test cpu", total_memory_bytes=8 * GIB,
                 available_memory_bytes=8 * GIB, supports_bf16=True, supports_fp16=False,
                 supports_tf32=False)
GPU = DeviceInfo(device="cuda:0", name="test GPU", total_memory_bytes=80 * GIB,
                 available_memory_bytes=80 * GIB, supports_bf16=True, supports_fp16=True,
                 supports_tf32=True, native_bf16=True)


def test_the_built_in_workload_on_cpu_gets_the_demos_budget_and_no_compile_and_says_so():
    _, budget, classes, _, notes = api.TuneRequest(target_batch=64).validate(CPU)
    assert budget.budget_bytes == parse_budget(CPU_DEMO.memory_budget, CPU.total_memory_bytes)
    assert budget.budget_bytes == 120 * MIB
    assert {k.compile_mode for k in classes} == {"off"}
    assert list(CPU_DEMO.notes(budget=True, compile_modes=True)) == [
        n for n in notes if "CPU demo" in n]
    assert any("--memory-budget to change" in n for n in notes)
    assert any("--compile-modes off,default" in n for n in notes)


@pytest.mark.parametrize(("given", "said"), [
    ({"memory_budget": "2GiB"}, "compile"),
    ({"compile_modes": ("off", "default")}, "budget"),
])
def test_what_the_user_gave_stands_and_only_the_rest_is_the_demos(given, said):
    request = api.TuneRequest(target_batch=64, **given)
    _, budget, classes, _, notes = request.validate(CPU)
    demo = [n for n in notes if "CPU demo" in n]
    assert len(demo) == 1 and (said in demo[0]) and ("memory budget" in demo[0]) == (
        said == "budget")
    if "memory_budget" in given:
        assert budget.budget_bytes == 2 * GIB
        assert {k.compile_mode for k in classes} == {"off"}
    else:
        assert budget.budget_bytes == 120 * MIB
        assert {k.compile_mode for k in classes} == {"off", "default"}


def test_given_both_nothing_is_the_demos():
    request = api.TuneRequest(target_batch=64, memory_budget="1GiB", compile_modes=("default",))
    assert request.demo_defaults(CPU) == (request, ())
    _, budget, classes, _, notes = request.validate(CPU)
    assert budget.budget_bytes == GIB and not any("CPU demo" in n for n in notes)
    assert {k.compile_mode for k in classes} == {"default"}


@pytest.mark.parametrize(("spec", "device"), [
    (WorkloadSpec(kind="hf", target="gpt2"), CPU),  # the user's model: the machine's budget
    (WorkloadSpec(), GPU),  # GPT-2 small on a GPU: its memory and every compile mode
])
def test_a_users_workload_or_a_gpu_gets_no_demo_defaults(spec, device):
    request = api.TuneRequest(workload=spec, target_batch=64)
    assert request.demo_defaults(device) == (request, ())
