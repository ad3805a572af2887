"""Throughput of each configuration a policy can be in, from the planner's cost model.

Every figure here is a period in seconds, measured by the same planner on the same spec:
  - ReCycle: the period of the plan for the failed set (`RecyclePeriods`: the greedy
    back-end on the canonical failed set, cached per set, optionally read from and written
    to the planner's SQLite plan cache), with the worker speeds when a trace carries them;
  - one pipeline of k stages (`Pipelines`): the spec's units (its stages, or a preset's
    layers) grouped into k contiguous stages of balanced F+I+W, planned as a one-replica
    job. Oobleck's templates and Bamboo's pipelines (with redundant forwards, with a stage
    taken over by its predecessor) are such pipelines.
All periods are measured with the same scheduling mode, so ratios between policies show
what each policy does with its workers, not a difference in schedule quality.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from planner.failures import Worker, canonicalize
from planner.job import Cost, JobSpec, Memory, P2P
from planner.shapes.units import Unit  # noqa: F401 (the simulator's units are the planner's)


@dataclass(frozen=True)
class Model:
    """What the simulator knows about the job beyond its spec: the units the stages are
    made of, a worker's memory, samples per micro-batch."""
    units: tuple[Unit, ...]
    capacity: Optional[int]  # per worker, in the spec's memory unit (None: no limit)
    samples_per_microbatch: int = 1
    name: str = "spec"

    @classmethod
    def of_spec(cls, job: JobSpec) -> "Model":
        mem = job.memory
        units = tuple(Unit(job.cost.F[s], job.cost.I[s], job.cost.W[s], job.cost.OPT[s],
                           mem.activation[s] if mem else 0, 0,
                           job.state_bytes[s] if job.state_bytes is not None else 0)
                      for s in range(job.stages))
        return cls(units, min(mem.capacity) if mem else None)


def group(units: tuple[Unit, ...], k: int) -> list[list[Unit]]:
    """`units` in k contiguous groups of about equal F+I+W (each non-empty)."""
    n = len(units)
    k = min(k, n)
    work = [u.F + u.I + u.W for u in units]
    total = sum(work) or 1
    out, acc, start = [], 0, 0
    for i in range(n):
        acc += work[i]
        left_groups = k - len(out) - 1
        # cut after unit i when its share is reached, keeping a unit for every later group
        if left_groups > 0 and (acc >= total * (len(out) + 1) / k or n - i - 1 == left_groups):
            out.append(list(units[start:i + 1]))
            start = i + 1
    out.append(list(units[start:]))
    return out


def group_bounds(units: tuple[Unit, ...], k: int) -> tuple[int, ...]:
    """`group`'s cut, as unit bounds (planner/shapes/partition.py)."""
    out = [0]
    for g in group(units, k):
        out.append(out[-1] + len(g))
    return tuple(out)


def pipeline_job(model: Model, groups: list[list[Unit]], microbatches: int, p2p: P2P,
                 extra_F: Optional[list[int]] = None) -> Optional[JobSpec]:
    """One replica whose stage j runs `groups[j]`; None if a stage cannot hold its
    parameters and one micro-batch."""
    S = len(groups)
    sums = {op: [sum(getattr(u, op) for u in g) for g in groups] for op in ("F", "I", "W", "OPT")}
    if extra_F:
        sums["F"] = [f + x for f, x in zip(sums["F"], extra_F)]
    memory = None
    if model.capacity is not None:
        act = [sum(u.activation for u in g) for g in groups]
        cap = [model.capacity - sum(u.params for u in g) for g in groups]
        if any(c < max(a, 1) for a, c in zip(act, cap)):
            return None
        memory = Memory(activation=act, capacity=cap)
    return JobSpec(replicas=1, stages=S, microbatches=microbatches,
                   cost=Cost(**sums), p2p=p2p, memory=memory)


class Pipelines:
    """Periods (seconds) of single pipelines built from the model's units, memoised."""

    def __init__(self, job: JobSpec, model: Model, unit_s: float,
                 plan_period: Callable[[JobSpec], int]):
        self.job, self.model, self.unit_s = job, model, unit_s
        self._period = plan_period
        self._lines: dict[int, Optional[tuple[float, float]]] = {}
        self._memo: dict[tuple, Optional[float]] = {}

    def period(self, groups: list[list[Unit]], microbatches: int,
               extra_F: Optional[list[int]] = None) -> Optional[float]:
        key = (tuple(map(tuple, groups)), microbatches, tuple(extra_F or ()))
        if key not in self._memo:
            pj = pipeline_job(self.model, groups, microbatches, self.job.p2p, extra_F)
            self._memo[key] = None if pj is None else self._period(pj) * self.unit_s
        return self._memo[key]

    def line(self, k: int) -> Optional[tuple[float, float]]:
        """(a, b): a k-stage template runs m micro-batches in about a + b*m seconds
        (fitted at M and 2M); None if k stages cannot hold the model. The template's
        stages are the balanced cut of the units (planner/shapes/partition.py: the least
        costliest stage, as Oobleck's own planner cuts its templates by dynamic
        programming), each stage holding its parameters and one micro-batch."""
        if k not in self._lines:
            from planner.shapes.partition import balance, ranges

            M, units, cap = self.job.microbatches, self.model.units, self.model.capacity
            bounds = balance([u.F + u.I + u.W for u in units], k,
                             lambda i, j: cap is None or
                             sum(u.params + u.activation for u in units[i:j]) <= cap)
            if bounds is None:
                self._lines[k] = None
                return None
            g = [list(units[i:j]) for i, j in ranges(bounds)]
            p1, p2 = self.period(g, M), self.period(g, 2 * M)
            self._lines[k] = None if p1 is None or p2 is None else (2 * p1 - p2, (p2 - p1) / M)
        return self._lines[k]


