"""Instruction counts of the runtime's per-action work and of the I/W split: figures the
noise of a shared machine does not move, beside the times it does.

    PYTHONPATH=. .venv/bin/python -m benchmarks.instruction_counts [--models llama:debug gpt]
        [--stages 2] [--reps 4] [--rounds 20] [--no-callgrind]
        [--out benchmarks/results/instruction_counts.md]

1. Python bytecodes per plan action (sys.settrace with f_trace_opcodes): real WorkerLoops
   in one process (tests/test_fault_in_one_process.py's harness: 2x2, the tiny GPT, the
   I/W split), worker 0:1's iterations 3 and 4 traced on its own thread, opcodes counted
   in product code (executor/, planner/), waits left out (waiting.py, the World's polls,
   the stepper's idle work: how often a poll spins is timing, not work) and the data
   loader's (on its own thread when it ran ahead), divided by the worker's plan actions.
   By part: the runtime (executor/runtime, planner, protocol, checkpoint), the compute (executor/compute: the split in executor/compute/backward),
   the optimizer (executor/optim). tests/test_instruction_counts.py fails when the total
   grows more than 10% over the figure committed here.
2. Machine instructions of the split (`valgrind --tool=callgrind`, collection switched on
   and off by client requests around each measured region, from a 20-line C helper this
   script compiles): per micro-batch of each stage of the executor benchmark's shapes
   (benchmarks/executor_bench.py bench_config), `reps` forwards alone, forward + fused B
   (StageCompute.backward_full) and forward + I + W (backward_input, backward_weight);
   the backward's instructions are the difference to the forward's. Beside them the same
   regions' thread CPU time, natively, in interleaved rounds (medians).
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import glob
import json
import os
import pathlib
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "instruction_counts.md"
PARTS = ("executor", "planner")
# Not counted, with what they call: waits (how many times a poll spins is the machine's
# timing, not the runtime's work) and the workload's data loading (on the loader thread
# when it ran ahead, on the training thread when it did not: the same work either way)
UNCOUNTED = {("executor/runtime/transport/waiting.py", "*"),
             ("executor/runtime/transport/comm.py", "_wait"),
             ("executor/runtime/transport/comm.py", "_poll"),
             ("executor/runtime/transport/comm.py", "_wait_until"),
             ("executor/runtime/steps/stepper.py", "idle"),
             ("executor/runtime/steps/batches.py", "get")}
TRACED = (3, 4)  # worker 0:1's iterations counted (after lowering and specs are cached)


def part_of(rel: str) -> str:
    if rel.startswith("executor/compute/backward/"):
        return "compute: I/W split"
    if rel.startswith("executor/compute/"):
        return "compute: rest"
    if rel.startswith("executor/optim/"):
        return "optimizer"
    return "runtime"


class OpcodeCounter:
    """A sys.settrace function counting bytecodes per product file, UNCOUNTED left out."""

    def __init__(self):
        self.ops: collections.Counter = collections.Counter()
        self._skip = 0
        self._rel: dict = {}

    def _product(self, filename: str):
        rel = self._rel.get(filename, 0)
        if rel == 0:
            try:
                path = pathlib.Path(filename).resolve().relative_to(ROOT)
                rel = str(path) if path.parts[0] in PARTS else None
            except ValueError:
                rel = None
            self._rel[filename] = rel
        return rel

    def __call__(self, frame, event, arg):
        if event != "call" or self._skip:
            return None
        rel = self._product(frame.f_code.co_filename)
        if rel is None:
            return None
        if (rel, "*") in UNCOUNTED or (rel, frame.f_code.co_name) in UNCOUNTED:
            self._skip += 1

            def wait(frame, event, arg):
                if event == "return":
                    self._skip -= 1
                return wait
            return wait
        frame.f_trace_opcodes = True
        ops = self.ops

        def count(frame, event, arg):
            if event == "opcode":
                ops[rel] += 1
            return count
        return count


def python_ops(tmp: pathlib.Path) -> dict:
    """{"per_action": opcodes per plan action, "parts": by part, "files": by file, ...}."""
    from executor.runtime.steps.iteration import IterationRuntime
    from tests.test_fault_in_one_process import _run

    seen: dict = {}
    run = IterationRuntime.run

    def traced(self, plan, wp, it):
        if self.h.state.me != (0, 1) or it not in TRACED:
            return run(self, plan, wp, it)
        counter = OpcodeCounter()
        sys.settrace(counter)
        try:
            return run(self, plan, wp, it)
        finally:
            sys.settrace(None)
            seen[it] = (counter.ops, len(wp.actions))
    IterationRuntime.run = traced
    try:
        _run(tmp, 2, 2, 6, lambda w: None)
    finally:
        IterationRuntime.run = run
    files: collections.Counter = collections.Counter()
    actions = 0
    for it in TRACED:
        ops, n = seen[it]
        files.update(ops)
        actions += n
    parts: collections.Counter = collections.Counter()
    for rel, n in files.items():
        parts[part_of(rel)] += n
    return {"per_action": round(sum(files.values()) / actions, 1), "actions": actions,
            "parts": {k: round(v / actions, 1) for k, v in sorted(parts.items())},
            "files": {k: round(v / actions, 1) for k, v in files.most_common(12)}}


# -- the split under callgrind ----------------------------------------------------------

HELPER_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""
REGIONS = ("F", "F+B", "F+I+W")


def _helper(tmp: str) -> str:
    src, lib = os.path.join(tmp, "cg.c"), os.path.join(tmp, "libcg.so")
    with open(src, "w") as fh:
        fh.write(HELPER_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return lib


def _region(stage, region: str):
    """One micro-batch of `region` on split_backward_ab's Stage (its fused and ours)."""
    if region == "F+B":
        return stage.run("fused B")
    if region == "F+I+W":
        return stage.run("ours")
    stage.ours.forward(0, stage.x, stage.y)  # F alone, its graph then dropped
    stage.ours.reset()


