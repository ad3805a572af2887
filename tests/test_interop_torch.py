"""Exported plans in torch.distributed.pipelining's own code (issue 12, items 1, 2 and 4).

`_PipelineScheduleRuntime._load_csv` is private torch API (checked with torch 2.13.0): it
validates a compute-only CSV with torch's `_validate_schedule` and lowers it with torch's
own passes (`_add_send_recv`, and `_defer_recv_ops` with `defer_pp_recv=True`). A stub stage
(no process group) is all it needs, so every back-end's export goes through it in
milliseconds; one S=2 gloo run then executes exported plans in torch's runtime next to
Schedule1F1B.
"""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch.distributed.pipelining.schedules import (  # noqa: E402
    _PipelineScheduleRuntime, _simulate_comms_compute)

from planner.solvers.backends import SolveOptions, solve  # noqa: E402
from planner.interop.csv_import import import_csv  # noqa: E402
from planner.interop.pipelining_csv import export_csv  # noqa: E402
from planner.job import JobSpec  # noqa: E402
from planner.plan import Mode  # noqa: E402
from planner.validate import validate  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/ is not a package on the installed path
from benchmarks.torch_orders import StubStage  # noqa: E402  (what a schedule reads from a stage)


def torch_lowered(csv_text: str, S: int, M: int, tmp_path, defer: bool) -> dict:
    path = tmp_path / f"plan_{defer}.csv"
    path.write_text(csv_text)
    sched = _PipelineScheduleRuntime([StubStage(S, 0)], M, loss_fn=lambda out, tgt: out,
                                     defer_pp_recv=defer)
    sched._load_csv(str(path))  # torch's validation and lowering; raises on a bad schedule
    sched._dump_csv(str(tmp_path / f"comms_{defer}.csv"), "compute_comms")
    lowered = sched.pipeline_order_with_comms
    # torch's own simulator (which knows compute and p2p, not FSDP's UNSHARD, RESHARD,
    # REDUCE_GRAD) raises if the lowered schedule deadlocks.
    _simulate_comms_compute({r: [a for a in acts if "SHARD" not in str(a) and "REDUCE" not in str(a)]
                             for r, acts in lowered.items()}, lambda s: s, S)
    return {r: [str(a) for a in acts] for r, acts in lowered.items()}


def ops_of(row: list[str], stage: int, op: str) -> list[int]:
    pre = f"{stage}{op}"
    return [int(a[len(pre):]) for a in row if a.startswith(pre) and a[len(pre):].isdigit()]


CASES = [  # (name, job, failed, solver, mode, --csv-replica)
    ("greedy", JobSpec.uniform(1, 4, 8), [], "greedy", Mode(), None),
    ("1f1b", JobSpec.uniform(1, 4, 8), [], "1f1b", Mode(), None),
    ("cpsat", JobSpec.uniform(1, 4, 8), [], "cpsat", Mode(), None),
    ("milp", JobSpec.uniform(1, 4, 4), [], "milp", Mode(), None),
    ("no-split", JobSpec.uniform(1, 4, 8), [], "greedy", Mode(split_backward=False), None),
    ("sync", JobSpec.uniform(1, 4, 8), [], "greedy", Mode(staggered=False), None),
    # Under a failure, a replica that still runs only its own micro-batches exports.
    ("failure", JobSpec.uniform(4, 3, 2), [(1, 2)], "greedy", Mode(), None),
    ("tight memory", JobSpec.uniform(1, 4, 8, capacity=16), [], "greedy", Mode(), None),
]


