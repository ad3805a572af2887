"""The I/W split against autograd's fused backward and against torch's own split
(torch.distributed.pipelining's stage_backward_input / stage_backward_weight), per
micro-batch, side by side in one process, interleaved rounds.

    PYTHONPATH=. .venv/bin/python -m benchmarks.split_backward_ab [--models llama:debug gpt]
        [--stages 2] [--rounds 40] [--out benchmarks/results/split_backward.md]

Per model and stage (the executor benchmark's shapes, benchmarks/executor_bench.py
bench_config), per micro-batch, the thread's CPU time on one torch thread of:
  fused B  StageCompute.backward_full under a fused plan (one autograd backward; what
           torch's Schedule1F1B runs);
  ours     StageCompute.backward_input then backward_weight (executor/compute/backward/split_backward.py;
           W of Linear and norm groups without the engine, executor/compute/backward/direct_w.py;
           on the first stage I empty and W one plain backward);
  wt-d     our split as it was before this branch (base wt-d): every W group through the
           autograd engine, and the first stage split like the others;
  torch    a plain forward, then stage_backward_input and stage_backward_weight, as
           torch's PipelineStage calls them for zero-bubble schedules; on the first stage
           (token ids need no grad) torch's split finds no trunk and would leave every
           weight without gradient, so there it is one plain backward in W, I empty.
Each round runs the four in a rotating order on the same input and output gradient;
medians over rounds. "all stages" sums the stages' medians: the work of one micro-batch
through the whole pipeline. Exactness: each split's parameter and input gradients
against fused B's (max abs difference), and both splits on a parameter used twice in one
stage (tests/test_shared_weights.py's ALBERT block).
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import sys
import time

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from benchmarks.executor_bench import bench_config
from executor.compute.host_allocator import keep_freed_memory
from executor.compute.stage import StageCompute
from executor.inputs.workload_name import load_workload

MECHS = ("fused B", "ours", "wt-d", "torch")


def _t() -> float:
    return time.thread_time()


def _faults() -> int:
    """Minor page faults of this thread so far (pages the allocator had given back)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


class Stage:
    def __init__(self, model: str, stage: int, stages: int):
        cfg, wl = bench_config(model), load_workload(model)
        self.first, self.last = stage == 0, stage == stages - 1
        self.module = wl.build_stage(cfg, stage, stages)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.loss_fn = wl.loss_fn
        x, self.y = wl.microbatch(cfg, 0, 0)
        with torch.no_grad():
            for s in range(stage):
                x = wl.build_stage(cfg, s, stages)(x)
            out = None if self.last else self.module(x)
        self.x = x
        self.grad = None if self.last else torch.randn(
            out.shape, generator=torch.Generator().manual_seed(1))
        self.fused = StageCompute(self.module, self.first, self.last, 1.0, wl.loss_fn)
        self.fused.split = False
        self.ours = StageCompute(self.module, self.first, self.last, 1.0, wl.loss_fn)
        self.engine = StageCompute(self.module, self.first, self.last, 1.0, wl.loss_fn)
        self.engine.split_first = True
        self.walk_s = 0.0  # ours: the graph walk of the last I (GraphPlans.plan_groups)
        plans, real = self.ours._plans, self.ours._plans.plan_groups

        def walked(*a):
            t0 = _t()
            out = real(*a)
            self.walk_s = _t() - t0
            return out
        plans.plan_groups = walked

    def run(self, mech: str) -> tuple[float, list, object]:
        """One micro-batch's backward by `mech`: (CPU seconds, parameter grads, input grad)."""
        for p in self.params:
            p.grad = None
        f0 = _faults()
        if mech == "torch":
            x = self.x if self.first else self.x.detach().requires_grad_(True)
            with torch.enable_grad():
                out = self.module(x)
                root = self.loss_fn(out, self.y) if self.last else out
            t0 = _t()
            if self.first:  # no input needs grad: torch's split finds no trunk and leaves
                # every weight without gradient, so PipelineStage runs the whole backward
                # in W on the first stage; so does this
                torch.autograd.backward([root], None if self.last else [self.grad])
                dx = [None]
            else:
                dx, groups = stage_backward_input([root], None if self.last else [self.grad],
                                                  [x], iter(self.params))
                stage_backward_weight(iter(self.params), groups)
            dt = _t() - t0
            gx = None if self.first else dx[0]
        else:
            comp = {"fused B": self.fused, "ours": self.ours}.get(mech, self.engine)
            comp.forward(0, self.x, self.y)
            t0 = _t()
            if mech == "fused B":
                gx = comp.backward_full(0, self.grad)
            else:
                gx = comp.backward_input(0, self.grad)
                self.i_s = _t() - t0
                if comp is self.engine and comp._plans._plan:  # no group takes the direct way
                    plan = comp._plans._plan
                    plan.direct = [False] * len(plan.groups)
                comp.backward_weight(0)
            dt = _t() - t0
            comp._losses.clear()
        self.faults = _faults() - f0  # the forward's too: the micro-batch's pages
        return dt, [p.grad for p in self.params], gx