def child(model: str, stages: int, reps: int, lib: str) -> None:
    """Under callgrind: each stage's regions, `reps` micro-batches each, one dump each."""
    import torch

    from benchmarks.split_backward_ab import Stage
    torch.set_num_threads(1)
    cg = ctypes.CDLL(lib)
    cg.cg_dump.argtypes = [ctypes.c_char_p]
    built = [Stage(model, s, stages) for s in range(stages)]
    for st in built:  # warm: first-call work (graph plans, allocator) is not the split's
        for region in REGIONS:
            _region(st, region)
    cg.cg_start()
    for s, st in enumerate(built):
        for region in REGIONS:
            cg.cg_zero()
            cg.cg_toggle()
            for _ in range(reps):
                _region(st, region)
            cg.cg_toggle()
            cg.cg_dump(f"{model}|{s}|{region}".encode())


def _dumps(pattern: str) -> dict:
    """label -> instructions, from callgrind's dump files."""
    out = {}
    for path in glob.glob(pattern):
        text = open(path, errors="replace").read()
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if label and total:
            out[label.group(1).strip()] = int(total.group(1))
    return out


def split_counts(models: list[str], stages: int, reps: int) -> dict:
    """(model, stage) -> {"B": Ir per micro-batch, "I+W": ..., "F": ...}."""
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        raise SystemExit("instruction_counts: callgrind needs valgrind and a C compiler "
                         "(apt-get install valgrind gcc), or pass --no-callgrind")
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="instr_") as tmp:
        lib = _helper(tmp)
        for model in models:
            out = os.path.join(tmp, f"cg.{model.replace(':', '_')}")
            subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            "--collect-atstart=no", f"--callgrind-out-file={out}",
                            sys.executable, "-m", "benchmarks.instruction_counts", "--child",
                            model, str(stages), str(reps), lib],
                           cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got = _dumps(out + "*")
            for s in range(stages):
                f = got[f"{model}|{s}|F"] / reps
                rows[(model, s)] = {"F": f, "B": got[f"{model}|{s}|F+B"] / reps - f,
                                    "I+W": got[f"{model}|{s}|F+I+W"] / reps - f}
    return rows


