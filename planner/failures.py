"""Failed sets: validation, the 'no plan' outcome, and the canonical form.

Replicas are interchangeable, so a failed set is canonicalised by sorting replicas by the
pattern of their failed stages. Stragglers break that symmetry, so with per-worker speeds
only replicas with identical speed rows are permuted among themselves: the job is then
invariant under the permutation and a plan solved for the canonical set maps back exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from planner.job import JobSpec

Worker = tuple[int, int]


class FailedSetError(ValueError):
    """The failed set names a worker that does not exist."""


class NoPlanError(RuntimeError):
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


@dataclass(frozen=True)
class Canonical:
    """A canonical failed set and `perm`: canonical replica c is original replica perm[c]."""
    failed: tuple[Worker, ...]
    perm: tuple[int, ...]

    @property
    def key(self) -> str:
        return ";".join(f"{r}:{s}" for r, s in self.failed) or "-"

    def to_original(self, replica: int) -> int:
        return self.perm[replica]

    def inverse(self) -> "Canonical":
        """The renaming from original replicas to canonical ones (for `map_plan`)."""
        inv = [0] * len(self.perm)
        for c, d in enumerate(self.perm):
            inv[d] = c
        return Canonical(failed=tuple(sorted((self.perm[c], s) for c, s in self.failed)),
                         perm=tuple(inv))


def canonicalize(job: JobSpec, failed: Iterable[Worker]) -> Canonical:
    failed = normalize(job, failed)
    pattern = {d: tuple(s for r, s in failed if r == d) for d in range(job.replicas)}
    groups: dict[tuple, list[int]] = {}
    for d in range(job.replicas):
        row = tuple(job.speed[d]) if job.speed is not None else ()
        groups.setdefault(row, []).append(d)
    perm = [0] * job.replicas
    for members in groups.values():
        # Replicas with more failures first, then lexicographic on the failed stages.
        ordered = sorted(members, key=lambda d: (-len(pattern[d]), pattern[d], d))
        for slot, d in zip(members, ordered):
            perm[slot] = d
    canon = sorted((c, s) for c in range(job.replicas) for s in pattern[perm[c]])
    return Canonical(failed=tuple(canon), perm=tuple(perm))


def canonical_sets(job: JobSpec, max_failures: int) -> Iterator[Canonical]:
    """Every plannable canonical failed set with at most `max_failures` failures, in order
    of size. Generated as multisets of replica patterns, so the count stays small."""
    from itertools import combinations

    S, D = job.stages, job.replicas
    seen: set[tuple[Worker, ...]] = set()
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
            if c.failed not in seen:
                seen.add(c.failed)
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