def _diff(a: list, b: list) -> float:
    d = 0.0
    for x, y in zip(a, b):
        if (x is None) != (y is None):
            return float("inf")
        if x is not None:
            d = max(d, float((x - y).abs().max()))
    return d


def measure(model: str, stages: int, rounds: int) -> list[dict]:
    rows = []
    for s in range(stages):
        st = Stage(model, s, stages)
        ref = st.run("fused B")
        exact = {}
        for m in MECHS[1:]:
            got = st.run(m)
            exact[m] = max(_diff(got[1], ref[1]),
                           0.0 if st.first else _diff([got[2]], [ref[2]]))
        times = {m: [] for m in MECHS + ("ours I", "walk", "faults B", "faults ours")}
        k = len(MECHS)
        for r in range(rounds + 3):
            order = MECHS[r % k:] + MECHS[:r % k]
            for m in order:
                dt = st.run(m)[0]
                if r >= 3:
                    times[m].append(dt * 1e6)
                    if m in ("fused B", "ours"):
                        times["faults B" if m == "fused B" else "faults ours"].append(st.faults)
                    if m == "ours":
                        times["ours I"].append(st.i_s * 1e6)
                        times["walk"].append(st.walk_s * 1e6)
        rows.append({"model": model, "stage": s, "exact": exact,  # faults come in bursts:
                     **{m: (statistics.mean if m.startswith("faults") else statistics.median)(v)
                        for m, v in times.items()}})
        print(rows[-1], flush=True)
    return rows


