"""Deferred W: the generic split backward vs autograd's fused backward vs the custom layers.

    PYTHONPATH=. .venv/bin/python benchmarks/deferred_w.py [--rounds 15] [--out FILE]

Per model, size and stage (S=2: stage 0 = first, stage 1 = last), per micro-batch:
  fused    StageCompute.backward_full: one plain autograd backward (B);
  generic  StageCompute's I and W (executor/compute/backward/split_backward.py);
  custom   the custom deferred layers this replaced (executor/compute/wgrad.py, loaded from
           git commit e9536fd): GPT only, the plain-nn model cannot use them (under them
           its W was empty and I did everything).
Times: median over --rounds rounds (after 2 warm-up rounds) of the thread's CPU time on
one torch thread, the mechanisms interleaved inside each round so machine load hits them
alike; ratios are taken inside one run. Memory: bytes one micro-batch keeps alive between
its I and its W (parameters excluded): for generic what its F saved that is still alive
plus the gradients I captured (StageCompute.held_bytes); for custom the (input,
grad_output) pairs of its store; F's saved bytes for reference (what fused B holds from F
to B). Writes a markdown table to --out (benchmarks/results/deferred_w.md).
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
import types
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from executor.compute import model as gpt  # noqa: E402
from executor.compute.model import ModelConfig, Workload  # noqa: E402
from executor.compute.stage import StageCompute  # noqa: E402
from examples import mlp_workload  # noqa: E402

LEGACY_COMMIT = "e9536fd"
SIZES = {  # name -> ModelConfig overrides
    "tiny": dict(),
    "bench": dict(vocab=256, seq_len=64, d_model=128, n_heads=4, n_layers=4, micro_batch_size=8),
    "large": dict(vocab=256, seq_len=128, d_model=256, n_heads=4, n_layers=4, micro_batch_size=8),
}


def load_legacy():
    """executor/compute/wgrad.py as of LEGACY_COMMIT, as a module (None if git cannot)."""
    try:
        src = subprocess.run(["git", "-C", ROOT, "show", f"{LEGACY_COMMIT}:executor/compute/wgrad.py"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("legacy_wgrad")
    exec(compile(src, "legacy_wgrad.py", "exec"), mod.__dict__)
    return mod


@contextmanager
def legacy_layers(legacy):
    """Build the GPT from the custom layers (same names, same initialisation)."""
    saved = gpt.Linear, gpt.LayerNorm, gpt.Embedding
    gpt.Linear, gpt.LayerNorm, gpt.Embedding = legacy.Linear, legacy.LayerNorm, legacy.Embedding
    try:
        yield
    finally:
        gpt.Linear, gpt.LayerNorm, gpt.Embedding = saved


class LegacyStage:
    """The F/I/W driver of the custom layers (StageCompute at LEGACY_COMMIT, reduced)."""

    def __init__(self, legacy, module, first, last, loss_fn):
        self.lg, self.module, self.first, self.last, self.loss_fn = legacy, module, first, last, loss_fn
        self.params = {id(p) for p in module.parameters()}

    def forward(self, x, targets):
        x = x if self.first else x.detach().requires_grad_(True)
        self.store = []
        with torch.enable_grad(), self.lg.deferring(self.store):
            out = self.module(x)
            self.root = self.loss_fn(out, targets) if self.last else out

    def backward_input(self, grad):
        torch.autograd.backward(self.root, grad)
        self.root = None
        self.held = self.lg.store_bytes(self.store, self.params)

    def backward_weight(self):
        self.lg.run_store(self.store)


def clock():
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def timed(fn) -> float:
    t0 = clock()
    fn()
    return (clock() - t0) * 1e6


def stage_input(wl: Workload, cfg, stage):
    x, tgt = wl.microbatch(cfg, 0, 0)
    with torch.no_grad():
        for s in range(stage):
            x = wl.build_stage(cfg, s, 2)(x)
    return x, tgt


def measure(is_gpt, wl, cfg, stage, rounds, legacy):
    first, last = stage == 0, stage == 1
    x, tgt = stage_input(wl, cfg, stage)
    grad = None
    if not last:
        with torch.no_grad():
            out = wl.build_stage(cfg, stage, 2)(x)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    comp = StageCompute(wl.build_stage(cfg, stage, 2), first, last, 1.0, wl.loss_fn)
    old = None
    if legacy is not None and is_gpt:
        with legacy_layers(legacy):
            old = LegacyStage(legacy, wl.build_stage(cfg, stage, 2), first, last, wl.loss_fn)
    t: dict[str, list] = {}
    held = {}
    for r in range(rounds + 2):
        comp.forward(0, x, tgt)
        row = {"fused B": timed(lambda: comp.backward_full(0, grad))}
        comp.zero_grad()
        comp.track_memory = r == 0  # ledger hooks only on a warm-up round
        comp.forward(0, x, tgt)
        row["generic I"] = timed(lambda: comp.backward_input(0, grad))
        if r == 0:
            held["generic"] = comp.held_bytes(0)
            held["F saved"] = comp._after_i[0][1].saved_bytes()
        row["generic W"] = timed(lambda: comp.backward_weight(0))
        comp.zero_grad()
        if old is not None:
            old.forward(x, tgt)
            row["custom I"] = timed(lambda: old.backward_input(grad))
            held["custom"] = old.held
            row["custom W"] = timed(old.backward_weight)
            old.module.zero_grad(set_to_none=True)
        if r >= 2:
            for k, v in row.items():
                t.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in t.items()}, held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks/results/deferred_w.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    legacy = load_legacy()
    models = {"GPT": gpt.DEFAULT_WORKLOAD, "plain-nn MLP": mlp_workload.workload()}
    lines = ["| model | size | stage | fused B | generic I | generic W | generic I+W | / B "
             "| custom I | custom W | custom I+W | / B | held I->W generic | held I->W custom "
             "| F saved |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: |"]
    us = lambda v: f"{v:,.0f}"
    for size, over in SIZES.items():
        cfg = ModelConfig(**over)
        for name, wl in models.items():
            for stage in (0, 1):
                med, held = measure(name == "GPT", wl, cfg, stage, args.rounds, legacy)
                b, gi, gw = med["fused B"], med["generic I"], med["generic W"]
                cells = [name, size, f"{stage} ({'first' if stage == 0 else 'last'})", us(b),
                         us(gi), us(gw), us(gi + gw), f"{(gi + gw) / b:.2f}"]
                if "custom I" in med:
                    ci, cw = med["custom I"], med["custom W"]
                    cells += [us(ci), us(cw), us(ci + cw), f"{(ci + cw) / b:.2f}"]
                else:
                    cells += ["-"] * 4
                cells += [f"{held['generic']:,}", f"{held['custom']:,}" if "custom" in held else "-",
                          f"{held['F saved']:,}"]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    cmd = "PYTHONPATH=. .venv/bin/python benchmarks/deferred_w.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    head = [
        "# Deferred W: generic split backward vs fused backward vs custom layers", "",
        f"Command: `{cmd.strip()}`", "",
        f"torch {torch.__version__}, CPU, 1 torch thread, {os.cpu_count()} cores shared with other "
        f"jobs (1-min load average at the end {os.getloadavg()[0]:.1f}). Times in us per "
        f"micro-batch: median over {args.rounds} rounds of the thread's CPU time, mechanisms "
        "interleaved per round. Bytes: what one micro-batch keeps alive between I and W "
        "(parameters excluded); F saved = what its forward saved for backward (what fused B "
        f"holds from F to B). custom = executor/compute/wgrad.py at {LEGACY_COMMIT} (GPT only).", "",
        "Sizes: tiny = ModelConfig() (d_model 32, seq 16, micro-batch 4, 4 layers, vocab 64); "
        "bench = d_model 128, seq 64, micro-batch 8, 4 layers, vocab 256 (the executor "
        "benchmark's model); large = d_model 256, seq 128, micro-batch 8, 4 layers, vocab 256. "
        "S=2: each stage holds 2 layers.", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(head + lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
