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
              cost: Sequence[Sequence[int]], bottleneck: bool = True) -> list[list[int]]:
    """x[g][k] workers of group g to new stage k: every demand met (sum(supply) >=
    sum(demand)), no group over its supply; the largest stall[g][k] used is least, then the
    total of cost[g][k] * x[g][k] (integers: exact, so the residual graph never holds a
    negative cycle that float rounding made). Binary search on the stall level (a max flow
    at each: are the demands met?), then one min-cost flow at the least level that meets
    them; the graph has a node per current and new stage, so it is milliseconds at most.
    `bottleneck=False`: the min-cost flow alone (one flow, not a dozen; its largest stall
    may be larger: the shape choice screens candidates so)."""
    G, K = len(supply), len(demand)
    levels = sorted({stall[g][k] for g in range(G) for k in range(K) if supply[g] > 0})
    need = sum(demand)
    zero = [[0] * K for _ in range(G)]

    def flows_at(t, costs):
        return _min_cost_flow(supply, demand, costs, lambda g, k: stall[g][k] <= t)

    if not bottleneck:
        flows = flows_at(levels[-1] if levels else 0, cost)
        if sum(map(sum, flows)) < need:
            raise ValueError("transport: the supply cannot meet the demand")
        return flows
    lo, hi = 0, len(levels) - 1
    if not levels or sum(map(sum, flows_at(levels[hi], zero))) < need:
        raise ValueError("transport: the supply cannot meet the demand")
    while lo < hi:  # the least stall level at which every demand is met (a max flow)
        mid = (lo + hi) // 2
        if sum(map(sum, flows_at(levels[mid], zero))) == need:
            hi = mid
        else:
            lo = mid + 1
    return flows_at(levels[lo], cost)  # then the fewest bytes at that level


def _min_cost_flow(supply, demand, cost, allowed) -> list[list[int]]:
    """Successive shortest paths (SPFA on the residual graph, exact integer costs) from the
    groups to the stages; returns the flows (possibly short of the demand)."""
    from collections import deque

    G, K = len(supply), len(demand)
    src, snk, N = G + K, G + K + 1, G + K + 2
    to, cap, cst, adj = [], [], [], [[] for _ in range(N)]

    def edge(u, v, c, w):
        adj[u].append(len(to)); to.append(v); cap.append(c); cst.append(w)
        adj[v].append(len(to)); to.append(u); cap.append(0); cst.append(-w)

    for g in range(G):
        if supply[g] > 0:
            edge(src, g, supply[g], 0)
    mid = {}
    for g in range(G):
        for k in range(K):
            if supply[g] > 0 and allowed(g, k):
                mid[(g, k)] = len(to)
                edge(g, G + k, supply[g], int(cost[g][k]))
    for k in range(K):
        if demand[k] > 0:
            edge(G + k, snk, demand[k], 0)
    while True:
        dist, prev, queued = [None] * N, [-1] * N, [False] * N
        dist[src] = 0
        q = deque([src])
        while q:
            u = q.popleft()
            queued[u] = False
            for e in adj[u]:
                v = to[e]
                if cap[e] > 0 and (dist[v] is None or dist[u] + cst[e] < dist[v]):
                    dist[v], prev[v] = dist[u] + cst[e], e
                    if not queued[v]:
                        queued[v] = True
                        q.append(v)
        if dist[snk] is None:
            break
        push, v = None, snk
        while v != src:
            e = prev[v]
            push = cap[e] if push is None else min(push, cap[e])
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
