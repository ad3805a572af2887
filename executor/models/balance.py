"""`--split balanced`: stage boundaries that balance profiled per-layer cost.

layer_cost (JobSpec.layer_cost, written by `recycle profile --split balanced`) lists one
figure per layer of the model: [embedding, block 0, ..., block L-1, head], each the F+I+W
time of one micro-batch through that layer alone. Stage 0 always holds the embedding and
the last stage the head, so they get fewer blocks when those are costly (a large vocabulary
makes the head the priciest layer of a small model). Pure Python: the JobSpec carries the
numbers, the planner never sees torch.
"""
from __future__ import annotations

from typing import Optional, Sequence


def stage_costs(layer_cost: Sequence[float], boundaries: Sequence[int]) -> list[float]:
    """Each stage's summed cost under `boundaries` (first block of stages 1..S-1)."""
    L = len(layer_cost) - 2
    edges = (0, *boundaries, L)
    out = [sum(layer_cost[1 + lo:1 + hi]) for lo, hi in zip(edges, edges[1:])]
    out[0] += layer_cost[0]
    out[-1] += layer_cost[-1]
    return out


def balanced_boundaries(layer_cost: Sequence[float], stages: int) -> tuple[int, ...]:
    """Contiguous split minimising the costliest stage (the pipeline's bottleneck), then,
    among those, the sum of squared stage costs (so no stage idles needlessly), by two
    dynamic programmes over (stage, first block): O(S * L^2). Exact ties go to the split
    whose earlier stages end first: the same costs always give the same boundaries."""
    L = len(layer_cost) - 2
    if L < 0 or stages < 1:
        raise ValueError("layer_cost needs [embedding, blocks..., head] and stages >= 1")
    prefix = [0.0]
    for c in layer_cost[1:-1]:
        prefix.append(prefix[-1] + c)

    def cost(s: int, i: int, j: int) -> float:  # stage s holding blocks [i, j)
        return (prefix[j] - prefix[i] + (layer_cost[0] if s == 0 else 0)
                + (layer_cost[-1] if s == stages - 1 else 0))

    def solve(value, combine):
        """best[s][i]: optimum of stages s..S-1 when stage s starts at block i."""
        best = [[None] * (L + 1) for _ in range(stages)]
        cut = [[None] * (L + 1) for _ in range(stages)]
        for i in range(L + 1):
            best[stages - 1][i] = value(cost(stages - 1, i, L))
        for s in range(stages - 2, -1, -1):
            for i in range(L + 1):
                for j in range(i, L + 1):
                    v = combine(value(cost(s, i, j)), best[s + 1][j])
                    if v is not None and (best[s][i] is None or v < best[s][i]):
                        best[s][i], cut[s][i] = v, j
        return best, cut

    best, _ = solve(lambda c: c, max)
    bottleneck = best[0][0] * (1 + 1e-12)
    # second pass: least sum of squares with every stage within the bottleneck
    _, cut = solve(lambda c: c * c if c <= bottleneck else None,
                   lambda a, b: None if a is None or b is None else a + b)
    out, i = [], 0
    for s in range(stages - 1):
        i = cut[s][i]
        out.append(i)
    return tuple(out)


def boundaries_from_job(spec, n_layers: int, source: str) -> tuple[int, ...]:
    """The balanced boundaries for a job spec carrying layer_cost; ValueError (one line)
    when it has none or they are not this model's. source: "--job PATH" or the like."""
    costs = spec.layer_cost
    if not costs:
        raise ValueError(f"--split balanced needs per-layer costs, and {source} has none; "
                         f"write it with `recycle profile --split balanced`")
    if len(costs) != n_layers + 2:
        raise ValueError(f"--split balanced: {source} has per-layer costs of "
                         f"{len(costs) - 2} blocks, this model has {n_layers}; profile "
                         f"this model with `recycle profile --split balanced`")
    return balanced_boundaries(costs, spec.stages)


SPLITS = ("layers", "balanced")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")


def split_config(cfg, split: Optional[str], spec, job: Optional[str], service: Optional[str]):
    """cfg with the stage boundaries --split asks for, spec being the --job's, the
    service's, or (neither given) the uniform default. The default split is the one the
    job was profiled on: balanced when it carries per-layer costs."""
    import dataclasses
    source = f"--job {job}" if job else ("the service's job" if service else None)
    has_costs = source is not None and bool(spec.layer_cost)
    if split is None:
        split = "balanced" if has_costs else "layers"
    check_split(split)
    if split == "layers":
        if has_costs:
            raise ValueError(f"--split layers: {source} was profiled on the balanced split "
                             f"(it has per-layer costs), so its stage costs are not this "
                             f"split's; use --split balanced, or profile with --split layers")
        return dataclasses.replace(cfg, boundaries=())
    if source is None:
        raise ValueError("--split balanced needs per-layer costs: pass --job from "
                         "`recycle profile --split balanced`")
    return dataclasses.replace(cfg, boundaries=boundaries_from_job(spec, cfg.n_layers, source))
