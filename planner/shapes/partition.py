"""A partition of the model's units into stages, and the dynamic programme that balances it.

The units are the model's ordered pieces (planner/shapes/units.py); a stage runs a
contiguous range of them. `Partition` is the wire value a plan carries (planner/plan.py):
S' = len(bounds) - 1 stages, stage k running units bounds[k] .. bounds[k+1] - 1.

`balance` cuts n units into k non-empty ranges minimising the costliest range (the
pipeline's bottleneck), then, among those, the sum of squared range costs (no stage idles
needlessly), exact ties to the split whose earlier stages end first: the same rule as
`--split balanced` (executor/models/balance.py), with a per-range memory test on top.
Two dynamic programmes over (stage, first unit): O(k * n^2).
"""
from __future__ import annotations

from typing import Annotated, Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.job import MAX_COUNT

Bounds = tuple[int, ...]


class Partition(BaseModel):
    """The shape a plan's job was cut to: which units each of its stages runs.

    `unit` says what a unit is: `layer`, an entry of the job's `layer_cost`
    ([embedding, blocks..., head]); `stage`, a stage of the job's own (fixed) partition.
    `base` is the identity hash of that job (JobSpec.identity_hash): the units are its."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    unit: Literal["layer", "stage"]
    bounds: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    base: Annotated[str, Field(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _increasing(self) -> "Partition":
        b = self.bounds
        if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
            raise ValueError(f"partition bounds must rise strictly from 0, got {b}")
        return self

    @property
    def stages(self) -> int:
        return len(self.bounds) - 1

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds, self.bounds[1:]))

    def key(self) -> str:
        """What the plan cache appends to a job's key for a plan of this shape."""
        return f"{self.unit}:{self.base}:{','.join(map(str, self.bounds))}"


def ranges(bounds: Sequence[int]) -> list[tuple[int, int]]:
    return list(zip(bounds, bounds[1:]))


def balance(costs: Sequence[float], stages: int,
            fits: Optional[Callable[[int, int], bool]] = None) -> Optional[Bounds]:
    """Bounds of `stages` non-empty contiguous ranges of `costs` (module doc), each range
    [i, j) passing `fits(i, j)` (a worker can hold it); None when no such split exists."""
    n = len(costs)
    if not 1 <= stages <= n:
        return None
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    ok = fits or (lambda i, j: True)
    allowed = [[j > i and ok(i, j) for j in range(n + 1)] for i in range(n + 1)]

    def solve(value, combine):
        """best[s][i]: optimum of stages s..k-1 when stage s starts at unit i (None: none)."""
        best = [[None] * (n + 1) for _ in range(stages)]
        cut = [[None] * (n + 1) for _ in range(stages)]
        for i in range(n):
            if allowed[i][n]:
                best[stages - 1][i] = value(prefix[n] - prefix[i])
        for s in range(stages - 2, -1, -1):
            # stage s needs a unit, and each later stage one more
            for i in range(s, n - (stages - s) + 1):
                for j in range(i + 1, n - (stages - s - 1) + 1):
                    rest = best[s + 1][j]
                    if rest is None or not allowed[i][j]:
                        continue
                    v = combine(value(prefix[j] - prefix[i]), rest)
                    if v is not None and (best[s][i] is None or v < best[s][i]):
                        best[s][i], cut[s][i] = v, j
        return best, cut

    best, _ = solve(lambda c: c, max)
    if best[0][0] is None:
        return None
    bottleneck = best[0][0] * (1 + 1e-12) + 1e-12
    _, cut = solve(lambda c: c * c if c <= bottleneck else None,
                   lambda a, b: None if a is None or b is None else a + b)
    out, i = [0], 0
    for s in range(stages - 1):
        i = cut[s][i]
        out.append(i)
    out.append(n)
    return tuple(out)


def stage_sums(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    return [sum(costs[i:j]) for i, j in ranges(bounds)]


def minimax(n: int, stages: int, value: Callable[[int, int, int], Optional[float]],
            floor: Optional[Callable[[int, int, int], float]] = None
            ) -> Optional[tuple[Bounds, float]]:
    """Bounds of `stages` non-empty contiguous ranges of n units minimising the largest
    `value(k, i, j)` (stage k holding units [i, j); None: it may not), with the least
    largest value; exact ties to earlier ends. O(stages * n^2) calls of `value`, fewer
    with `floor`: a lower bound on value(k, i, j) that does not fall as j grows (a stage's
    own work), past which a longer range cannot do better."""
    if not 1 <= stages <= n:
        return None
    best = [[None] * (n + 1) for _ in range(stages)]
    cut = [[None] * (n + 1) for _ in range(stages)]
    for i in range(stages - 1, n):
        best[stages - 1][i] = value(stages - 1, i, n)
    for s in range(stages - 2, -1, -1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(i + 1, n - (stages - s - 1) + 1):
                if floor is not None and best[s][i] is not None and floor(s, i, j) >= best[s][i]:
                    break
                rest = best[s + 1][j]
                if rest is None:
                    continue
                v = value(s, i, j)
                if v is None:
                    continue
                v = max(v, rest)
                if best[s][i] is None or v < best[s][i]:
                    best[s][i], cut[s][i] = v, j
    if best[0][0] is None:
        return None
    out, i = [0], 0
    for s in range(stages - 1):
        i = cut[s][i]
        out.append(i)
    out.append(n)
    return tuple(out), best[0][0]
