"""Split backward for any autograd graph: `I` computes only input gradients, `W` only
weight gradients, and I + W does the work of one plain backward.

The mechanism is torch.distributed.pipelining's (`_backward.stage_backward_input` /
`stage_backward_weight`): walk the graph once after F, find for every parameter the
"intermediate" nodes where its subgraph joins the trunk (the nodes on a path from the stage
input to the stage output), capture the gradient flowing into those nodes during I, and in
W run autograd from the captured gradients into the parameters only. Autograd computes an
input of a node's backward only when it leads to a requested input, so I never runs a
weight-gradient product and W never re-runs the trunk.

Why not call torch's two functions directly (their reverse_closure is reused):
- the first stage's input (token ids, or data that needs no grad) has no autograd node, so
  torch finds no trunk; PipelineStage then runs the whole backward in W. Here the trunk is
  seeded by the outputs of modules called with the stage input (`seeding_trunk`), and a
  floating input is made a leaf that requires grad but is never differentiated;
- torch's I differentiates to the stage input and captures with node pre-hooks, which fire
  only on nodes I executes; here I asks autograd for the gradients at the intermediates
  themselves (GradientEdge inputs), so the first stage's I stops at its first layer;
- a parameter whose subgraph reaches the output without meeting the trunk is silently
  left without gradient by torch; here it gets its gradient during I (correct, just not
  deferred) and is returned so the caller can report it once, by name;
- torch analyses the graph on every micro-batch and makes one W call per group; here the
  analysis is keyed by the graph's structure and reused, and groups whose intermediates
  cannot reach one another (q, k, v of one input) share one W call;
- a parameter used again further down the same stage (ALBERT's shared Linear, a head tied
  to the embedding) joins the trunk at nodes one above another; a W call from all of them
  (torch's, and this module's before) runs the trunk between them again and frees buffers
  later W calls need ("backward through the graph a second time"). Here each upper use
  first goes one hop, to the edges into the parameter's side that only it feeds, and the
  group's call starts there (_nested); a use with no such edge of its own (a bias added
  by both uses) is computed in I and reported.
"""
from __future__ import annotations

import collections
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, Node
from torch.distributed.pipelining._backward import reverse_closure

from executor.compute.backward import direct_w


@dataclass
class Group:
    """Parameters that share the trunk nodes their gradients flow in from."""
    params: list[Tensor]
    nodes: list[Node]  # intermediates: where these parameters' subgraph meets the trunk
    accs: list[Node] = field(default_factory=list)  # the parameters' AccumulateGrad nodes
    outs: list[list[int]] = field(default_factory=list)  # per node, its outputs that get a grad
    # None (each parameter joins the trunk below no other of its joins), else per node:
    # None for a lowest one, or for a node above another of the group (a parameter used
    # again further down the trunk) the edges (node, input number, position in params or
    # -1) into the parameters' side that only this node feeds: W's first hop (_nested)
    kids: Optional[list] = None
    grads: list[tuple] = field(default_factory=list)  # per node, the captured gradients of outs
    # (the plan's per-group list, this group's index): W without the engine (direct_w) if
    # the list says so for this graph structure (None: not tried yet, False: engine)
    direct: Optional[tuple] = None


@dataclass
class PendingW:
    """What I leaves for W: the groups with their captured gradients. Holding the nodes keeps
    alive the part of the graph below them (what W must traverse); the rest is freed.
    `whole`: (roots, gradients) of a backward left entirely to W (the first stage)."""
    groups: list[Group]
    whole: Optional[tuple] = None
    # the nodes W runs (the groups' trunk nodes and their parameters' side of the graph):
    # what activation checkpointing keeps recomputed tensors for (recompute.trim)
    w_nodes: list = field(default_factory=list)

    def grad_bytes(self) -> int:
        extra = [g for g in self.whole[1] if g is not None] if self.whole else []
        return sum(t.untyped_storage().nbytes() for grp in self.groups for gs in grp.grads
                   for t in gs if t is not None) + sum(t.untyped_storage().nbytes()
                                                       for t in extra)


