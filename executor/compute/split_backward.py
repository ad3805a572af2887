"""Split backward for any autograd graph: `I` computes only input gradients, `W` only
weight gradients, and I + W does the work of one plain backward.

The mechanism is torch.distributed.pipelining's (`_backward.stage_backward_input` /
`stage_backward_weight`): walk the graph once after F, find for every parameter the
"intermediate" nodes where its subgraph joins the trunk (the nodes on a path from the stage
input to the stage output), capture the gradient flowing into those nodes during I, and in
W run autograd from the captured gradients into the parameters only. Autograd computes an
input of a node's backward only when it leads to a requested input, so I never runs a
weight-gradient product and W never re-runs the trunk.

Why not call torch's two functions directly (the graph helpers are reused):
- the first stage's input (token ids, or data that needs no grad) has no autograd node, so
  torch finds no trunk; PipelineStage then runs the whole backward in W. Here the trunk is
  seeded by the outputs of modules called with the stage input (`seeding_trunk`), and a
  floating input is made a leaf that requires grad but is never differentiated;
- torch's I differentiates to the stage input and captures with node pre-hooks, which fire
  only on nodes I executes; here I asks autograd for the gradients at the intermediates
  themselves (GradientEdge inputs), so the first stage's I stops at its first layer;
- a parameter whose subgraph reaches the output without meeting the trunk is silently
  left without gradient by torch; here it gets its gradient during I (correct, just not
  deferred) and is returned so the caller can report it once, by name.
"""
from __future__ import annotations

import collections
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, Node, _engine_run_backward
from torch.distributed.pipelining._backward import reverse_closure


@dataclass
class Group:
    """Parameters that share the trunk nodes their gradients flow in from."""
    params: list[Tensor]
    nodes: list[Node]  # intermediates: where these parameters' subgraph meets the trunk
    accs: list[Node] = field(default_factory=list)  # the parameters' AccumulateGrad nodes
    outs: list[list[int]] = field(default_factory=list)  # per node, its outputs that get a grad
    grads: list[tuple] = field(default_factory=list)  # per node, the captured gradients of outs


@dataclass
class PendingW:
    """What I leaves for W: the groups with their captured gradients. Holding the nodes keeps
    alive the part of the graph below them (what W must traverse); the rest is freed."""
    groups: list[Group]

    def grad_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for grp in self.groups for gs in grp.grads
                   for t in gs if t is not None)


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


def _walk(roots: list[Node]):
    """One pass over the graph: each node's consumers, which of its outputs receive a
    gradient (the GradientEdges to capture), and the AccumulateGrad node of each leaf."""
    consumers: dict[Node, list[Node]] = collections.defaultdict(list)
    outputs: dict[Node, set] = collections.defaultdict(set)
    accs: dict[int, Node] = {}  # id(leaf tensor) -> its AccumulateGrad
    seen, stack = set(roots), list(roots)
    while stack:
        n = stack.pop()
        nexts = n.next_functions
        if not nexts and type(n).__name__ == "AccumulateGrad":
            accs[id(n.variable)] = n
        for c, nr in nexts:
            if c is None:
                continue
            consumers[c].append(n)
            outputs[c].add(nr)
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return consumers, outputs, accs


