"""torch.distributed.pipelining's own schedule orders as pipelining CSV, for the planner
benchmark's "torch orders" rows (planner/bench/quality.py reads the files; planner/ has no torch).

  python benchmarks/torch_orders.py        # writes benchmarks/torch_orders/*.csv

Each schedule class is built with a stub stage (no process group: the order of every rank
is computed in the constructor) and one stage per rank: Schedule1F1B and ScheduleGPipe (fused backward B),
ScheduleInterleavedZeroBubble with one stage per rank (ZB1P: ZB-H1-like, I/W split).
Uses the private `pipeline_order` attribute; checked with torch 2.13.0.
"""
import os
import sys

import torch
from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleavedZeroBubble)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch_orders")
SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "zb1p": ScheduleInterleavedZeroBubble}
SHAPES = [(4, 8), (4, 16), (8, 16)]  # (S, M) of the benchmark rows


class StubStage:
    """What the schedule constructors read from a stage."""

    def __init__(self, S: int, rank: int):
        self.num_stages, self.group_size, self.group_rank = S, S, rank
        self.stage_index = rank
        self.is_first, self.is_last = rank == 0, rank == S - 1
        self.stage_index_to_group_rank = None
        self.submod = torch.nn.Identity()


def torch_order(name: str, S: int, M: int) -> str:
    """The compute-only CSV text (one row per rank) of torch's schedule `name` for S
    stages and M micro-batches, as its constructor orders them (`pipeline_order`, private);
    bubbles (None) and the REDUCE_GRAD it appends are dropped."""
    cls = SCHEDULES[name]
    stage = StubStage(S, 0)
    sched = cls([stage] if cls is ScheduleInterleavedZeroBubble else stage, M,
                loss_fn=lambda out, tgt: out)
    rows = [[a for a in sched.pipeline_order[r] if a is not None and a.is_compute_op]
            for r in range(S)]
    fs = sorted(a.microbatch_index for a in rows[S - 1] if a.computation_type == "F")
    if name == "1f1b" and fs == list(range(1, M + 1)):
        # torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards
        # 1..M (its warm-up is empty, and the steady loop increments before use); the
        # runtime's own loop runs 0..M-1, so that is what the row says.
        rows[S - 1] = [a._replace(microbatch_index=a.microbatch_index - 1)
                       if a.computation_type == "F" else a for a in rows[S - 1]]
    return "".join(",".join(map(str, row)) + "\n" for row in rows)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for name in SCHEDULES:
        for S, M in SHAPES:
            path = os.path.join(OUT, f"{name}_S{S}_M{M}.csv")
            with open(path, "w", newline="") as fh:
                fh.write(torch_order(name, S, M))
            print(path)
    print(f"torch {torch.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