@pytest.mark.parametrize("name,job,failed,solver,mode,replica", CASES, ids=[c[0] for c in CASES])
def test_every_backend_export_loads_in_torch(tmp_path, name, job, failed, solver, mode, replica):
    plan = solve(job, failed, solver, mode, SolveOptions(time_limit=2, num_workers=1))
    text = export_csv(plan, replica)
    S, M = job.stages, job.microbatches
    for defer in (False, True):
        lowered = torch_lowered(text, S, M, tmp_path, defer)
        # Torch indexes losses by position: the last stage runs F in micro-batch order.
        assert ops_of(lowered[S - 1], S - 1, "F") == list(range(M))
        # Untagged p2p is matched first in, first out: each receiver takes micro-batches in
        # the order its neighbour sends them.
        for s in range(S - 1):
            assert ops_of(lowered[s], s, "SEND_F") == ops_of(lowered[s + 1], s + 1, "RECV_F")
            assert ops_of(lowered[s + 1], s + 1, "SEND_B") == ops_of(lowered[s], s, "RECV_B")
        # torch's own compute+comms dump imports back to the same plan as our CSV.
        one = job.model_copy(update={"replicas": 1, "speed": None})
        ours = import_csv(text, one, staggered=mode.staggered)
        theirs = import_csv((tmp_path / f"comms_{defer}.csv").read_text(), one,
                            staggered=mode.staggered)
        assert theirs.workers == ours.workers and validate(ours) == []


def test_milp_plan_needs_the_relabeling():
    """The MILP's optimal order for 1x4x4 runs micro-batches in different orders on
    different stages: exported as is, the last stage's F order is not 0..M-1, and stages
    disagree (what broke torch's runtime and, with defer_pp_recv, the loss)."""
    job = JobSpec.uniform(1, 4, 4)
    plan = solve(job, [], "milp")
    raw = [[a.microbatch for a in w.actions if a.op == "F"] for w in plan.workers]
    assert raw[-1] != sorted(raw[-1]) or len({tuple(r) for r in raw}) > 1
    rows = [line.split(",") for line in export_csv(plan).splitlines()]
    assert all(ops_of(row, s, "F") == list(range(4)) for s, row in enumerate(rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.hard_timeout(150)
def test_exported_plans_run_in_torch_runtime_like_schedule_1f1b(tmp_path):
    """S=2 on gloo: exported greedy, MILP and fused-backward plans in torch's
    _PipelineScheduleRuntime (with and without defer_pp_recv) give Schedule1F1B's losses
    and gradients bit for bit."""
    job, M = JobSpec.uniform(1, 2, 4), 4
    csvs = []
    for name, solver, mode in (("greedy", "greedy", Mode()), ("milp", "milp", Mode()),
                               ("nosplit", "greedy", Mode(split_backward=False))):
        path = tmp_path / f"{name}.csv"
        path.write_text(export_csv(solve(job, [], solver, mode)))
        csvs.append(str(path))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "interop", "gloo_pipeline.py"),
                             str(tmp_path), str(_free_port()), str(M), *csvs], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        ref = res.pop("1f1b")
        assert len(res) == 6
        for key, got in res.items():
            assert got["grads"] == ref["grads"], f"rank {rank}, {key}: gradients differ"
            assert got["losses"] == ref["losses"], f"rank {rank}, {key}: losses differ"
    assert len(json.loads((tmp_path / "rank1.json").read_text())["1f1b"]["losses"]) == M


def test_committed_torch_orders_are_torchs_and_greedy_is_no_worse():
    """benchmarks/torch_orders/*.csv (the planner benchmark's torch rows) are what this
    torch's schedule classes order now; greedy's period is no worse than any of them that
    fits in memory, on every benchmark case, except ZB1P where memory does not bind
    (S=8, M=16, 10 slots: 567 against 565, see docs/planner.md)."""
    import importlib.util

    from planner.bench.quality import TORCH_CASES
    from planner.interop.csv_import import import_csv
    from planner.validate import validate

    spec = importlib.util.spec_from_file_location(
        "torch_orders", os.path.join(os.path.dirname(HERE), "benchmarks", "torch_orders.py"))
    orders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(orders)
    for S, M, slots in TORCH_CASES:
        job = JobSpec.uniform(1, S, M, capacity=4 * slots)
        greedy = solve(job, [], "greedy").metrics.period
        for name in orders.SCHEDULES:
            text = orders.torch_order(name, S, M)
            with open(os.path.join(orders.OUT, f"{name}_S{S}_M{M}.csv")) as fh:
                assert fh.read() == text, f"{name} S={S} M={M}: rerun benchmarks/torch_orders.py"
            plan = import_csv(text, job)
            if not validate(plan) and (name != "zb1p" or slots <= S):
                assert greedy <= plan.metrics.period, (name, S, M, slots)