@contextmanager
def seeding_trunk(stage_input: Sequence[Tensor]) -> Iterator[list[Tensor]]:
    """First stage: collect the outputs of every module called with one of the stage's input
    tensors (an nn.Embedding on token ids, the first Linear on features). Their autograd
    nodes start the trunk that the input itself, needing no grad, cannot provide."""
    ids = {id(t) for t in stage_input}
    seeds: list[Tensor] = []

    def hook(module, args, output):
        if any(id(a) in ids for a in args if isinstance(a, Tensor)):
            seeds.extend(t for t in _tensors(output) if t.requires_grad)

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seeds
    finally:
        handle.remove()


def _tensors(value) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _walk(roots: list[Node], tags: dict) -> tuple[list[Node], tuple]:
    """One pass over the graph from the roots: the nodes in a deterministic order, and a
    key of the graph's structure (each node's type, its edges as (node index, output
    number), and the tag of the leaf an AccumulateGrad feeds). Two micro-batches through
    the same code have equal keys, so the analysis of the first serves the next."""
    index = {n: i for i, n in enumerate(roots)}
    order, key, todo = list(roots), [], 0
    while todo < len(order):  # breadth-first, in next_functions order: deterministic
        n = order[todo]
        todo += 1
        edges = []
        for c, nr in n.next_functions:
            if c is None:
                edges.append(None)
                continue
            i = index.get(c)
            if i is None:
                i = index[c] = len(order)
                order.append(c)
            edges.append((i, nr))
        tag = tags.get(id(n.variable)) if not edges and type(n).__name__ == "AccumulateGrad" \
            else None
        key.append((type(n), tuple(edges), tag))
    return order, tuple(key)


@dataclass
class _Plan:
    """plan_groups' answer in node indices of _walk's order and parameter indices."""
    groups: list[tuple]  # per W call: nodes, their outs, params, accs, kids
    stray: list[int]
    direct: list = field(default_factory=list)  # per group: direct_w's recipe, False, None
    w_nodes: list[int] = field(default_factory=list)  # every node a W call may run


def _below(key: tuple, starts) -> set:
    """The nodes reachable from starts (themselves excluded unless reached again)."""
    seen: set = set()
    stack = [e[0] for n in starts for e in key[n][1] if e is not None]
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            stack.extend(e[0] for e in key[c][1] if e is not None)
    return seen


def _analyse(key: tuple, n_roots: int, root_outs: list, starts: list[int], n_params: int) -> _Plan:
    consumers: dict[int, list[int]] = collections.defaultdict(list)
    outputs: dict[int, set] = collections.defaultdict(set)
    accs: dict = {}  # leaf tag -> index of its AccumulateGrad
    for n, (_, edges, tag) in enumerate(key):
        if tag is not None:
            accs[tag] = n
        for e in edges:
            if e is not None:
                consumers[e[0]].append(n)
                outputs[e[0]].add(e[1])
    for n, nr in enumerate(root_outs):
        outputs[n].add(nr)
    trunk_closure, _ = reverse_closure(starts, set(), consumers)
    root_set = set(range(n_roots))
    stray: list[int] = []
    side: dict[int, tuple] = {}  # parameter -> (its subgraph off the trunk, its meets)
    for p in range(n_params):
        acc = accs.get(("param", p))
        if acc is None:
            continue  # not used by this micro-batch's graph: no gradient, as in autograd
        closure, meets = reverse_closure([acc], trunk_closure, consumers)
        if not meets or closure & root_set:  # (also) reaches the output past the trunk
            stray.append(p)
            continue
        side[p] = (closure, meets)
    while True:  # a parameter _nested cannot split goes to I; regroup the others
        groups = _group({p: meets for p, (_, meets) in side.items()})
        plans, bad = [], set()
        for nodes, ps in groups:
            kids = None
            if len(nodes) > 1:  # only a parameter used more than once gets here
                kids, fail = _nested(key, nodes, ps, side, consumers, accs)
                bad |= fail
            plans.append((nodes, ps, kids))
        if not bad:
            break
        stray.extend(bad)
        for p in bad:
            del side[p]
    w_nodes = sorted(set().union(*(closure | set(meets) for closure, meets in side.values())))
    return _Plan([(nodes, [sorted(outputs[n]) for n in nodes], ps,
                   [accs[("param", i)] for i in ps], kids)
                  for nodes, ps, kids in _merge_siblings(plans, key)], sorted(stray),
                 w_nodes=w_nodes)


