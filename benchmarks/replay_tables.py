"""The replay's tables: every committed exhaustive pass, one table per (workload, machine).

A table holds, per candidate (``Candidate.key()``, e.g. ``bf16/default+ckpt=blocks/32``), each
recorded run (status, median step time, timed steps, spread, peak, wall and compile seconds),
whether it fits the table's usable budget, and its truth (the mean of its runs' samples/s, a
run that stalled left out: ``truth_of``).
CPU tables come from ``benchmarks/results/search_quality*.json`` through ``rule_checks.rows``
(files oldest first, an oracle wholly reused by a later file counted once); the rows of one
workload on one machine at one target are merged (budgets within 1% are one table, judged at
the smaller), a run that a later file stored again (``--oracle-from``) counted once. GPU
tables come from ``results/gpu/gpu_suite-*oracle*.json``: the H200 uncapped pass and the H200
24 GiB capped passes (2026-11-26b with its -rest file, 2026-11-27 with its -rest file).

The noise model (``Table.sigma``): a run's log-normal noise, fitted on the table's repeated
runs: log(run median / its candidate's geometric mean) over the candidates with two or more ok
runs of at least 5 timed steps each, scaled for the mean they are taken from, and its sigma
taken robustly (1.4826 x the median absolute deviation, so that one run several times slower
than its twin does not set it alone: those runs stay in the table and are drawn as they are);
a table with fewer than 5 such candidates borrows the pool of every table on its machine (said
in ``sigma_note``). The runs of a candidate come from passes in different sittings, so the
noise is a run's drift between hours, not its steps' spread within a run.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from rule_checks import RESULTS, rows

from autotune.config import DeviceInfo, WorkloadSpec
from autotune.device import backend_for
from autotune.search._records import Candidate
from autotune.traits import WorkloadTraits

GIB = 2**30
H200_BYTES = 143771 * 2**20  # nvidia-smi's memory.total (results/gpu/device-h200-*.txt)
MIN_NOISE_CANDIDATES = 5


@dataclass(frozen=True)
class Run:
    status: str
    median_s: float | None
    num_steps: int
    spread: float | None
    peak_bytes: int | None
    wall_s: float | None
    source: str = field(default="", compare=False)
    """The file (the sitting) that recorded it."""

    def same(self, other: Run) -> bool:
        """The same run read from another file (a stored run's wall seconds may differ)."""
        return (self.status, self.median_s, self.num_steps, self.peak_bytes) == (
            other.status, other.median_s, other.num_steps, other.peak_bytes)

    def overhead_s(self) -> float:
        """The run's wall seconds less its timed steps (start-up, warm-up, compile)."""
        timed = (self.median_s or 0.0) * self.num_steps
        return max(0.0, (self.wall_s or 0.0) - timed)


STALL_FACTOR = 2.0
"""How much slower than the median of its candidate's other runs a recorded run is, at least,
to count as a run that stalled (a neighbour, a slow minute of a shared machine), not a draw of
the candidate's speed: the truth leaves it out (``truth_of``). Twice, not the 1.5x a stall
starts at (``intervals.SINGLE_RUN_GAPS``; the generated ``stall`` family draws 1.5-2x):
sittings of one table differ by 15.6% candidate by candidate on the EPYC deep GPT (sd of the
log, ``replay_explain.py sittings``), where runs 1.5-1.7x apart are a slow sitting as much as a
stall, and the truth keeps them; the recorded stalls are 2.1-9x (slow CNN and BERT on the
Xeon: fp32 eager BERT at 4 ran 14.1 and 1.6 samples/s)."""


def truth_of(target: int, medians: list[float]) -> float | None:
    """A candidate's truth from its recorded runs' median step times: the mean of their
    samples/s, each run under the median of its candidate's other runs by ``STALL_FACTOR`` or
    more left out (a stall only slows: before 2026-12-01 such a run pulled the mean down as if
    it were the config's speed; on the slow CNN Xeon table fp32 compiled foreach at 8 ran 7.2
    and 32.1 samples/s, truth 19.7, and its precision-swapped twin 102 and 20, truth 62 where
    its speed is 102). A single run is kept. None: no run."""
    if not medians:
        return None
    speeds = [target / m for m in medians]
    kept = [s for i, s in enumerate(speeds) if len(speeds) < 2
            or s * STALL_FACTOR > statistics.median(speeds[:i] + speeds[i + 1:])]
    return statistics.fmean(kept)  # (the fastest run is always kept)


@dataclass
class Entry:
    key: str
    accumulate_steps: int
    runs: list[Run] = field(default_factory=list)
    compile_s: float | None = None
    fits_first_launch: bool = True
    excluded: str = ""

    def ok_medians(self) -> list[float]:
        return [r.median_s for r in self.runs if r.status == "ok" and r.median_s]


@dataclass
class Table:
    name: str
    machine: str
    workload: str
    spec: WorkloadSpec
    device: DeviceInfo
    target: int
    budget_bytes: int
    headroom: float
    entries: dict[str, Entry]
    sources: list[str]
    search: dict = field(default_factory=dict)
    """How the live search ran on this table's workload: api.search's restrictions and
    ``SearchSettings`` fields (the GPU suite's)."""
    sigma: float = 0.0
    sigma_note: str = ""
    held_out: bool = False
    truths: dict[str, float] | None = None
    """A generated table's truth per candidate (samples/s), where its runs are measurements of
    it (stalled, drifting, noisy: ``replay_families``); None: the mean of the recorded runs."""
    stall: tuple[float, float, float] = ()
    """(share, least, most): that share of the runs the replay answers is stalled, its step
    times multiplied by a factor drawn between the two (a stall only slows)."""
    drift_per_hour: float = 0.0
    """Step times drift by this share per hour of the replay's simulated clock."""
    _cold: tuple[dict[str, Entry], dict[str, int]] | None = field(
        default=None, repr=False, compare=False)
    """``cold_peak``'s groups, kept with the entries they were made from."""

    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1 - self.headroom))

    def fits(self, key: str) -> bool:
        """Every run ok, every peak within the usable budget, and (compiled on CPU) also as
        a first launch compiles it (``rule_checks.fits_everywhere``, over the merged runs):
        its recorded verdict, and its graphs' cold peak (``cold_peak``) within the budget."""
        e = self.entries.get(key)
        cold = self.cold_peak(key)
        return bool(e and e.runs and all(r.status == "ok" and r.peak_bytes is not None
                                         and r.peak_bytes <= self.usable_bytes()
                                         for r in e.runs) and e.fits_first_launch
                    and (cold is None or cold <= self.usable_bytes()))

    def cold_peak(self, key: str) -> int | None:
        """The peak of a run that compiles the candidate's graphs afresh, where the compile's
        own memory counts in the peak (CPU: ``DeviceBackend.compile_in_peak``): the largest
        recorded peak (a run out of memory's too: it was at least that) over the candidates
        sharing its graphs (``Candidate.graph``: an optimizer implementation leaves the
        compiled model alone). An exhaustive pass runs them one after another, so only the
        first compiled afresh; the others loaded its graphs from inductor's cache, and their
        peaks lack the compile (in the recorded CPU tables the knob-default run, made first,
        peaks the highest in 171 of the 198 such groups that have one, by 5-42 MiB, the median
        per table, up to 61 MiB: ``python benchmarks/cold_peaks.py``). None: not compiled,
        not such a device, or no peak recorded."""
        if not self.compile_in_peak() or not Candidate.from_key(key).knobs.compiled:
            return None
        if self._cold is None or self._cold[0] is not self.entries:
            groups: dict[str, int] = {}
            for k, e in self.entries.items():
                peaks = [r.peak_bytes for r in e.runs if r.peak_bytes]
                if peaks:
                    g = Candidate.from_key(k).graph().key()
                    groups[g] = max(groups.get(g, 0), *peaks)
            self._cold = (self.entries, groups)
        return self._cold[1].get(Candidate.from_key(key).graph().key())

    def compile_in_peak(self) -> bool:
        """Whether a compile's own memory counts in this table's peaks (its device's backend:
        CPU, where the compile runs in the capped process)."""
        return backend_for(self.device.device).compile_in_peak

    def truth(self, key: str) -> float | None:
        """The mean of the candidate's recorded runs' samples/s, stalled ones left out
        (``truth_of``; None: none ran ok), or the generated table's own truth (``truths``)."""
        e = self.entries.get(key)
        if self.truths is not None and e and e.ok_medians():
            return self.truths.get(key)
        return truth_of(self.target, e.ok_medians() if e else [])

    def best(self) -> tuple[str, float]:
        """The fastest candidate that fits, and its truth."""
        fitting = [(t, k) for k in self.entries if self.fits(k) and (t := self.truth(k))]
        t, k = max(fitting)
        return k, t

    def pass_s(self) -> float:
        """One exhaustive pass: each candidate's first recorded run's wall seconds."""
        return sum(e.runs[0].wall_s or 0.0 for e in self.entries.values() if e.runs)

    def num_runs(self) -> int:
        return sum(len(e.runs) for e in self.entries.values())

    def sittings(self) -> dict:
        """What merging its sittings (the files its runs come from) into one truth hides: the
        runs of each, the candidates timed in two or more, how far their sittings' geometric
        means differ (the largest over the smallest: median and worst), and each sitting's own
        best (the fastest fitting candidate by that sitting's runs alone)."""
        per: dict[str, dict[str, list[float]]] = collections.defaultdict(dict)
        for k, e in self.entries.items():
            for r in e.runs:
                if r.status == "ok" and r.median_s:
                    per[r.source or "?"].setdefault(k, []).append(r.median_s)
        ratios = []
        for k in self.entries:
            means = [math.exp(statistics.fmean(map(math.log, got[k])))
                     for got in per.values() if k in got]
            if len(means) > 1:
                ratios.append(max(means) / min(means))
        best = {src: max((k for k in got if self.fits(k)),
                         key=lambda k, got=got: -statistics.fmean(got[k]), default=None)
                for src, got in per.items()}
        return {"sittings": len(per),
                "runs": {src: sum(map(len, got.values())) for src, got in per.items()},
                "candidates_in_several": len(ratios),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_max": max(ratios) if ratios else None,
                "best_by_sitting": best}

    def traits(self) -> WorkloadTraits | None:
        """What the table shows of the workload: checkpointing and channels_last apply where it
        ran them, the optimizer is AdamW (its default implementation as the table's exclusion
        says); None where it ran no knob beyond precision and compile mode (the search then
        asks for every value, and the table lacks them: counted as not recorded)."""
        knobs = [Candidate.from_key(k).knobs for k, e in self.entries.items() if e.runs]
        if not any(k.changed() for k in knobs) and not self.device.is_cuda:
            return None
        why = " ".join(e.excluded for e in self.entries.values())
        built = re.search(r"as built already runs ([a-z-]+)", why)
        # every recorded workload builds AdamW (for-loop on CPU parameters, foreach on CUDA
        # ones); the GPU's, the built-in default, has blocks to checkpoint
        default = built.group(1) if built else ("foreach" if self.device.is_cuda else "")
        return WorkloadTraits(
            num_blocks=2 if self.device.is_cuda or any(k.checkpointing != "off" for k in knobs)
            else 0,
            has_conv2d=any(k.memory_format == "channels_last" for k in knobs),
            image_input=any(k.memory_format == "channels_last" for k in knobs),
            optimizer="AdamW", optimizer_impls=("for-loop", "foreach", "fused"),
            optimizer_default=default)


