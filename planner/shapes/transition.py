"""What a shape change costs: the state each worker must fetch, per unit.

A live worker holds the units of its stage in the current shape (a fresh worker holds
none). Taking stage k of a new shape it loads the units of k it does not hold: parameters
and optimizer state, from a live holder of them, else from the peer-memory snapshot of
the stage that held them. Loads run in parallel at the link's bandwidth, so a change
stalls the job for the largest load of a worker that held state; a fresh worker loads
while the others train (as a rejoin does) and stalls no one, unless what it loads has no
live holder left.

Workers of one current stage are interchangeable (they hold the same units), so which
workers take which new stage is a transportation problem between current stages and new
ones: `transport` finds the flows with the least largest stall, then the fewest bytes.
"""
from __future__ import annotations

from typing import Optional, Sequence

Range = Optional[tuple[int, int]]


def missing(state: Sequence[float], held: Range, want: tuple[int, int]) -> float:
    """Bytes of units `want` = [c, d) outside `held` = [a, b) (None: nothing held);
    `state` is the units' prefix sums of state bytes."""
    c, d = want
    total = state[d] - state[c]
    if held is None:
        return total
    a, b = max(held[0], c), min(held[1], d)
    return total - (state[b] - state[a] if a < b else 0.0)


def transport(supply: Sequence[int], demand: Sequence[int], stall: Sequence[Sequence[float]],
              cost: Sequence[Sequence[float]]) -> list[list[int]]:
    """x[g][k] workers of group g to new stage k: every demand met (sum(supply) >=
    sum(demand)), no group over its supply; the largest stall[g][k] used is least, then the
    total of cost[g][k] * x[g][k]. Binary search on the stall level, a min-cost flow at
    each (a few groups and stages: microseconds)."""
    G, K = len(supply), len(demand)
    levels = sorted({stall[g][k] for g in range(G) for k in range(K) if supply[g] > 0})
    need = sum(demand)
    lo, hi, best = 0, len(levels) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        flows = _min_cost_flow(supply, demand, cost,
                               lambda g, k, t=levels[mid]: stall[g][k] <= t)
        if flows is not None and sum(map(sum, flows)) == need:
            best, hi = flows, mid - 1
        else:
            lo = mid + 1
    if best is None:
        raise ValueError("transport: the supply cannot meet the demand")
    return best


def _min_cost_flow(supply, demand, cost, allowed) -> Optional[list[list[int]]]:
    """Successive shortest paths (Bellman-Ford on the residual graph) from the groups to
    the stages; returns the flows (possibly short of the demand)."""
    G, K = len(supply), len(demand)
    src, snk, N = G + K, G + K + 1, G + K + 2
    to, cap, cst, adj = [], [], [], [[] for _ in range(N)]

    def edge(u, v, c, w):
        adj[u].append(len(to)); to.append(v); cap.append(c); cst.append(w)
        adj[v].append(len(to)); to.append(u); cap.append(0); cst.append(-w)

    for g in range(G):
        if supply[g] > 0:
            edge(src, g, supply[g], 0.0)
    mid = {}
    for g in range(G):
        for k in range(K):
            if supply[g] > 0 and allowed(g, k):
                mid[(g, k)] = len(to)
                edge(g, G + k, supply[g], float(cost[g][k]))
    for k in range(K):
        if demand[k] > 0:
            edge(G + k, snk, demand[k], 0.0)
    while True:
        dist, prev = [float("inf")] * N, [-1] * N
        dist[src] = 0.0
        for _ in range(N):
            changed = False
            for u in range(N):
                if dist[u] == float("inf"):
                    continue
                for e in adj[u]:
                    if cap[e] > 0 and dist[u] + cst[e] < dist[to[e]] - 1e-9:
                        dist[to[e]], prev[to[e]] = dist[u] + cst[e], e
                        changed = True
            if not changed:
                break
        if dist[snk] == float("inf"):
            break
        push, v = float("inf"), snk
        while v != src:
            e = prev[v]
            push = min(push, cap[e])
            v = to[e ^ 1]
        v = snk
        while v != src:
            e = prev[v]
            cap[e] -= push
            cap[e ^ 1] += push
            v = to[e ^ 1]
    flows = [[0] * K for _ in range(G)]
    for (g, k), e in mid.items():
        flows[g][k] = cap[e ^ 1]
    return flows