def _group(meets: dict[int, set]) -> list[tuple]:
    """Parameters joining the trunk at a common node are one group (one W call)."""
    by_node: dict[int, list] = {}  # node -> its group [nodes, params]
    for p, ms in meets.items():
        grp = [sorted(ms), [p]]
        for other in {id(by_node[n]): by_node[n] for n in ms if n in by_node}.values():
            grp[0] = sorted(set(grp[0]) | set(other[0]))  # shares a trunk node: one group
            grp[1] = sorted(grp[1] + other[1])
        for n in grp[0]:
            by_node[n] = grp
    return [(nodes, ps) for nodes, ps in {id(g): g for g in by_node.values()}.values()]


def _nested(key: tuple, nodes: list[int], ps: list[int], side: dict, consumers: dict,
            accs: dict) -> tuple[list, set]:
    """A group joining the trunk at several nodes (a parameter used more than once). If one
    of them lies above another (ALBERT's Linear applied twice, a head tied to the
    embedding), one W call from both would run the trunk between them again (autograd
    computes every input of a node that leads to a requested input, and the parameter is
    reached through the lower use too), and free buffers other groups' W still need.
    So the upper node gets a first hop of its own: from its captured gradient to the edges
    into the parameters' side that only it feeds (a Linear's transpose of the weight);
    the main call then starts from those and the lowest nodes, none of which reaches
    another, so no gradient is counted twice and no trunk node runs. Returns the kids per
    node, and the parameters this cannot serve (an upper use feeding a node that another
    use feeds too: a bias added by both uses, a raw matrix multiplied in twice): those get
    their gradient in I. Once per graph structure, and only for such groups."""
    kids: list = [None] * len(nodes)  # None at the end if no node lies above another
    fail: set = set()
    group_nodes, mine = set(nodes), set().union(*(side[p][0] for p in ps))
    pos = {accs[("param", p)]: i for i, p in enumerate(ps)}
    for j, n in enumerate(nodes):
        if not _below(key, [n]) & group_nodes:
            continue  # a lowest use: the main call starts at it, as for any group
        kids[j] = []
        for e in dict.fromkeys(e for e in key[n][1] if e is not None and e[0] in mine):
            c = e[0]
            if set(consumers[c]) == {n} and not ({c} | _below(key, [c])) & group_nodes:
                kids[j].append((c, e[1], pos.get(c, -1)))
            else:  # shared with another use: whose parameters lie under it
                under = {c} | _below(key, [c])
                fail |= {p for p in ps if accs[("param", p)] in under}
    return (None if all(k is None for k in kids) else kids), fail


def _merge_siblings(groups: list, key: tuple) -> list:
    """One W call may serve several groups if none of their intermediates can reach
    another (q, k and v projections of one input; SwiGLU's two input projections): no
    trunk node lies between them, so autograd runs nothing of I's part. Groups of a chain
    (every layer of a sequential model) stay one call each, as do groups of several nodes
    (a parameter used more than once)."""
    single = {nodes[0] for nodes, _, _ in groups if len(nodes) == 1}
    below = {n: _below(key, [n]) & single for n in single}  # once per graph structure
    merged: list = []  # [nodes, params, kids (None: plain), open to siblings]
    for nodes, ps, kids in groups:
        n = nodes[0]
        for m in merged:
            if len(nodes) == 1 and m[3] and all(
                    o not in below[n] and n not in below[o] for o in m[0]):
                m[0].append(n)
                m[1].extend(ps)
                break
        else:
            merged.append([list(nodes), list(ps), kids, len(nodes) == 1])
    return [m[:3] for m in merged]