def _family(cpu_model: str) -> str:
    return "xeon" if "Xeon" in cpu_model else "epyc"


def _short(row: dict) -> str:
    if row.get("short"):
        return row["short"]
    title = row["workload"].lower()
    return "tiny_" + ("cnn" if "cnn" in title else "gpt2" if "gpt" in title else "bert")


def _runs(c: dict, source: str = "") -> list[Run]:
    n = len(c.get("statuses") or ())
    def at(name: str, i: int):
        values = c.get(name) or []
        return values[i] if i < len(values) else None
    peaks = c.get("run_peak_bytes") or [c.get("peak_bytes")] * n
    return [Run(c["statuses"][i], at("medians_s", i), at("num_timed_steps", i) or 0,
                at("spreads", i), peaks[i] if i < len(peaks) else None, at("wall_s", i),
                source)
            for i in range(n)]


def _merge(entries: dict[str, Entry], candidates: list[dict], target: int,
           source: str = "") -> None:
    for c in candidates:
        e = entries.setdefault(c["key"], Entry(c["key"], c.get("accumulate_steps")
                                               or target // c["micro_batch"]))
        e.excluded = e.excluded or c.get("excluded", "")
        if c.get("fits_first_launch") is False:
            e.fits_first_launch = False
        for run in _runs(c, source):  # a stored run (--oracle-from) comes back in later files
            if not any(r.same(run) for r in e.runs):
                e.runs.append(run)
        if c.get("compile_s") is not None:
            e.compile_s = min(c["compile_s"], e.compile_s or math.inf)


def cpu_tables() -> list[Table]:
    groups: dict[tuple, Table] = {}
    for name, row in rows("search_quality*.json"):
        data = json.loads((RESULTS / name).read_text())
        machine = data.get("machine") or {}
        family = _family(machine.get("cpu_model") or "")
        budget, target = row["budget_bytes"], row["target_batch"]
        key = (row["workload"], family, target)
        same = [k for k, t in groups.items() if k[:3] == key
                and abs(t.budget_bytes - budget) <= 0.01 * max(budget, t.budget_bytes)]
        if same:
            table = groups[same[0]]
            table.budget_bytes = min(table.budget_bytes, budget)
        else:
            spec = WorkloadSpec(**row["spec"]) if row.get("spec") else WorkloadSpec()
            usable = row.get("usable_bytes")
            device = DeviceInfo(device="cpu", name=machine.get("cpu_model") or family,
                                total_memory_bytes=16 * GIB, available_memory_bytes=16 * GIB,
                                supports_bf16=True, supports_fp16=False, supports_tf32=False,
                                native_bf16=True)  # where the table ran no bf16: below
            table = groups[(*key, budget)] = Table(
                name="", machine=f"{family} (2 CPUs)", workload=row["workload"], spec=spec,
                device=device, target=target, budget_bytes=budget,
                headroom=round(1 - usable / budget, 6) if usable else 0.1, entries={},
                sources=[])
            table.name = f"{_short(row)}-{family}"
        _merge(table.entries, row["oracle"]["candidates"], target, name)
        if name not in table.sources:
            table.sources.append(name)
    tables = list(groups.values())
    for t in tables:  # a CPU that emulates bf16 (the EPYC of 2026-11-25 on): fp32 only
        if not any(k.startswith("bf16/") for k, e in t.entries.items() if e.runs):
            t.device = replace(t.device, native_bf16=False)
    for t in tables:  # one name each: the target, then the budget, where two share one
        twins = [u for u in tables if u.name == t.name]
        if len(twins) > 1 and len({u.target for u in twins}) > 1:
            t.name += f"-t{t.target}"
    for t in tables:
        twins = [u for u in tables if u.name == t.name]
        if len(twins) > 1:
            t.name += f"-{t.budget_bytes / 2**20:.0f}MiB"
    return tables


def gpu_tables() -> list[Table]:
    device = DeviceInfo(device="cuda:0", name="NVIDIA H200", total_memory_bytes=H200_BYTES,
                        available_memory_bytes=H200_BYTES, supports_bf16=True,
                        supports_fp16=True, supports_tf32=True, native_bf16=True,
                        compute_capability="9.0")
    restrict = {"precisions": ["bf16", "fp32"], "compile_modes": ["off", "default"]}
    specs = (  # (name, files, budget, the suite's search: its step's budget_s of 200 / 300)
        ("gpt2-h200", ["gpu_suite-ranks-oracle-gpt2-h200-2026-11-26.json"], None,
         {**restrict, "micro_batches_per_class": 2, "time_budget_s": 160.0}),
        ("gpt2-h200-capped", ["gpu_suite-search-gpt2-capped-oracle-gpt2-capped-h200-2026-11-26b"
                              ".json", "gpu_suite-oracle-gpt2-capped-rest-h200-2026-11-26c.json",
                              "gpu_suite-oracle-gpt2-capped-h200-2026-11-27.json",
                              "gpu_suite-oracle-gpt2-capped-rest-h200-2026-11-27.json"],
         24 * GIB, {**restrict, "micro_batches_per_class": 2, "time_budget_s": 260.0}))
    tables = []
    for name, files, budget, search in specs:
        entries: dict[str, Entry] = {}
        for f in files:
            for step in json.loads((RESULTS / "gpu" / f).read_text())["steps"].values():
                if "candidates" in step:
                    _merge(entries, step["candidates"], 64, f)
        tables.append(Table(
            name=name, machine="H200", workload="GPT-2 small (built-in default, seq 1024)",
            spec=WorkloadSpec(), device=device, target=64,
            budget_bytes=budget or H200_BYTES, headroom=0.1, entries=entries,
            sources=files, search=search))
    return tables


def _deviations(table: Table) -> tuple[list[float], int]:
    """Log deviations of each repeated candidate's runs from their geometric mean, each scaled
    by sqrt(k / (k - 1)) for its candidate's k runs (a run's deviation from the mean of k has
    (k - 1) / k of a run's variance), and the number of candidates they come from."""
    devs, groups = [], 0
    for e in table.entries.values():
        logs = [math.log(r.median_s) for r in e.runs
                if r.status == "ok" and r.median_s and r.num_steps >= 5]
        if len(logs) >= 2:
            mean, k = statistics.fmean(logs), len(logs)
            devs += [(x - mean) * math.sqrt(k / (k - 1)) for x in logs]
            groups += 1
    return devs, groups


def _sigma(devs: list[float]) -> float:
    """A run's log-noise: 1.4826 x the median absolute deviation (a normal's sigma; a run
    several times slower than its twin, a busy VM's, does not set it alone)."""
    return 1.4826 * statistics.median(abs(d) for d in devs) if devs else 0.0


def fit_noise(tables: list[Table]) -> None:
    """Each table's ``sigma``: its own pooled run-to-run spread, or its machine's pool."""
    pool: dict[str, tuple[list[float], int]] = collections.defaultdict(lambda: ([], 0))
    own = {}
    for t in tables:
        devs, groups = own[t.name] = _deviations(t)
        pooled_devs, pooled_groups = pool[t.machine]
        pool[t.machine] = (pooled_devs + devs, pooled_groups + groups)

    for t in tables:
        devs, groups = own[t.name]
        if groups >= MIN_NOISE_CANDIDATES:
            t.sigma = _sigma(devs)
            t.sigma_note = f"own: {groups} candidates, {len(devs)} runs"
        else:
            t.sigma = _sigma(pool[t.machine][0])
            t.sigma_note = (f"borrowed ({groups} repeated candidates here): {t.machine} pool "
                            f"of {pool[t.machine][1]} candidates, {len(pool[t.machine][0])} runs")


def all_tables() -> list[Table]:
    """Every table, its noise fitted, in a stable order."""
    tables = cpu_tables() + gpu_tables()
    fit_noise(tables)
    return tables


def gpu_oracle_files() -> list[str]:
    """Every GPU oracle file (a test checks each is a table's source)."""
    return sorted(Path(p).name for p in glob.glob(str(RESULTS / "gpu" / "*oracle*.json")))
