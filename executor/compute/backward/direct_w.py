"""W without the autograd engine for the commonest groups: a Linear's weight (and bias) and
a norm's scale.

Why: every autograd engine call first walks the whole graph below its roots (to count
dependencies and mark what to execute), and W makes one call per group of a chain (a call
from several links would re-run the trunk between them): on a small stage that walk, not
the products, was most of W (llama:debug: 14 calls of 40-60 us around 0.5-1 ms of
matrix products; benchmarks/results/split_backward.md). A group whose trunk nodes are one
of the patterns below gets its weight gradients here from the node's saved tensors and
the gradient I captured, with the formulas autograd's own backward uses (mm_mat2_backward's
layout rule, addmm's beta, mul's other operand, then sum_to the parameter's shape):

    MmBackward0      trunk on mat1, the parameter on mat2 (directly or through .t())
    AddmmBackward0   the same, plus a bias on `self` (alpha = beta = 1)
    MulBackward0     trunk on one operand, the parameter (possibly broadcast) on the other
    NativeLayerNormBackward0   the affine weight and bias (the input's gradient masked off)

Anything else, or a parameter reached through any other node, goes to the engine.
Exactness: the first micro-batch of each graph structure computes such a group both ways
and keeps the direct way only if every gradient is bit-identical to the engine's (same
kernels on the same shapes give the same bits on the next micro-batches); otherwise the
group stays on the engine for that structure.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# recipe per trunk node: (kind, [(edge number, via .t(), position of the param in the group)])


def _param_edge(node, k: int, accs: dict) -> Optional[tuple]:
    """Edge k of node if it leads to one of the group's parameters, directly or through a
    TBackward0 that nothing else uses: (k, transposed, position)."""
    nxt, _ = node.next_functions[k]
    if nxt is None:
        return None
    if nxt in accs:
        return (k, False, accs[nxt])
    if type(nxt).__name__ == "TBackward0":
        (acc, _), = nxt.next_functions
        if acc in accs:
            return (k, True, accs[acc])
    return None


def recipe(grp) -> Optional[list]:
    """How each of grp's trunk nodes yields its parameters' gradients, or None."""
    if grp.kids is not None or any(len(outs) != 1 or outs[0] != 0 for outs in grp.outs):
        return None
    accs = {a: i for i, a in enumerate(grp.accs)}
    out = []
    for n in grp.nodes:
        kind = type(n).__name__
        nf = len(n.next_functions)
        edges = [e for e in (_param_edge(n, k, accs) for k in range(nf)) if e is not None]
        if kind == "MmBackward0":
            ok = [e[0] for e in edges] == [1]
        elif kind == "AddmmBackward0":
            ok = [e[0] for e in edges] in ([2], [0, 2]) and not any(
                e[1] for e in edges if e[0] == 0) and n._saved_alpha == 1 and n._saved_beta == 1
        elif kind == "MulBackward0":
            ok = len(edges) == 1 and not edges[0][1]
        elif kind == "NativeLayerNormBackward0":
            ok = [e[0] for e in edges] in ([1], [1, 2], [2]) and not any(e[1] for e in edges)
        else:
            ok = False
        if not ok:
            return None
        out.append((kind, edges))
    if {i for _, es in out for _, _, i in es} != set(range(len(grp.params))):
        return None  # a parameter also reached some other way
    return out


def _mat2_grad(node, grad: Tensor, mat1: Tensor, transposed: bool) -> Tensor:
    """autograd's mm_mat2_backward: a column-major mat2 (a Linear's weight.t()) gets its
    gradient computed column-major too; `transposed`: the parameter is mat2.t(), so the
    product itself (not a view of it) is the weight's gradient."""
    sizes, strides = node._saved_mat2_sym_sizes, node._saved_mat2_sym_strides
    if strides[0] == 1 and strides[1] == sizes[0]:
        g = grad.t().mm(mat1)  # mat2's gradient is g.t()
        return g if transposed else g.t()
    g = mat1.t().mm(grad)
    return g.t() if transposed else g


def _sum_to(g: Tensor, shape) -> Tensor:
    """at::sum_to: sum the broadcast dimensions away."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape)
                                if s == 1 and g.shape[lead + i] != 1]
    r = g.sum(dims, keepdim=True) if dims else g
    return r.view(shape) if lead else r


def compute(grp, rec: list) -> list:
    """Per parameter of grp, its gradient (None if it got none), summed over its uses.
    Every tensor returned is new (no captured gradient is returned as is): the caller
    may keep it as the parameter's .grad without a copy."""
    got: list = [None] * len(grp.params)
    with torch.no_grad():
        for n, gs, (kind, edges) in zip(grp.nodes, grp.grads, rec):
            grad = gs[0]
            if grad is None:
                continue
            if kind == "NativeLayerNormBackward0":  # one kernel, only the affine outputs
                _layer_norm(n, grad, edges, grp.params, got)
                continue
            for k, transposed, i in edges:
                if kind == "MulBackward0":
                    g = grad * (n._saved_other if k == 0 else n._saved_self)
                elif k == 0:  # addmm's self: the bias, broadcast over the rows
                    g = grad
                else:
                    g = _mat2_grad(n, grad, n._saved_self if kind == "MmBackward0"
                                   else n._saved_mat1, transposed)
                g = _sum_to(g, grp.params[i].shape)
                if g is grad:  # a bias as wide as the gradient: not ours to keep
                    g = g.clone()
                got[i] = g if got[i] is None else got[i] + g
    return got


def _layer_norm(n, grad: Tensor, edges: list, params: list, got: list) -> None:
    """native_layer_norm_backward with the input's output masked off, as the engine runs
    it when only the weight and bias are wanted."""
    want = {k for k, _, _ in edges}
    weight, bias = n._saved_weight, n._saved_bias
    _, gw, gb = torch.ops.aten.native_layer_norm_backward(
        grad, n._saved_input, list(n._saved_normalized_shape), n._saved_result1,
        n._saved_result2, weight, bias, [False, 1 in want, 2 in want])
    for k, _, i in edges:
        g = gw if k == 1 else gb
        got[i] = g if got[i] is None else got[i] + g


def same(a: list, b: list) -> bool:
    """Bit-identical gradient lists (dtype, shape and values)."""
    return all((x is None) == (y is None) and (x is None or (
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y))) for x, y in zip(a, b))
