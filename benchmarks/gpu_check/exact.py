"""Sections a and b: is training on CUDA right?

a. The one-process reference (executor/compute/one_process/reference.py) of the small model on the
   GPU against the same on the CPU, fp32 and bf16. Different kernels sum in different
   orders, so this is a tolerance, on the losses; the parameters' largest difference is
   reported beside it (AdamW turns rounding in a near-zero gradient into a step of up to
   lr, so parameters are no tighter test than losses here).
b. `recycle train --device cuda` on a DxS grid of worker processes sharing the GPU, with
   a SIGKILL and a rejoin, against `recycle train --reference --device cuda`: the tests'
   comparison (reference.compare: losses and per-stage checksums, tolerance absolute,
   relative above magnitude 1) at the tests' tolerances, 1e-5 fp32 and 1e-4 bf16
   (tests/test_executor_runtime.py, tests/test_training_features.py); the same for a
   dropout model with activation checkpointing, fp32 and bf16 (randomness), and for a
   stage lost whole and replayed (replay).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from executor.compute.config import TrainingSettings
from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.inputs.workload_name import load_workload
from executor.models.families import architecture

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TOL = {"fp32": 1e-4, "bf16": 2e-2}  # a: CUDA vs CPU, on the losses
RUN_TOL = {"fp32": 1e-5, "bf16": 1e-4}  # b: workers vs reference, as the tests


def small_config(model: str, micro_batch_size: int = 4) -> ModelConfig:
    """The model as `recycle train --model NAME` builds it with no other flag."""
    return ModelConfig(micro_batch_size=micro_batch_size, seed=0, **architecture(model))


def _max_param_diff(a: Summary, b: Summary) -> float:
    return max((float((sa[n] - sb[n]).abs().max()) for sa, sb in zip(a.state, b.state)
                for n in sa if sa[n].numel()), default=0.0)


def reference(st: dict) -> dict:
    D, S, M = st["grid"]
    iters, model = st["ref_iterations"], st["small_model"]
    cfg, wl = small_config(model), load_workload(model)
    torch.set_num_threads(1)  # the CPU side as `recycle train --reference` runs it
    lines = [f"{model}, D={D} S={S} M={M}, {iters} iterations, one process; "
             f"{st['device']} against cpu. Pass: every loss within the tolerance (absolute, "
             f"relative above magnitude 1).", "",
             "| precision | cpu s | device s | max loss diff | max param diff | tolerance "
             "(losses) | result |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    numbers, ok = {}, True
    for precision, tol in DEVICE_TOL.items():
        tr = TrainingSettings(precision=precision, total_iters=iters)
        runs, secs = [], []
        for dev in ("cpu", st["device"]):
            t0 = time.perf_counter()
            runs.append(train_reference(cfg, D, M, iters, S, training=tr, workload=wl,
                                        device=dev))
            secs.append(time.perf_counter() - t0)
        cpu, gpu = runs
        loss_diff = max(abs(x - y) for x, y in zip(cpu.losses, gpu.losses))
        par = _max_param_diff(cpu, gpu)
        bad = compare(Summary(cpu.losses, []), Summary(gpu.losses, []), tol)
        ok &= not bad
        lines.append(f"| {precision} | {secs[0]:.2f} | {secs[1]:.2f} | {loss_diff:.2e} | "
                     f"{par:.2e} | {tol:g} | {'PASS' if not bad else 'FAIL: ' + bad[0]} |")
        numbers[f"{precision}_loss_diff"], numbers[f"{precision}_param_diff"] = loss_diff, par
    lines += ["", f"Final losses ({st['device']}, bf16 run): "
              + ", ".join(f"{x:.5f}" for x in gpu.losses)]
    return {"lines": lines, "numbers": numbers, "ok": ok}


def recycle(*args: str, timeout: float = 300) -> str:
    """One `recycle` command (the CLI, as a user runs it); its output, or RuntimeError with
    its last line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "recycle.cli", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        last = (out.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"recycle {args[0]} exited {p.returncode}: {last}")
    return out


def transport(device: str, workers: int) -> str:
    """What executor/runtime/transport/comm.py's World picks for `workers` local workers."""
    if device != "cuda":
        return "gloo (CPU tensors)"
    gpus = torch.cuda.device_count()
    if gpus >= workers:
        return f"NCCL for data, gloo for control ({gpus} GPUs, one per worker)"
    return (f"gloo through host memory: {workers} workers share {gpus} GPU(s) and NCCL "
            f"needs one GPU per rank, so World copies each message to the CPU and back "
            f"(World.nccl: torch.cuda.device_count() >= local workers)")


