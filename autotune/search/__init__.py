"""The search: probe and time memory classes in stages, and keep what wins.

The only package that imports optuna: its study records every run, so an interrupted search
resumes (completed runs are reused) and several processes can share one (``--storage``).
The search is stated once in ``docs/search.md``; its modules, top down: ``driver`` (the table
of contents: ``STAGES``, each named with its body and what a search stopped before it never
began), ``stages/`` (``probe``, ``knobs``, ``refine``, ``joint``: the knobs screened where they
interact, ``race``: the race and its first-launch check, one loop; ``remeasure``: a batch of
re-measures), ``outcome`` (``SearchOutcome`` and the ``autotune.json`` content),
``policy`` (who races, when a race stops), ``bounds`` (one function per rule: can it still
win?), ``fits`` (what the evidence says of memory) and ``executor`` (one child run: limits,
the study, cost), ``evidence`` (every run, the decisions beside them, the leader, the
``Interval``), ``plan`` (the space and its relations), ``rules`` (the rule ids and the typed
``Skip``), ``pick`` (the winner, the rounds' majority rule); ``_records`` the verdict on each
run, ``_study`` the study (``_trials`` what its trials say, read back), ``_ledger`` the one
seam through which a search touches it (a store that fails costs the cache, not the search),
``_store`` the local store.
"""

from autotune.search._ledger import Ledger, recall, remember
from autotune.search._records import (
    LOSS_TOLERANCE,
    Candidate,
    SearchSettings,
    classify,
    flops_per_sample,
    objective,
    score,
)
from autotune.search._store import (
    cache_dir,
    clear_studies,
    list_studies,
    store_path,
)
from autotune.search._study import (
    CONSTRAINT,
    check_storage,
    open_study,
    redact,
)
from autotune.search._trials import completed, probed
from autotune.search.driver import run_search
from autotune.search.executor import OnTrial
from autotune.search.forecast import RunCount
from autotune.search.outcome import SearchOutcome, tuned_config
from autotune.search.pick import break_even_steps, pick_winner
from autotune.search.slots import Slots, ThreadSlots, plan_slots, thread_slots

__all__ = [
    "CONSTRAINT",
    "LOSS_TOLERANCE",
    "Candidate",
    "Ledger",
    "OnTrial",
    "RunCount",
    "SearchOutcome",
    "SearchSettings",
    "Slots",
    "ThreadSlots",
    "break_even_steps",
    "cache_dir",
    "check_storage",
    "classify",
    "clear_studies",
    "completed",
    "flops_per_sample",
    "list_studies",
    "objective",
    "open_study",
    "pick_winner",
    "plan_slots",
    "probed",
    "recall",
    "redact",
    "remember",
    "run_search",
    "score",
    "store_path",
    "thread_slots",
    "tuned_config",
]