def plan_groups(roots: list[Tensor], trunk: list[Tensor], params: Sequence[Tensor]
                ) -> tuple[list[Group], list[Tensor]]:
    """Group the parameters by the trunk nodes they join it at (torch's get_param_groups,
    with its reverse_closure). trunk: the tensors the trunk starts from (stage input
    leaves, first-stage seeds). Returns (groups, stray): stray parameters reach a root
    without meeting the trunk (torch leaves them without gradient); parameters unused by
    this graph are in neither."""
    root_nodes = [t.grad_fn for t in roots if t.grad_fn is not None]
    consumers, outputs, accs = _walk(root_nodes)
    for t in roots:
        if t.grad_fn is not None:
            outputs[t.grad_fn].add(t.output_nr)
    starts = [t.grad_fn if t.grad_fn is not None else accs.get(id(t)) for t in trunk]
    trunk_closure, _ = reverse_closure([n for n in starts if n is not None], set(), consumers)
    root_set = set(root_nodes)
    by_node: dict[Node, Group] = {}
    stray: list[Tensor] = []
    for p in params:
        acc = accs.get(id(p))
        if acc is None:
            continue  # not used by this micro-batch's graph: no gradient, as in autograd
        closure, meets = reverse_closure([acc], trunk_closure, consumers)
        if not meets or closure & root_set:  # (also) reaches the output past the trunk
            stray.append(p)
            continue
        merged = {id(by_node[n]): by_node[n] for n in meets if n in by_node}
        grp = Group([], list(meets))
        for other in merged.values():  # shares a trunk node with p: one group
            grp.params += other.params
            grp.accs += other.accs
            grp.nodes += [n for n in other.nodes if n not in meets]
        grp.params.append(p)
        grp.accs.append(acc)
        for n in grp.nodes:
            by_node[n] = grp
    groups = list({id(g): g for g in by_node.values()}.values())
    for grp in groups:
        grp.outs = [sorted(outputs[n]) for n in grp.nodes]
    return groups, stray


def accumulate(p: Tensor, g: Optional[Tensor]) -> None:
    """AccumulateGrad's rule: the first gradient is taken, later ones added."""
    if g is None:
        return
    if p.grad is None:
        p.grad = g.detach() if g.stride() == p.stride() else torch.empty_like(p).copy_(g)
    else:
        p.grad.add_(g)


def backward_input(roots: list[Tensor], grads: list[Optional[Tensor]], inputs: list[Tensor],
                   seeds: list[Tensor], params: Sequence[Tensor]
                   ) -> tuple[list[Optional[Tensor]], PendingW, list[Tensor]]:
    """I. roots: tensors to back-propagate from, with their gradients (None: ones, for a
    loss). inputs: the stage's input leaves that need grad; seeds: extra trunk starts (first
    stage). Returns (gradient per input or None, what W needs, parameters not deferred:
    their gradients are accumulated here)."""
    groups, stray = plan_groups(roots, list(inputs) + list(seeds), params)
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
    return list(got[:k]), PendingW(groups), stray


def _grad(roots: list, grads: list, inputs: list) -> tuple:
    """torch.autograd.grad(roots, inputs, grads, allow_unused=True) without its per-call
    Python checks of the gradients' shapes (about 25 us a call, one call per group): the
    gradients are the very tensors autograd captured for these roots in I."""
    return _engine_run_backward(tuple(roots), tuple(grads), False, False, tuple(inputs), True,
                                accumulate_grad=False)


def _clamp(outs: list[int], gs: tuple):
    def hook(grad_outputs):
        grad_outputs = list(grad_outputs)
        for i, g in zip(outs, gs):
            grad_outputs[i] = g
        return tuple(grad_outputs)
    return hook


def backward_weight(pending: PendingW) -> None:
    """W. Per group, autograd from the captured gradients into its parameters only (one
    call per group: a call from several intermediates would re-run the trunk between them)."""
    for grp in pending.groups:
        roots, root_grads = [], []
        for n, outs, gs in zip(grp.nodes, grp.outs, grp.grads):
            for i, g in zip(outs, gs):
                if g is not None:
                    roots.append(GradientEdge(n, i))
                    root_grads.append(g)
        handles = []
        if len(grp.nodes) > 1:  # a node below another of the group: keep its captured total
            for n, outs, gs in zip(grp.nodes, grp.outs, grp.grads):
                handles.append(n.register_prehook(_clamp(outs, gs)))
        try:
            if roots:
                dws = _grad(roots, root_grads, [GradientEdge(a, 0) for a in grp.accs])
                for p, g in zip(grp.params, dws):
                    accumulate(p, g)
        finally:
            for h in handles:
                h.remove()
    pending.groups.clear()