def _against_reference(st: dict, model: str, precision: str, extra: list,
                       faults: list | None = None) -> dict:
    """`recycle train` of `model` on the grid with the kill and rejoin (or `faults`),
    against `--reference` on the device (`extra`: flags for the workers' run only); the
    table row's figures."""
    D, S, M = (str(v) for v in st["grid"])
    with tempfile.TemporaryDirectory(prefix="gpu_check_b_") as tmp:
        common = ["--model", model, "-d", D, "-s", S, "-m", M, "--iterations",
                  str(st["worker_iterations"]), "--precision", precision, "--device",
                  st["device"]]
        recycle("train", "--reference", *common, "--summary", f"{tmp}/ref.json")
        t0 = time.perf_counter()
        faults = faults if faults is not None else ["--kill", st["kill"], "--rejoin",
                                                    st["rejoin"]]
        recycle("train", *common, *extra, *faults,
                "--timeout", "10", "--run-dir", f"{tmp}/run", "--summary", f"{tmp}/run.json")
        secs = time.perf_counter() - t0
        ref, got = Summary.load(f"{tmp}/ref.json"), Summary.load(f"{tmp}/run.json")
        with open(f"{tmp}/run.json") as fh:
            doc = json.load(fh)
        recovery = doc.get("recovery") or []
        lost = (doc.get("elastic") or {}).get("lost_stages") or []
        logs = "".join(p.read_text() for p in Path(tmp, "run").glob("worker-*.log"))
    tol = RUN_TOL[precision]
    bad = compare(got, ref, tol)
    diff = max([abs(x - y) for x, y in zip(got.losses + got.param_checksums,
                                           ref.losses + ref.param_checksums)] or [0.0])
    return {"secs": secs, "bad": bad, "diff": diff, "tol": tol,
            "devices": sorted(set(re.findall(r"started \(incarnation \d+\) on (\S+)", logs))),
            "recovery": ", ".join(f"{r['kind']} {r['seconds']:.2f}" for r in recovery)
            or "none recorded", "lost": [x["kind"] for x in lost]}


def _row(label: str, r: dict) -> str:
    return (f"| {label} | {r['secs']:.1f} | {r['recovery']} | {', '.join(r['devices']) or '?'} "
            f"| {r['diff']:.2e} | {r['tol']:g} | "
            f"{'PASS' if not r['bad'] else 'FAIL: ' + r['bad'][0]} |")


HEAD = ["| {} | run s | recovery s (kill, rejoin) | worker devices | max diff | tolerance "
        "| result |", "| --- | ---: | --- | --- | ---: | ---: | --- |"]
DIFF_NOTE = ["", "max diff: the largest absolute difference over the losses and the "
             "per-stage parameter checksums (compare's tolerance is relative above 1)."]


def workers(st: dict) -> dict:
    D, S, M = st["grid"]
    dev, model = st["device"], st["small_model"]
    lines = [f"`recycle train --model {model} -d {D} -s {S} -m {M} --iterations "
             f"{st['worker_iterations']} --device {dev} --kill {st['kill']} --rejoin "
             f"{st['rejoin']}` against `recycle train --reference --device {dev}`.", "",
             f"Transport: {transport(dev, D * S)}.", "", HEAD[0].format("precision"), HEAD[1]]
    numbers, ok = {}, True
    for precision in st["worker_precisions"]:
        r = _against_reference(st, model, precision, [])
        ok &= not r["bad"]
        lines.append(_row(precision, r))
        numbers[f"{precision}_diff"], numbers[f"{precision}_run_s"] = r["diff"], r["secs"]
    return {"lines": lines + DIFF_NOTE, "numbers": numbers, "ok": ok}


def randomness(st: dict) -> dict:
    """Keyed randomness on the device: a dropout model's masks come from the device's
    generators re-seeded per (seed, iteration, micro-batch, layer), and activation
    checkpointing recomputes a layer under the same key (and, in bf16, the same autocast);
    the workers (with checkpointing) against the reference (without, in the same precision
    on the same device: CUDA's draws are not the CPU's) through the kill and rejoin."""
    D, S, M = st["grid"]
    model, dev = st["dropout_model"], st["device"]
    lines = [f"`recycle train --model {model} -d {D} -s {S} -m {M} --device {dev} "
             f"--precision P --activation-checkpointing C --kill {st['kill']} --rejoin "
             f"{st['rejoin']}` against `recycle train --reference --device {dev} --precision "
             "P` (no checkpointing): dropout 0.1 in every block.", "",
             HEAD[0].format("precision, checkpointing"), HEAD[1]]
    numbers, ok = {}, True
    for precision, policy in st["randomness_runs"]:
        r = _against_reference(st, model, precision, ["--activation-checkpointing", policy])
        ok &= not r["bad"]
        lines.append(_row(f"{precision}, {policy}", r))
        numbers[f"{precision}_{policy}_diff"] = r["diff"]
    return {"lines": lines + DIFF_NOTE, "numbers": numbers, "ok": ok}


def replay(st: dict) -> dict:
    """A stage lost whole on the device (both workers of the last stage SIGKILLed): its
    snapshot loaded and the stage replayed alone from the boundary logs (pinned host
    copies of CUDA tensors), against the reference."""
    D, S, M = st["grid"]
    dev, model, it = st["device"], st["small_model"], st["worker_iterations"] - 1
    kills = [x for r in range(D) for x in ("--kill", f"{r}:{S - 1}@{it}")]
    lines = [f"`recycle train --model {model} -d {D} -s {S} -m {M} --device {dev} "
             f"--snapshot-every 2 {' '.join(kills)}` against `recycle train --reference "
             f"--device {dev}`: the last stage lost whole, replayed from the logs.", "",
             HEAD[0].format("recovered by"), HEAD[1]]
    r = _against_reference(st, model, "fp32", ["--snapshot-every", "2"], kills)
    ok = not r["bad"] and r["lost"] == ["replay"]
    lines.append(_row(", ".join(r["lost"]) or "nothing lost?", r))
    return {"lines": lines + DIFF_NOTE, "numbers": {"replay_diff": r["diff"]}, "ok": ok}
