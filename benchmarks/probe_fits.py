"""Where memory probes end on the replay's tables: the figures behind ``probe.PROBE_AHEAD``, and
a check of a bound not (yet) in the search.

- **The baseline's fit**: per set of tables (the recorded ones, the generated develop and judge
  families), how many tables have fp32 eager's largest fit at the largest micro-batch, one
  below it, and so on, and the share the ``k`` largest cover (``PROBE_AHEAD``: the baseline's
  probe, with several slots, runs its largest micro-batches at once).
- **A descent's fan**: with 8 slots, the sizes of the steps of every memory probe (1: one run;
  2 or more: a descent's runs at once, ``memory.probe_steps``'s ``ahead``), replayed at seed 0
  (``PROBE_AHEAD`` bounds them; the baseline's probe run ahead is not a probe's step).
- **Compiled classes that fit nothing**: on the CPU tables, where one compiled class (default
  knobs) fits no micro-batch, whether another compiled class of the same mode and
  checkpointing, whose eager class peaked no lower at the largest micro-batch both ran, also
  fits nothing (the reasoning of ``reach_bounds.oom_class_peak``, applied to a class's own
  probe).
- **A compiled class out of memory at its first guess** (``fits.floor_first``): on the CPU
  tables, each compiled class (default knobs) that does not fit at fp32 eager's largest fit
  (its probe's first guess there), by where it fits below: nowhere (the smallest tried next
  says so in one run), at the micro-batch just below (the plain probe's next run finds it;
  floor-first goes up from the smallest), or lower.

Run: ``python benchmarks/probe_fits.py``.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterable

from replay_families import tables_of
from replay_tables import Table

from autotune.search._records import Candidate

SETS = ("recorded", "develop", "judge")


def baseline_fit_ranks(tables: Iterable[Table]) -> collections.Counter[int | None]:
    """Per table, the rank of fp32 eager's largest fit among the table's micro-batches (0: the
    largest; None: it fits none), counted."""
    ranks: collections.Counter[int | None] = collections.Counter()
    for t in tables:
        batches = sorted({Candidate.from_key(k).micro_batch for k in t.entries})
        fit = max((Candidate.from_key(k).micro_batch for k in t.entries
                   if k.startswith("fp32/off/") and t.fits(k)), default=0)
        ranks[len(batches) - 1 - batches.index(fit) if fit in batches else None] += 1
    return ranks


def compiled_pairs(tables: Iterable[Table]) -> tuple[int, list[tuple[str, str, str]]]:
    """On CPU tables, pairs (a fits nothing compiled; b of the same mode and checkpointing,
    its eager class peaking no lower than a's at the largest micro-batch both ran in full):
    how many b fit nothing too, and those that fit something (table, a, b)."""
    held, broken = 0, []
    for t in tables:
        if not t.compile_in_peak():
            continue
        peaks: dict = collections.defaultdict(dict)
        fit: dict = collections.defaultdict(int)
        for key, e in t.entries.items():
            c = Candidate.from_key(key)
            if e.runs and all(r.status == "ok" for r in e.runs):
                peaks[c.knobs][c.micro_batch] = max(r.peak_bytes or 0 for r in e.runs)
            if t.fits(key):
                fit[c.knobs] = max(fit[c.knobs], c.micro_batch)
        compiled = [k for k in {Candidate.from_key(key).knobs for key in t.entries}
                    if k.compiled and k.optimizer_impl == "default"
                    and k.memory_format == "contiguous"]
        for a in (a for a in compiled if not fit[a]):
            for b in compiled:
                if b == a or (b.compile_mode, b.checkpointing) != (a.compile_mode,
                                                                   a.checkpointing):
                    continue
                ea, eb = (k.with_(compile_mode="off") for k in (a, b))
                common = sorted(set(peaks[ea]) & set(peaks[eb]))
                if common and peaks[eb][common[-1]] >= peaks[ea][common[-1]]:
                    if fit[b]:
                        broken.append((t.name, a.label(), b.label()))
                    else:
                        held += 1
    return held, broken


def below_first_guess(tables: Iterable[Table]) -> collections.Counter[str]:
    """On CPU tables, each compiled class (default knobs) that does not fit at fp32 eager's
    largest fit, counted by where it fits below it: "nowhere", "just below", "lower"
    (``fits.floor_first``)."""
    where: collections.Counter[str] = collections.Counter()
    for t in tables:
        if not t.compile_in_peak():
            continue
        batches = sorted({Candidate.from_key(k).micro_batch for k in t.entries})
        fit = max((Candidate.from_key(k).micro_batch for k in t.entries
                   if k.startswith("fp32/off/") and t.fits(k)), default=0)
        below = [m for m in batches if m < fit]
        classes = {Candidate.from_key(k).knobs for k in t.entries}
        for knobs in (k for k in classes if k.compiled and "+" not in k.label()):
            if not below or f"{knobs.label()}/{fit}" not in t.entries \
                    or t.fits(f"{knobs.label()}/{fit}"):
                continue
            fits = [m for m in below if t.fits(f"{knobs.label()}/{m}")]
            where["nowhere" if not fits else "just below" if max(fits) == below[-1]
                  else "lower"] += 1
    return where


def fan_sizes(tables: Iterable[Table], width: int = 8) -> collections.Counter[int]:
    """Each memory probe's steps in a replay with ``width`` slots (seed 0), by their runs."""
    import contextlib
    import io

    from replay_device import plan_of
    from replay_parallel import replay_one

    import autotune.search.stages.probe as probe

    sizes: collections.Counter[int] = collections.Counter()
    steps = probe.probe_steps

    def counted(*args, **options):  # type: ignore[no-untyped-def]
        chain = steps(*args, **options)
        try:
            step = next(chain)
            while True:
                sizes[len(step) if isinstance(step, tuple) else 1] += 1
                step = chain.send((yield step))
        except StopIteration as done:
            return done.value

    probe.probe_steps = counted
    try:
        for t in tables:
            with contextlib.redirect_stderr(io.StringIO()):
                replay_one(t, 0, width, plan_of(t))
    finally:
        probe.probe_steps = steps
    return sizes


def main() -> int:
    print("fp32 eager's largest fit, by its rank among a table's micro-batches (0: the largest)")
    for which in SETS:
        tables = tables_of(which)
        ranks = baseline_fit_ranks(tables)
        cover = {k: sum(n for r, n in ranks.items() if r is not None and r < k) / len(tables)
                 for k in (1, 2, 3, 4)}
        print(f"  {which:9s} {len(tables):3d} tables: "
              + ", ".join(f"{r}: {n}" for r, n in sorted(ranks.items(), key=lambda kv: (
                  kv[0] is None, kv[0] or 0)))
              + "; the k largest cover " + ", ".join(f"k={k} {c:.0%}" for k, c in cover.items()))
    print("a memory probe's steps with 8 slots (seed 0), by their runs (2+: a descent's fan)")
    for which in SETS:
        sizes = fan_sizes(tables_of(which))
        print(f"  {which:9s} " + ", ".join(f"{n} run(s): {c}" for n, c in sorted(sizes.items())))
    print("a compiled class that fits nothing: another whose eager class peaks no lower")
    for which in SETS:
        held, broken = compiled_pairs(tables_of(which))
        print(f"  {which:9s} fits nothing too: {held} of {held + len(broken)}"
              + (f"; fits something: {', '.join(f'{t} {b}' for t, _, b in broken)}"
                 if broken else ""))
    print("a compiled class out of memory at fp32 eager's fit: where it fits below")
    for which in SETS:
        where = below_first_guess(tables_of(which))
        print(f"  {which:9s} " + ", ".join(f"{w}: {where[w]}" for w in (
            "nowhere", "just below", "lower")) + f" (of {sum(where.values())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