class GraphPlans:
    """plan_groups with memory: the analysis of the last graph structure seen (a stage runs
    the same code on every micro-batch; only a structure change re-analyses)."""

    def __init__(self, params: Sequence[Tensor]):
        self.params = list(params)
        self._tags = {id(p): ("param", i) for i, p in enumerate(self.params)}
        self._key, self._plan = None, None
        self.analyses = 0  # how often the graph had to be analysed (tests, benchmarks)

    def plan_groups(self, roots: list[Tensor], trunk: list[Tensor]
                    ) -> tuple[list[Group], list[Tensor], list[Node]]:
        """Group the parameters by the trunk nodes they join it at (torch's
        get_param_groups, with its reverse_closure). trunk: the tensors the trunk starts
        from (stage input leaves, first-stage seeds). Returns (groups, stray): stray
        parameters reach a root without meeting the trunk (torch leaves them without
        gradient); parameters unused by this graph are in neither; and the nodes W runs."""
        tags = dict(self._tags)
        tags.update((id(t), ("trunk", j)) for j, t in enumerate(trunk) if t.grad_fn is None)
        root_nodes = [t.grad_fn for t in roots if t.grad_fn is not None]
        order, key = _walk(root_nodes, tags)
        index = {n: i for i, n in enumerate(order)} if any(t.grad_fn is not None for t in trunk) \
            else {}
        seeds = tuple(index.get(t.grad_fn, -1) for t in trunk if t.grad_fn is not None)
        root_outs = tuple(t.output_nr for t in roots if t.grad_fn is not None)
        full_key = (key, seeds, root_outs)
        if full_key != self._key:
            starts = [i for i in seeds if i >= 0] + [
                n for n, (_, _, tag) in enumerate(key) if tag is not None and tag[0] == "trunk"]
            self._plan = _analyse(key, len(root_nodes), list(root_outs), starts, len(self.params))
            self._key = full_key
            self.analyses += 1
        plan = self._plan
        if len(plan.direct) != len(plan.groups):
            plan.direct = [None] * len(plan.groups)
        groups = [Group([self.params[i] for i in ps], [order[n] for n in nodes],
                        accs=[order[n] for n in accs], outs=outs,
                        kids=None if kids is None else
                        [None if ks is None else [(order[c], nr, i) for c, nr, i in ks]
                         for ks in kids], direct=(plan.direct, j))
                  for j, (nodes, outs, ps, accs, kids) in enumerate(plan.groups)]
        return groups, [self.params[i] for i in plan.stray], [order[n] for n in plan.w_nodes]


def accumulate(p: Tensor, g: Optional[Tensor], owned: bool = False) -> None:
    """AccumulateGrad's rule: the first gradient is taken, later ones added. owned: g is a
    new tensor nobody else holds; kept as is when it has p's layout (as AccumulateGrad
    steals one), else copied: g may be a tensor others hold (a received gradient that
    autograd passed through unchanged)."""
    if g is None:
        return
    if p.grad is None:
        if owned and g.dtype == p.dtype and g.stride() == p.stride() and not g._is_view():
            p.grad = g
        else:
            p.grad = torch.empty_like(p).copy_(g)
    else:
        p.grad.add_(g)


def backward_input(roots: list[Tensor], grads: list[Optional[Tensor]], inputs: list[Tensor],
                   seeds: list[Tensor], plans: GraphPlans
                   ) -> tuple[list[Optional[Tensor]], PendingW, list[Tensor]]:
    """I. roots: tensors to back-propagate from, with their gradients (None: ones, for a
    loss). inputs: the stage's input leaves that need grad; seeds: extra trunk starts (first
    stage). Returns (gradient per input or None, what W needs, parameters not deferred:
    their gradients are accumulated here)."""
    if not roots:  # nothing this stage sent needed a gradient
        return [None] * len(inputs), PendingW([]), []
    groups, stray, w_nodes = plans.plan_groups(roots, list(inputs) + list(seeds))
    edges = [GradientEdge(n, i) for grp in groups for n, outs in zip(grp.nodes, grp.outs)
             for i in outs]
    wanted = list(inputs) + list(stray) + edges
    if not wanted:
        return [None] * len(inputs), PendingW([]), stray
    got = torch.autograd.grad(roots, wanted, grad_outputs=grads, retain_graph=bool(groups),
                              allow_unused=True)
    k = len(inputs)
    for p, g in zip(stray, got[k:k + len(stray)]):
        accumulate(p, g)
    it = iter(got[k + len(stray):])
    for grp in groups:
        grp.grads = [tuple(next(it) for _ in outs) for outs in grp.outs]
    return list(got[:k]), PendingW(groups, w_nodes=w_nodes), stray


