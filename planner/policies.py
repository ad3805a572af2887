"""Priority rules of the list scheduler, and the small portfolio `greedy_plan` picks from.

No single rule wins everywhere (measured on the uniform sweep of
benchmarks/quality_sweep.py): where memory binds (S=8, 10 slots) the plain rule
I > F > W lets middle stages fill their slots with deferred W's, F's then wait for a W and
the pipeline loses its steady state; F-first with a W taken as soon as an F is blocked on
memory keeps F's flowing past the overloaded peers of a failed worker, a cap on F's in
flight per stage (1F1B's warm-up depth plus a margin) keeps steady state without failures.
Each run costs milliseconds on small jobs, so small jobs try every rule and keep the best.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from planner.job import JobSpec


@dataclass(frozen=True)
class Policy:
    # Cap on micro-batches between F and I on a stage-s worker: S - s + fcap (None: none).
    fcap: Optional[int] = None
    # Which stages run a ready F before a ready I: "none", "first" (stage 0 only), "all".
    f_first: str = "none"
    # When an F is ready but memory is full, run a pending W before an I: it frees the slot.
    wblock: bool = False
    # Start a W only if it ends before the next known I arrival: a W started just before
    # an I arrives delays the I, and every later stage waits with it.
    fit: bool = False
    # The same for F: no W if an F this worker could run (memory and cap allow it) arrives
    # before the W would end. Zero-bubble schedules (ZB-H1, torch's ZB1P) keep W's out of
    # the F's way like this; without it the last stage fills each short wait for an F with
    # a W and delays every later F (S=4, M=8, 4 slots: 295 against ZB1P's 277).
    fit_f: bool = False
    # Among ready F's, take the lowest index within its replica ("m") rather than the
    # earliest arrival ("ready"): every replica's last micro-batch is some stage 0's tail,
    # so a shared peer should not let one replica's micro-batches overtake another's.
    fkey: str = "ready"

    def caps(self, job: JobSpec) -> Optional[list[int]]:
        S = job.stages
        return None if self.fcap is None else [S - s + self.fcap for s in range(S)]

    def f_before_i(self, stage: int) -> bool:
        return self.f_first == "all" or (self.f_first == "first" and stage == 0)


BASE = Policy()
# Chosen by greedy set cover on the S=8 sweep (worst, then mean gap). Ordered: a large job
# runs only a prefix, and ties keep the earlier rule, so the result is deterministic.
PORTFOLIO: tuple[Policy, ...] = (
    BASE,
    Policy(f_first="first", wblock=True, fkey="m"),
    Policy(f_first="all", wblock=True, fkey="m"),
    Policy(fcap=2, fit=True),
    Policy(f_first="first"),
    Policy(f_first="all", wblock=True, fit=True),
    Policy(fcap=3, f_first="first", wblock=True),
    # ZB-H1-like (torch's ZB1P with one stage per rank): 1F1B's in-flight cap, I first, a
    # W only where it delays neither an I nor an F. Closes the gap to ZB1P under tight
    # memory (S=4, M=8, 4 slots: 277 = ZB1P, where the rules above reach 295).
    Policy(fcap=0, fit=True, fit_f=True),
    # Not kept: its F-first cousin (fcap=2, f_first="all", wblock, fit_f) gets 561 at S=8,
    # M=16, 10 slots (ZB1P 565, this portfolio 567), but as CP-SAT's hint it leads the
    # search to 543 where the 567 plan leads to 535 (the optimum).
)
# Scheduled actions the portfolio may spend (all rules together): a ~3K-action job tries
# every rule, a 200K-action job only the first (it must stay near a second).
PORTFOLIO_BUDGET = 40_000


def timeline_period(job: JobSpec, out: dict, staggered: bool = True) -> int:
    """Period of a timeline without OPTs, as add_opt + replay would measure it (each
    worker's actions are in time order)."""
    ready: dict[int, int] = {}
    for (d, s), acts in out.items():
        if acts:
            ready[s] = max(ready.get(s, 0), acts[-1][3])
    ends = {w: ready[w[1]] + job.duration("OPT", *w) for w, acts in out.items() if acts}
    if not staggered:
        return max(ends.values()) - min(acts[0][2] for acts in out.values() if acts)
    return max(ends[w] - acts[0][2] for w, acts in out.items() if acts)
