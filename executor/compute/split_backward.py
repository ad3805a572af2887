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
from torch.autograd.graph import GradientEdge, Node
from torch.distributed.pipelining._backward import (_get_grad_fn_or_grad_acc,
                                                    construct_reverse_graph, reverse_closure)


@dataclass
class Group:
    """Parameters that share the trunk nodes their gradients flow in from."""
    params: list[Tensor]
    nodes: list[Node]  # intermediates: where these parameters' subgraph meets the trunk
    accs: list[Node] = field(default_factory=list)  # the parameters' AccumulateGrad nodes
    grads: list[tuple] = field(default_factory=list)  # per node, its captured grad_outputs


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


def _n_outputs(node: Node) -> int:
    return len(node._input_metadata)  # forward outputs of the op = gradients it receives


def plan_groups(roots: list[Node], trunk: list[Node], params: Sequence[Tensor]
                ) -> tuple[list[Group], list[Tensor]]:
    """Group the parameters by the trunk nodes they join it at (torch's get_param_groups,
    plus the parameters it drops). Returns (groups, parameters reachable from the roots that
    never meet the trunk); unreachable parameters (unused this micro-batch) are in neither."""
    reverse = construct_reverse_graph(roots)
    trunk_closure, _ = reverse_closure(trunk, set(), reverse)
    by_node: dict[Node, Group] = {}
    stray: list[Tensor] = []
    for p in params:
        acc = _get_grad_fn_or_grad_acc(p)
        if acc not in reverse:
            continue  # not used by this micro-batch's graph: no gradient, as in autograd
        _, meets = reverse_closure([acc], trunk_closure, reverse)
        if not meets:
            stray.append(p)
            continue
        grp = Group([], [], accs=[])
        nodes = dict.fromkeys(meets)  # ordered set
        for other in {id(by_node[n]): by_node[n] for n in meets if n in by_node}.values():
            grp.params += other.params  # p shares a node with it: one group
            grp.accs += other.accs
            nodes.update(dict.fromkeys(other.nodes))
        grp.params.append(p)
        grp.accs.append(acc)
        grp.nodes = list(nodes)
        for n in grp.nodes:
            by_node[n] = grp
    unique = {id(g): g for g in by_node.values()}
    return list(unique.values()), stray


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
    root_nodes = [_get_grad_fn_or_grad_acc(t) for t in roots]
    trunk = [_get_grad_fn_or_grad_acc(t) for t in list(inputs) + list(seeds)]
    groups, stray = plan_groups(root_nodes, trunk, params)
    edges = [GradientEdge(n, i) for grp in groups for n in grp.nodes for i in range(_n_outputs(n))]
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
        grp.grads = [tuple(next(it) for _ in range(_n_outputs(n))) for n in grp.nodes]
    return list(got[:k]), PendingW(groups), stray


def backward_weight(pending: PendingW) -> None:
    """W. Per group, autograd from the captured gradients into its parameters only (one
    call per group: a call from several intermediates would re-run the trunk between them)."""
    for grp in pending.groups:
        roots, root_grads = [], []
        for n, gs in zip(grp.nodes, grp.grads):
            for i, g in enumerate(gs):
                if g is not None:
                    roots.append(GradientEdge(n, i))
                    root_grads.append(g)
        handles = []
        if len(grp.nodes) > 1:  # a node below another of the group: keep its captured total
            for n, gs in zip(grp.nodes, grp.grads):
                handles.append(n.register_prehook(lambda _, gs=gs: gs))
        try:
            if roots:
                dws = torch.autograd.grad(roots, [GradientEdge(a, 0) for a in grp.accs],
                                          grad_outputs=root_grads, allow_unused=True)
                for p, g in zip(grp.params, dws):
                    accumulate(p, g)
        finally:
            for h in handles:
                h.remove()
    pending.groups.clear()