def _grad(roots: list, grads: list, inputs: list) -> tuple:
    """torch.autograd.grad(roots, inputs, grads, allow_unused=True) without its per-call
    Python checks of the gradients' shapes (about 25 us a call, one call per group): the
    gradients are the very tensors autograd captured for these roots in I."""
    if _engine_run_backward is None:  # a torch without it: the public call
        return torch.autograd.grad(roots, inputs, grads, allow_unused=True)
    return _engine_run_backward(tuple(roots), tuple(grads), False, False, tuple(inputs), True,
                                accumulate_grad=False)


try:  # private, but what torch.autograd.grad itself calls
    from torch.autograd.graph import _engine_run_backward
except ImportError:  # pragma: no cover
    _engine_run_backward = None


def _first_hops(grp: Group, roots: list, root_grads: list) -> None:
    """A group with upper uses (_nested): each upper node's own products, into its kids;
    they and the lowest nodes become the roots of the group's call."""
    for n, outs, gs, kids in zip(grp.nodes, grp.outs, grp.grads, grp.kids):
        edges = [(GradientEdge(n, i), g) for i, g in zip(outs, gs) if g is not None]
        if kids is None:  # a lowest use
            roots += [e for e, _ in edges]
            root_grads += [g for _, g in edges]
            continue
        if not edges or not kids:
            continue
        # no requested input lies below n (the kids are fed by n alone): the trunk stays
        got = _grad([e for e, _ in edges], [g for _, g in edges],
                    [GradientEdge(c, nr) for c, nr, _ in kids])
        for (c, nr, i), g in zip(kids, got):
            if g is None:
                continue
            if i >= 0:  # the kid is the parameter's own AccumulateGrad: its gradient
                accumulate(grp.params[i], g)
            else:
                roots.append(GradientEdge(c, nr))
                root_grads.append(g)


def _engine_grads(grp: Group) -> list:
    """grp's parameter gradients by the autograd engine (first hops included)."""
    roots, root_grads = [], []
    if grp.kids is None:
        for n, outs, gs in zip(grp.nodes, grp.outs, grp.grads):
            for i, g in zip(outs, gs):
                if g is not None:
                    roots.append(GradientEdge(n, i))
                    root_grads.append(g)
    else:
        _first_hops(grp, roots, root_grads)
    if not roots:
        return [None] * len(grp.params)
    return list(_grad(roots, root_grads, [GradientEdge(a, 0) for a in grp.accs]))


def _direct_or_engine(grp: Group) -> tuple[list, bool]:
    """A group's gradients directly (direct_w) when its structure has proven bit-identical
    to the engine's, else by the engine; the first micro-batch of a structure tries both.
    Returns (gradients per parameter, whether they are new tensors nobody else holds)."""
    if grp.direct is None:
        return _engine_grads(grp), False
    slot, j = grp.direct
    state = slot[j]
    if state:
        return direct_w.compute(grp, state), True
    if state is False:
        return _engine_grads(grp), False
    rec = direct_w.recipe(grp)
    fast = direct_w.compute(grp, rec) if rec is not None else None  # before the engine
    got = _engine_grads(grp)  # frees the saved tensors it used
    slot[j] = rec if fast is not None and direct_w.same(fast, got) else False
    return got, False


def backward_weight(pending: PendingW) -> None:
    """W. Per group, autograd from the captured gradients into its parameters only (one
    call per group: a call from intermediates of a chain would re-run the trunk between
    them; groups whose intermediates are siblings were merged into one), or for a Linear's
    or a norm's weights the same products without the engine (direct_w). A group whose
    parameter is used again further down the trunk first takes each upper use one hop,
    into edges only that use feeds (_nested), and starts its call from there."""
    if pending.whole is not None:  # one plain backward, accumulating into .grad itself
        roots, grads = pending.whole
        pending.whole = None
        torch.autograd.backward(roots, grads)
    for grp in pending.groups:
        grads, owned = _direct_or_engine(grp)
        for p, g in zip(grp.params, grads):
            accumulate(p, g, owned)
    pending.groups.clear()