def split_times(models: list[str], stages: int, rounds: int) -> dict:
    """(model, stage) -> median thread CPU seconds per micro-batch of B and of I+W."""
    import torch

    from benchmarks.split_backward_ab import Stage
    torch.set_num_threads(1)
    rows: dict = {}
    for model in models:
        for s in range(stages):
            st = Stage(model, s, stages)
            times: dict = {"fused B": [], "ours": []}
            for r in range(rounds + 2):
                for mech in (("fused B", "ours") if r % 2 else ("ours", "fused B")):
                    dt = st.run(mech)[0]
                    if r >= 2:
                        times[mech].append(dt)
            rows[(model, s)] = {"B": statistics.median(times["fused B"]),
                                "I+W": statistics.median(times["ours"])}
    return rows


# -- report -----------------------------------------------------------------------------

def render(py: dict, counts: dict | None, times: dict, argv: list[str], stamp: str) -> str:
    lines = ["# Instruction counts: the runtime's per-action work and the I/W split", "",
             "Generated by `PYTHONPATH=. .venv/bin/python -m benchmarks.instruction_counts "
             + " ".join(shlex.quote(a) for a in argv) + f"` ({stamp}); what each figure "
             "counts: the script's docstring. Counts do not move with the machine's load; "
             "the times beside them do.", "",
             "## Python bytecodes per plan action (worker 0:1 of a 2x2 run, iterations "
             f"{TRACED[0]} and {TRACED[1]}, {py['actions']} actions)", "",
             "| part | opcodes per action |", "| --- | ---: |"]
    lines += [f"| {k} | {v:,.1f} |" for k, v in py["parts"].items()]
    lines += [f"| **all** | **{py['per_action']:,.1f}** |", "", "The files that run most:", "",
              "| file | opcodes per action |", "| --- | ---: |"]
    lines += [f"| `{k}` | {v:,.1f} |" for k, v in py["files"].items()]
    lines += ["", "## The I/W split against fused B, per micro-batch", "",
              "| model | stage | B instructions | I+W instructions | I+W / B (instructions) "
              "| B CPU us | I+W CPU us | I+W / B (time) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tot: dict = collections.defaultdict(lambda: collections.Counter())
    for (model, s), t in sorted(times.items()):
        c = (counts or {}).get((model, s))
        ci = (f"{c['B']:,.0f} | {c['I+W']:,.0f} | {c['I+W'] / c['B']:.3f}x" if c
              else "- | - | -")
        lines.append(f"| {model} | {s} | {ci} | {t['B'] * 1e6:,.0f} | {t['I+W'] * 1e6:,.0f} "
                     f"| {t['I+W'] / t['B']:.3f}x |")
        tot[model].update({"tB": t["B"], "tIW": t["I+W"],
                           **({"cB": c["B"], "cIW": c["I+W"]} if c else {})})
    for model, t in tot.items():
        ci = (f"{t['cB']:,.0f} | {t['cIW']:,.0f} | {t['cIW'] / t['cB']:.3f}x" if t["cB"]
              else "- | - | -")
        lines.append(f"| {model} | all | {ci} | {t['tB'] * 1e6:,.0f} | {t['tIW'] * 1e6:,.0f} "
                     f"| {t['tIW'] / t['tB']:.3f}x |")
    lines += ["", "Committed figures (tests/test_instruction_counts.py reads them):", "",
              "```json", json.dumps({"opcodes_per_action": py["per_action"],
                                     "parts": py["parts"]}, indent=1), "```", ""]
    return "\n".join(lines)


def committed(path: pathlib.Path = OUT) -> dict:
    m = re.search(r"```json\n(.*?)\n```", path.read_text(), re.S)
    return json.loads(m.group(1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], int(argv[2]), int(argv[3]), argv[4])
        return 0
    ap = argparse.ArgumentParser(prog="instruction_counts", description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama:debug", "gpt"])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4, help="micro-batches per callgrind region")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per stage")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        py = python_ops(pathlib.Path(tmp))
    print(f"python: {py['per_action']} opcodes per action {py['parts']}", flush=True)
    counts = None if a.no_callgrind else split_counts(a.models, a.stages, a.reps)
    times = split_times(a.models, a.stages, a.rounds)
    text = render(py, counts, times, argv, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    pathlib.Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
