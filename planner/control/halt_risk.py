"""What a role choice is worth once the risk of a halt is counted (docs/design.md
section 11, "Safe by default").

A stage left with one copy (one live holder and no peer-memory snapshot) halts the run
at its holder's next death. The model, with nothing beyond what choose_roles is given:
the horizon H is the expected time to the next event, and with n live workers failing
independently at one rate, each worker's rate is 1/(n*H) (every event counted as a
death: the cautious side). With k one-copy stages the run halts at rate r = k/(n*H);
a halt loses the rest of the horizon's progress, so a candidate with period P and stall
T is worth its expected training over the horizon:

    E[work] = integral from T to H of exp(-r t) dt / P

which is (H - T) / P when nothing is at risk (k = 0, or with snapshots: a stage whose
only holder dies restores from peer memory), and falls with every one-copy stage: one
more such stage costs about 1/(2n) of the horizon, 9% at 5 live workers.

A returning worker goes home: an assignment that places a fresh worker outside its home
stage must be worth HOME_MARGIN more than the best one that does not (its home slot is
where its peers and its node's snapshots expect it; a move for a few percent is not worth
the surprise).
"""
from __future__ import annotations

import math

HOME_MARGIN = 0.05  # relative gain a fresh worker placed away from home must bring


def one_copy_stages(counts: list[int], snapshots: bool) -> int:
    """Stages whose next death halts the run: one holder, and no snapshot to restore."""
    return 0 if snapshots else sum(1 for c in counts if c == 1)


def expected_work(horizon: float, stall: float, period: float, at_risk: int,
                  live: int) -> float:
    """Iterations expected before the horizon ends or a halt stops the run (module doc)."""
    if horizon <= stall or period <= 0:
        return 0.0
    if at_risk <= 0 or live <= 0:
        return (horizon - stall) / period
    # in units of the horizon: r*H = k/n; integral = (exp(-a) - exp(-b)) / r
    b = at_risk / live
    a = b * stall / horizon
    return -math.exp(-a) * math.expm1(-(b - a)) * horizon / (b * period)


def with_home_margin(value: float, strays: int) -> float:
    """The value a comparison uses: a candidate sending fresh workers away from home
    competes at 1/(1 + HOME_MARGIN) of its worth."""
    return value / (1.0 + HOME_MARGIN) if strays else value
