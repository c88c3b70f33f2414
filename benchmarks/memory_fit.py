"""Memory-fit precision of autotune's probe, and the peers' batch-size finders (CPU testbed).

Per workload, under a tight cap chosen so the fp32 boundary falls between divisors of the target
(the midpoint of the peaks measured at micro-batches 16 and 32):

1. ``api.probe`` (fp32 and bf16, eager) finds the largest micro-batch per class;
2. brute force: every divisor of the target, per class, run with the real capped runner
   (``memory.probe_spec``: two accumulated micro-batches, two optimizer steps) in two passes
   (the second in reverse order); the true maximum is the largest that ran in both passes;
3. each found maximum re-run twice as the real config (accumulation to the target) in a fresh
   capped process: zero OOMs expected;
4. peers, each in a capped child (``peer_child.py``, same RLIMIT_AS rule): Lightning's
   ``Tuner.scale_batch_size`` (power, binsearch) and Accelerate's ``find_executable_batch_size``
   from the target; the batch each found is re-run twice in fresh capped processes as the config
   its user ends up with (accumulation = target // batch).

Run: ``python benchmarks/memory_fit.py``; writes ``benchmarks/results/memory_fit.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oracle import HERE, machine, write_results

from autotune import api
from autotune.config import Knobs, TrialSpec, WorkloadSpec
from autotune.memory import probe_spec
from autotune.runner import child_environment, run_isolated
from autotune.space import divisors
from autotune.units import MIB, format_bytes

TARGET = 64
HEADROOM = 0.1
WORKLOADS = {  # name: factory; the cap is chosen per workload (choose_cap)
    "causal LM (GPT-2, 2x64, seq 64)": "pick_gpt2",
    "masked LM (BERT, 2x64, seq 64)": "pick_bert",
    "CNN (3 conv blocks, 32x32)": "pick_cnn",
}
CLASSES = (Knobs(precision="fp32", compile_mode="off"),
           Knobs(precision="bf16", compile_mode="off"))
PEERS = ("lightning-power", "lightning-binsearch", "accelerate")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def choose_cap(spec: WorkloadSpec) -> int:
    """The midpoint of the fp32 eager peaks at micro-batches 16 and 32 (uncapped probe runs)."""
    fp32 = Knobs(precision="fp32", compile_mode="off")
    peaks = []
    for m in (16, 32):
        r = run_isolated(probe_spec(spec, "cpu", fp32, m, None, 600))
        if not r.ok or r.peak_bytes is None:
            raise RuntimeError(f"{spec.target} at {m}: {r.status} {r.message}")
        peaks.append(r.peak_bytes)
    return (sum(peaks) // 2 + MIB - 1) // MIB * MIB


def config_run(spec: WorkloadSpec, precision: str, micro_batch: int, budget: int) -> dict:
    """The config a user ends up with (accumulation = target // micro-batch), two optimizer
    steps, in a fresh capped process."""
    r = run_isolated(TrialSpec(workload=spec, device="cpu", micro_batch=micro_batch,
                               accumulate_steps=max(1, TARGET // micro_batch),
                               precision=precision,  # type: ignore[arg-type]
                               num_warmup_steps=2, num_timed_steps=0,
                               memory_budget_bytes=budget, timeout_s=600))
    return {"status": r.status, "peak_bytes": r.peak_bytes}


def brute_force(spec: WorkloadSpec, budget: int, usable: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for mc in CLASSES:
        runs: dict[int, list[tuple[str, int | None]]] = {}
        for m in divisors(TARGET):  # pass 1, increasing; a class stops at its first failure
            r = run_isolated(probe_spec(spec, "cpu", mc, m, budget, 600))
            runs[m] = [(r.status, r.peak_bytes)]
            log(f"  brute {mc.label()} {m}: {r.status} {(r.peak_bytes or 0) / MIB:.0f}MiB")
            if not r.ok:
                break
        for m in sorted(runs, reverse=True):  # pass 2, decreasing
            r = run_isolated(probe_spec(spec, "cpu", mc, m, budget, 600))
            runs[m].append((r.status, r.peak_bytes))
            log(f"  brute {mc.label()} {m} (2): {r.status} {(r.peak_bytes or 0) / MIB:.0f}MiB")
        ok = [m for m, rs in runs.items() if all(s == "ok" for s, _ in rs)]
        within = [m for m in ok if all((p or 0) <= usable for _, p in runs[m])]
        out[mc.label()] = {"runs": {str(m): rs for m, rs in runs.items()},
                           "true_max_cap": max(ok, default=0),
                           "true_max_usable": max(within, default=0)}
    return out


def run_peer(spec: WorkloadSpec, peer: str, budget: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "peer.json")
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HERE / "peer_child.py"), "--workload", spec.target, "--peer",
             peer, "--budget-bytes", str(budget), "--target", str(TARGET), "--out", str(out)],
            env=child_environment(), capture_output=True, text=True, timeout=1200)
        wall = time.perf_counter() - start
        if out.exists():
            result = json.loads(out.read_text())
        else:
            result = {"status": "crash", "found": None,
                      "message": f"exit {proc.returncode}: {proc.stderr[-500:]}"}
    result["child_wall_s"] = wall
    return result


def bench_workload(name: str, factory: str) -> dict:
    spec = WorkloadSpec(kind="file", target=f"{HERE}/workloads.py:{factory}")
    budget = choose_cap(spec)
    usable = int(budget * (1 - HEADROOM))
    log(f"== {name}: probe under {format_bytes(budget)}")
    start = time.perf_counter()
    report = api.probe(spec, target_batch=TARGET, device="cpu", memory_budget=budget,
                       headroom=HEADROOM, precisions=["fp32", "bf16"], compile_modes=["off"])
    probe_s = time.perf_counter() - start
    probes = {p.memory_class.label(): {
        "max_micro_batch": p.max_micro_batch, "num_probes": p.num_probes,
        "probe_s": sum(s.wall_s or 0.0 for s in p.steps),
        "steps": [(s.micro_batch, s.status, s.peak_bytes, s.fits) for s in p.steps]}
        for p in report.probes}
    log(f"   {probes}")
    log(f"== {name}: brute force")
    truth = brute_force(spec, budget, usable)
    reruns = {}
    for label, p in probes.items():
        if p["max_micro_batch"]:
            reruns[label] = [config_run(spec, label.split("/")[0], p["max_micro_batch"], budget)
                             for _ in range(2)]
    peers = {}
    for peer in PEERS:
        log(f"== {name}: {peer}")
        result = run_peer(spec, peer, budget)
        found = result.get("found")
        if found:
            result["reruns"] = [config_run(spec, "fp32", found, budget) for _ in range(2)]
            result["fits_on_rerun"] = all(r["status"] == "ok" for r in result["reruns"])
            result["effective_batch"] = found * max(1, TARGET // found)
        log(f"   {result}")
        peers[peer] = result
    ratios = {label: (p["max_micro_batch"] / truth[label]["true_max_cap"]
                      if truth[label]["true_max_cap"] else None) for label, p in probes.items()}
    return {"workload": name, "spec": spec, "target_batch": TARGET, "budget_bytes": budget,
            "usable_bytes": usable, "probe_s": probe_s, "probes": probes, "truth": truth,
            "fit_ratio": ratios, "reruns": reruns,
            "num_rerun_ooms": sum(r["status"] != "ok" for rs in reruns.values() for r in rs),
            "peers": peers}


def _ratio(found: int, truth: int) -> str:
    return f"{found / truth:.2f}" if truth else "-"


def render(out: dict) -> str:
    m = out["machine"]
    lines = [
        "# Memory fit and peers (CPU testbed)", "",
        f"{m['date']}; {m.get('cpu_model') or m['processor']}, {m['cpus']} CPUs, "
        f"{m['platform']}; torch {m['torch']}, transformers {m['transformers']}, lightning "
        f"{m['lightning']}, accelerate {m['accelerate']}. Run {out['wall_s']:.0f} s.", "",
        f"Target batch {TARGET}; per-workload cap (RLIMIT_AS over the child's baseline after "
        "imports and the model build, model tensors counted by their bytes) at the midpoint of "
        "the fp32 eager peaks at micro-batches 16 and 32; autotune's headroom "
        f"{HEADROOM:.0%}; the runner's glibc settings (one arena, immediate trim). Eager "
        "classes only (compiled classes are in "
        "search_quality). True max = the largest divisor of the target that ran in both "
        "brute-force passes under the cap; 'within headroom' also keeps its peak under the "
        "budget minus headroom (autotune's fit rule). Seconds are wall time on a shared 2-core "
        f"VM: {out.get('concurrency') or 'other jobs may have run at the same time'}.", "",
        "## autotune probe vs brute force", "",
        "| workload | cap | class | probe max | probes | probe s | true max (cap) "
        "| true max (within headroom) | ratio: cap (within headroom) | re-runs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in out["rows"]:
        for label, p in r["probes"].items():
            t = r["truth"][label]
            ratio = r["fit_ratio"][label]
            lines.append(
                f"| {r['workload']} | {format_bytes(r['budget_bytes'])} | {label} | "
                f"{p['max_micro_batch']} | {p['num_probes']} | {p['probe_s']:.0f} | "
                f"{t['true_max_cap']} | {t['true_max_usable']} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} "
                f"({_ratio(p['max_micro_batch'], t['true_max_usable'])}) | "
                f"{', '.join(x['status'] for x in r['reruns'].get(label, []))} |")
    lines += ["", "## Peers (fp32 eager, same cap)", "",
              "Effective batch: what a user ends up with at accumulation = target // batch "
              "(Accelerate's automatic_gradient_accumulation example; Lightning leaves "
              "accumulate_grad_batches to the user). Fits on re-run: the batch at that "
              "accumulation, two optimizer steps, in two fresh capped processes.", "",
              "| workload | finder | batch found | trials | search s | fits on re-run "
              "| effective batch |", "|---|---|---:|---:|---:|---|---:|"]
    for r in out["rows"]:
        p = r["probes"]["fp32/off"]
        ok = all(x["status"] == "ok" for x in r["reruns"].get("fp32/off", []))
        lines.append(f"| {r['workload']} | autotune probe (fp32/off) | {p['max_micro_batch']} | "
                     f"{p['num_probes']} | {p['probe_s']:.0f} | {'yes' if ok else 'NO'} | "
                     f"{TARGET} |")
        for peer, res in r["peers"].items():
            if res.get("found"):
                lines.append(
                    f"| {r['workload']} | {peer} | {res['found']} | {len(res['tried'])} | "
                    f"{res['search_s']:.0f} | {'yes' if res['fits_on_rerun'] else 'NO'} | "
                    f"{res['effective_batch']} |")
            else:
                lines.append(f"| {r['workload']} | {peer} | failed: "
                             f"{res.get('message', '')[:120]} | {len(res.get('tried', []))} | "
                             f"{res.get('search_s', 0):.0f} | - | - |")
    lines += ["", "autotune's probe seconds include a fresh child process per probe (import "
              "and model build); the peers search in-process after one start-up.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="workload factories in order, e.g. pick_cnn,pick_gpt2")
    parser.add_argument("--concurrency", default="")
    parser.add_argument("--render", action="store_true", help="re-render the JSON results")
    args = parser.parse_args()
    if args.render:
        out = json.loads((HERE / "results" / "memory_fit.json").read_text())
        print(write_results("memory_fit", out, render(out)).read_text())
        return
    start = time.perf_counter()
    only = args.only.split(",") if args.only else list(WORKLOADS.values())
    out = {"machine": machine(), "rows": [], "concurrency": args.concurrency, "wall_s": 0.0}
    for factory in only:  # results written after each workload: a cut-short run keeps them
        name = next(n for n, f in WORKLOADS.items() if f == factory)
        out["rows"].append(bench_workload(name, factory))
        out["wall_s"] = time.perf_counter() - start
        write_results("memory_fit", out, "rendering failed: python benchmarks/memory_fit.py "
                      "--render\n")
        write_results("memory_fit", out, render(out))
    print((HERE / "results" / "memory_fit.md").read_text())


if __name__ == "__main__":
    main()