def shared_weight_check() -> dict:
    """Both splits on tests/test_shared_weights.py's ALBERT block (a Linear applied twice
    around a LayerNorm): max abs difference of parameter grads to autograd's, or the error."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests"))
    from test_shared_weights import _Albert  # noqa: E402
    torch.manual_seed(0)
    mod = _Albert()
    params = list(mod.parameters())
    x = torch.randn(2, 5, 8)
    g = torch.randn(2, 5, 8)

    def grads_of(fn):
        for p in params:
            p.grad = None
        try:
            fn()
        except RuntimeError as exc:
            return str(exc).splitlines()[0][:80]
        return [p.grad.clone() if p.grad is not None else None for p in params]

    def plain():
        xi = x.detach().requires_grad_(True)
        mod(xi).backward(g)

    def ours():
        sc = StageCompute(mod, False, False, 1.0)
        sc.forward(0, x)
        sc.backward_input(0, g)
        sc.backward_weight(0)

    def torch_split():
        xi = x.detach().requires_grad_(True)
        out = mod(xi)
        _, groups = stage_backward_input([out], [g], [xi], iter(params))
        stage_backward_weight(iter(params), groups)

    ref = grads_of(plain)
    res = {}
    for name, fn in (("ours", ours), ("torch", torch_split)):
        got = grads_of(fn)
        res[name] = got if isinstance(got, str) else f"max abs diff {_diff(got, ref):.1e}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama:debug", "gpt"])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true", help=(
        "add this run's table to --out under its own heading (an ablation beside the "
        "headline run) instead of replacing the file"))
    ap.add_argument("--allocator", choices=("worker", "system"), default="worker", help=(
        "worker: host memory kept mapped as a worker keeps it (executor/compute/"
        "host_allocator.py); system: glibc's defaults (an ablation)"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.allocator == "worker" and not keep_freed_memory():
        raise SystemExit("the worker's allocator setting is not available here (glibc only)")
    load0 = os.getloadavg()[0]
    rows = [r for m in a.models for r in measure(m, a.stages, a.rounds)]
    shared = shared_weight_check()
    us = lambda v: f"{v:,.0f}"  # noqa: E731
    title = ("## Ablation: host allocator " + a.allocator if a.append else
             "# I/W split vs fused backward vs torch's stage_backward_input/weight")
    lines = [title, "",
             "Command: `PYTHONPATH=. .venv/bin/python -m benchmarks.split_backward_ab "
             + " ".join(shlex.quote(x) for x in sys.argv[1:]) + "`", "",
             f"torch {torch.__version__}, CPU, 1 torch thread, {os.cpu_count()} cores shared "
             f"with other jobs (1-min load average {load0:.1f} at start, "
             f"{os.getloadavg()[0]:.1f} at the end). us of thread CPU time per micro-batch, "
             f"median of {a.rounds} rounds, the mechanisms in rotating order each round; "
             f"S={a.stages}; host allocator: {a.allocator}. ours I (walk): I alone, and within it the walk over the graph that "
             "finds the intermediates (GraphPlans.plan_groups). exact: max abs difference of "
             "parameter (and input) gradients to fused B's. faults: the thread's minor page "
             "faults per micro-batch (forward and backward; mean), fused B / ours.", "",
             "| model | stage | fused B | ours I (walk) | ours I+W | / B | wt-d I+W | / B "
             "| torch I+W | / B | exact ours | exact wt-d | exact torch | faults B / ours |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: |"]
    for model in a.models:
        rs = [r for r in rows if r["model"] == model]
        for r in rs + [None]:
            if r is None:
                b, o, e, t, i, w = (sum(x[k] for x in rs) for k in MECHS + ("ours I", "walk"))
                fb, fo = (sum(x[k] for x in rs) for k in ("faults B", "faults ours"))
                lines.append(f"| {model} | all stages | {us(b)} | {us(i)} ({us(w)}) | {us(o)} "
                             f"| {o / b:.2f} "
                             f"| {us(e)} | {e / b:.2f} | {us(t)} | {t / b:.2f} | | | "
                             f"| {fb:.0f} / {fo:.0f} |")
                continue
            b, o, e, t, i, w = (r[k] for k in MECHS + ("ours I", "walk"))
            ex = r["exact"]
            lines.append(f"| {model} | {r['stage']} | {us(b)} | {us(i)} ({us(w)}) | {us(o)} "
                         f"| {o / b:.2f} "
                         f"| {us(e)} "
                         f"| {e / b:.2f} | {us(t)} | {t / b:.2f} | {ex['ours']:.1e} "
                         f"| {ex['wt-d']:.1e} | {ex['torch']:.1e} "
                         f"| {r['faults B']:.0f} / {r['faults ours']:.0f} |")
    lines += ["", "Parameter used twice in one stage (ALBERT block of tests/test_shared_weights.py), "
              f"gradients against autograd's: ours {shared['ours']}; torch {shared['torch']}.", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "a" if a.append else "w") as fh:
            fh.write("\n" + text if a.append else text)


if __name__ == "__main__":
    main()
