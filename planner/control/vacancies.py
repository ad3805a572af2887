"""Vacant worker ids: which dead workers' ids a new node's workers take (docs/api.md,
"Node events").

A job's grid D x S is its capacity, and a worker is known by its home slot (id `R.S`).
A new instance (a node added) does not grow the grid: its workers come back under the ids
of dead workers, as fresh workers with no state, each joining with its own incarnation
(a recovery event; membership.py places it). Which ids they take is chosen here; the
service answers them. Pure.

Preferences, in order:
- an id no earlier add was given and has not used yet (a node still starting keeps its
  ids; an id given long ago and never used is handed out again only when nothing else is
  left, the oldest first);
- an id whose home slot is empty: the fresh worker can take it, so nobody's role changes
  for it (a plan without roles stays one);
- an id of the stage with the fewest live workers (where a worker helps most);
- the lowest id.
A node agent asks for a whole node (`per_node` workers per node, ranks as torchrun numbers
them: node n holds ranks n*per_node onwards, rank = replica * stages + stage): the lowest
node whose workers are all dead, by the same first preference.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

Worker = tuple[int, int]


class NoVacancy(ValueError):
    """The grid has not the vacant ids asked for (one-line reason)."""


def node_workers(replicas: int, stages: int, node: int, per_node: int) -> list[Worker]:
    """The workers of node `node` at `per_node` workers per node ([] outside the job)."""
    n = replicas * stages
    return [divmod(rank, stages) for rank in range(node * per_node, min(n, (node + 1) * per_node))]


def vacant_ids(replicas: int, stages: int, dead: Iterable[Worker], *,
               count: Optional[int] = None, per_node: Optional[int] = None,
               granted: Mapping[Worker, int] = {}, empty: Iterable[Worker] = ()
               ) -> tuple[list[Worker], Optional[int]]:
    """The ids of a new node's workers: `count` of them, or (with `per_node`) a whole
    vacant node's. `dead`: the dead workers; `granted`: ids given to earlier adds and not
    used yet, with the order they were given in; `empty`: the empty slots of the plan in
    force. Returns (ids, node rank or None); NoVacancy when the grid has not enough."""
    dead = {tuple(w) for w in dead}
    if per_node is not None:
        return _node(replicas, stages, dead, per_node, count, granted)
    if count is None or count < 1:
        raise NoVacancy("ask for at least one worker")
    if count > len(dead):
        raise NoVacancy(f"{count} new workers but {len(dead)} vacant id"
                        f"{'' if len(dead) == 1 else 's'} in the {replicas}x{stages} grid "
                        "(its capacity)")
    empty = {tuple(w) for w in empty}
    live = [replicas - sum(1 for (_, s) in empty if s == t) for t in range(stages)]

    def key(w: Worker):
        return (w in granted, granted.get(w, 0), w not in empty, live[w[1]], w)
    return sorted(sorted(dead, key=key)[:count]), None


def _node(replicas: int, stages: int, dead: set, per_node: int, count: Optional[int],
          granted: Mapping[Worker, int]) -> tuple[list[Worker], int]:
    nodes = -(-replicas * stages // per_node)
    vacant = [n for n in range(nodes)
              if all(w in dead for w in node_workers(replicas, stages, n, per_node))]
    if count is not None:
        vacant = [n for n in vacant if len(node_workers(replicas, stages, n, per_node)) == count]
    if not vacant:
        raise NoVacancy(f"no node of {per_node} worker{'' if per_node == 1 else 's'} is vacant "
                        f"in the {replicas}x{stages} grid ({len(dead)} dead worker"
                        f"{'' if len(dead) == 1 else 's'}): a new node takes a node whose "
                        "workers are all gone")

    def key(n: int):
        given = [granted[w] for w in node_workers(replicas, stages, n, per_node) if w in granted]
        return (bool(given), max(given, default=0), n)
    best = min(vacant, key=key)
    return node_workers(replicas, stages, best, per_node), best