# From this many workers on, a failed set's period is planned on a proxy grid (below): at
# 2,048 workers a plan takes 0.7 s and a 54-day record visits some 300 failed sets.
LARGE_GRID = 1024


class RecyclePeriods:
    """ReCycle's period (seconds) for a failed set, from a plan for its canonical form.

    On a large grid (LARGE_GRID workers or more, no stragglers) the canonical set is
    planned on a proxy grid of fewer replicas instead: the failed replicas (canonical
    order puts them first) and enough live peers that each stage's re-routed micro-batches
    spread as thinly as on the whole grid (ceil(f*M / (D'-f)) extra a peer, as with D),
    twice as many for margin. The other replicas run their own M micro-batches whatever the
    grid's width, so the period is the whole grid's up to the greedy back-end's own
    choices, which differ with the width: equal on every Llama 3 set measured
    (benchmarks/results/llama3_scale.md), up to 1.6% shorter on a small uniform spec
    (tests/test_failure_model.py), at a fraction of the planning time."""

    def __init__(self, job: JobSpec, unit_s: float, cache=None, solver: str = "greedy"):
        self.job, self.unit_s, self.cache, self.solver = job, unit_s, cache, solver
        self._memo: dict[tuple, float] = {}
        self.planned = 0  # plans made (not served from memory)
        self.proxy = job.replicas * job.stages >= LARGE_GRID and job.speed is None
        self._proxies: dict[int, RecyclePeriods] = {}

    def __call__(self, failed: frozenset, speed: Optional[dict] = None) -> float:
        if self.proxy and not speed and failed:
            return self.proxy_period(failed)
        return self.exact(failed, speed)

    def proxy_width(self, failed: frozenset) -> int:
        """D': the fewest replicas that hold the failed replicas and spread every stage's
        re-routed micro-batches as thinly as the whole grid does (class doc)."""
        from collections import Counter

        D, M = self.job.replicas, self.job.microbatches
        per_stage = Counter(s for _, s in failed)
        rows = len({d for d, _ in failed})

        def spread(width):
            return [-(-f * M // (width - f)) for f in per_stage.values()]

        want, width = spread(D), max(rows + 1, 2)
        while width < D and (min(width - f for f in per_stage.values()) < 1
                             or spread(width) != want):
            width += 1
        # twice that: at the least width the greedy back-end's choices differed more from
        # the whole grid's (1% on sets where twice it matched)
        return min(D, 2 * width)

    def proxy_period(self, failed: frozenset) -> float:
        canon = canonicalize(self.job, failed)  # the failed replicas are 0, 1, ...
        width = self.proxy_width(frozenset(canon.failed))
        if width >= self.job.replicas:
            return self.exact(failed)
        if width not in self._proxies:
            small = self.job.model_copy(update={"replicas": width})
            self._proxies[width] = RecyclePeriods(small, self.unit_s, solver=self.solver)
        proxy = self._proxies[width]
        before = proxy.planned
        out = proxy.exact(frozenset(canon.failed))
        self.planned += proxy.planned - before
        return out

    def exact(self, failed: frozenset, speed: Optional[dict] = None) -> float:
        """The planner's period for `failed`, from a plan for its canonical form."""
        from planner.solvers.backends import solve
        from planner.speeds import quantize

        job = self.job
        if speed:
            grid = [[quantize(speed.get((d, s), 1.0), top=100.0) for s in range(job.stages)]
                    for d in range(job.replicas)]
            job = job.model_copy(update={"speed": grid})
        canon = canonicalize(job, failed)
        key = (canon.key, None if job.speed is None else str(canon.job(job).speed))
        if key not in self._memo:
            cjob, cfailed = canon.job(job), list(canon.failed)
            if self.cache is None and self.solver == "greedy":
                period = plan_period(cjob, cfailed)
            else:
                plan = self.cache.get(cjob, cfailed) if self.cache is not None else None
                if plan is None:
                    plan = solve(cjob, cfailed, self.solver, canonical=False)
                    if self.cache is not None:
                        self.cache.put(plan)
                period = plan.metrics.period
            self.planned += 1
            self._memo[key] = period * self.unit_s
        return self._memo[key]

    def prefetch(self, sets: list[frozenset], jobs: int) -> None:
        """Plan `sets` (no speeds) on `jobs` processes ahead of the walk through the trace:
        the periods are independent, and planning is nearly all of a simulation's time."""
        todo, seen = [], set()
        if self.proxy:  # planned on their proxies as they come: each plan is fast there
            return
        for failed in sets:
            canon = canonicalize(self.job, failed)
            key = (canon.key, None)
            if key not in self._memo and key not in seen:
                seen.add(key)
                todo.append((key, list(canon.failed)))
        if jobs <= 1 or len(todo) < 4 or self.cache is not None or self.solver != "greedy":
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
            periods = pool.map(plan_period, [self.job] * len(todo), [f for _, f in todo],
                               chunksize=max(1, len(todo) // (4 * jobs)))
            for (key, _), period in zip(todo, periods):
                self._memo[key] = period * self.unit_s
                self.planned += 1


def plan_period(job: JobSpec, failed: list[Worker]) -> int:
    """The period of the greedy back-end's plan for `failed` (as `solve(job, failed,
    "greedy", canonical=False)` reports it) without building the plan: the best of its
    ranked timelines, measured as add_opt + replay would (planner/policies.py)."""
    from planner.failures import check_plannable, normalize
    from planner.solvers.greedy import ranked_schedules
    from planner.plan import Mode

    failed = normalize(job, failed)
    check_plannable(job, failed)
    return ranked_schedules(job, failed, Mode())[0][0]


def greedy_period(job: JobSpec) -> int:
    return plan_period(job, [])

