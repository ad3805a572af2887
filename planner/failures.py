"""Failed sets: validation, the 'no plan' outcome, and the canonical form.

Replicas are interchangeable, so a failed set is canonicalised by sorting replicas by the
pattern of their failed stages. With stragglers a replica's pattern is its failed stages
and its row of speeds, quantised to steps of 0.1 (planner.speeds.quantize) so that measured
speeds repeat: the canonical form is the failed set and the speed grid, both renumbered,
and a plan solved for the renumbered job (`Canonical.job`) maps back exactly by the
permutation (`backends.map_plan` renumbers the plan's speeds too). Renumbering is always exact;
quantising only decides which replicas look alike, so speeds should enter the job already
quantised (`speeds.with_speeds`, as the executor does): the plan cache keys on the
renumbered job itself (planner/cache.py), and off-grid speeds repeat only as themselves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from planner.errors import Unplannable, UserError
from planner.job import JobSpec
from planner.speeds import MAX_SPEED, quantize

Worker = tuple[int, int]


class FailedSetError(UserError):
    """The failed set names a worker that does not exist."""


class NoPlanError(Unplannable):
    """Every replica of some stage has failed: no schedule exists."""

    def __init__(self, stage: int):
        self.stage = stage
        super().__init__(f"no plan: stage {stage} has no live replica, restore from checkpoint")


def normalize(job: JobSpec, failed: Iterable[Iterable[int]]) -> list[Worker]:
    """Sorted, de-duplicated `[replica, stage]` pairs, each checked against the grid."""
    out = set()
    for item in failed:
        pair = tuple(item)
        if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair):
            raise FailedSetError(f"failed worker {list(pair)} is not a [replica, stage] pair")
        r, s = pair
        if not (0 <= r < job.replicas and 0 <= s < job.stages):
            raise FailedSetError(
                f"failed worker {r}:{s} is outside the {job.replicas}x{job.stages} grid")
        out.add((r, s))
    return sorted(out)


def dead_stage(job: JobSpec, failed: Iterable[Worker]) -> int | None:
    """First stage with no live replica, if any."""
    count = [0] * job.stages
    for _, s in failed:
        count[s] += 1
    for s, c in enumerate(count):
        if c >= job.replicas:
            return s
    return None


def check_plannable(job: JobSpec, failed: Iterable[Worker]) -> None:
    s = dead_stage(job, failed)
    if s is not None:
        raise NoPlanError(s)


def parse_worker(text: str) -> Worker:
    """`R:S` as typed on the command line."""
    try:
        r, s = text.split(":")
        return int(r), int(s)
    except ValueError:
        raise FailedSetError(f"cannot read worker {text!r}: expected REPLICA:STAGE, e.g. 1:2") from None


def quantized_speeds(job: JobSpec) -> Optional[tuple[tuple[float, ...], ...]]:
    """The job's speed grid on the 0.1 grid; None when every quantised speed is nominal."""
    if job.speed is None:
        return None
    q = tuple(tuple(quantize(v, top=MAX_SPEED) for v in row) for row in job.speed)
    return None if all(v == 1.0 for row in q for v in row) else q


@dataclass(frozen=True)
class Canonical:
    """A canonical failed set, `perm` (canonical replica c is original replica perm[c]) and
    the quantised speed grid in canonical numbering (None: all nominal)."""
    failed: tuple[Worker, ...]
    perm: tuple[int, ...]
    speed: Optional[tuple[tuple[float, ...], ...]] = None

    @property
    def key(self) -> str:
        """`R:S;...` (or `-`), then `|R:S@SPEED;...` for each non-nominal quantised speed."""
        key = ";".join(f"{r}:{s}" for r, s in self.failed) or "-"
        if self.speed is not None:
            key += "|" + ";".join(f"{r}:{s}@{v:g}" for r, row in enumerate(self.speed)
                                  for s, v in enumerate(row) if v != 1.0)
        return key

    def job(self, job: JobSpec) -> JobSpec:
        """`job` renumbered into canonical replicas (its exact speeds, permuted)."""
        if job.speed is None or list(self.perm) == sorted(self.perm):
            return job
        return job.model_copy(update={"speed": [list(job.speed[d]) for d in self.perm]})

    def inverse(self) -> "Canonical":
        """The renaming from original replicas to canonical ones (for `map_plan`)."""
        inv = [0] * len(self.perm)
        for c, d in enumerate(self.perm):
            inv[d] = c
        speed = None if self.speed is None else tuple(self.speed[inv[d]]
                                                      for d in range(len(inv)))
        return Canonical(failed=tuple(sorted((self.perm[c], s) for c, s in self.failed)),
                         perm=tuple(inv), speed=speed)


def canonicalize(job: JobSpec, failed: Iterable[Worker]) -> Canonical:
    """Replicas sorted by (more failures first, failed stages, quantised speed row, exact
    speed row); ties keep replica order, so the canonical form of a canonical case is
    itself."""
    failed = normalize(job, failed)
    pattern = {d: tuple(s for r, s in failed if r == d) for d in range(job.replicas)}
    q = quantized_speeds(job)
    row = (lambda d: q[d]) if q is not None else (lambda d: ())
    exact = (lambda d: tuple(job.speed[d])) if job.speed is not None else (lambda d: ())
    perm = sorted(range(job.replicas),
                  key=lambda d: (-len(pattern[d]), pattern[d], row(d), exact(d), d))
    canon = sorted((c, s) for c in range(job.replicas) for s in pattern[perm[c]])
    return Canonical(failed=tuple(canon), perm=tuple(perm),
                     speed=None if q is None else tuple(q[d] for d in perm))


def canonical_sets(job: JobSpec, max_failures: int) -> Iterator[Canonical]:
    """Every plannable canonical failed set with at most `max_failures` failures, in order
    of size. Generated as multisets of replica patterns, so the count stays small."""
    from itertools import combinations

    S, D = job.stages, job.replicas
    seen: set[tuple] = set()
    for k in range(max_failures + 1):
        if job.speed is None:
            # A canonical set is a multiset of per-replica patterns (non-empty stage sets).
            patterns = [p for n in range(1, min(k, S) + 1) for p in combinations(range(S), n)]
            candidates = _pattern_multisets(patterns, k, D)
            gen = (tuple((r, s) for r, pat in enumerate(ms) for s in pat) for ms in candidates)
        else:
            gen = combinations([(r, s) for r in range(D) for s in range(S)], k)
        for raw in gen:
            if dead_stage(job, raw) is not None:
                continue
            c = canonicalize(job, raw)
            # the key, and the exact speeds it stands for (off the 0.1 grid they differ)
            ident = (c.key, None if job.speed is None else str(c.job(job).speed))
            if ident not in seen:
                seen.add(ident)
                yield c


def _pattern_multisets(patterns, k, D):
    """Lists of at most D patterns whose sizes add up to exactly k."""
    def rec(start, left, chosen):
        if left == 0:
            yield list(chosen)
            return
        if len(chosen) == D:
            return
        for i in range(start, len(patterns)):
            p = patterns[i]
            if len(p) <= left:
                chosen.append(p)
                yield from rec(i, left - len(p), chosen)
                chosen.pop()
    return rec(0, k, [])
