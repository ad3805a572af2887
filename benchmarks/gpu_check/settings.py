"""The sizes of one GPU run, and of the dry run on the CPU (same code, tiny sizes).

A section gets these as a JSON dict (it runs in its own process). Time boxes are seconds
per section and add up to less than TOTAL_S, so every section starts even when each one
before it runs to its box: a lent GPU's minutes go to one whole run, never to a run whose
last sections were skipped (`boxes_line` says the sum; tests/test_gpu_check.py holds it).
The exactness sections come first, the speed ones after: a section cut at its box costs
a figure, not a verdict.
"""
from __future__ import annotations

TOTAL_S = 480  # the whole check stays under 8 minutes on one GPU

GPU = {
    "device": "cuda",
    # a, b: the small model, exactness
    "small_model": "llama:debug",
    "grid": [2, 2, 2],  # D, S, M
    "ref_iterations": 5,
    "worker_iterations": 6,
    "kill": "0:1@2",
    "rejoin": "0:1@4",
    "worker_precisions": ["fp32"],
    # b: keyed randomness (examples/dropout_lm.py, 4 blocks) under activation checkpointing,
    # in fp32 and in bf16 (autocast: the recomputation under the same key and precision),
    # each against the reference in its precision on the same device (CUDA's draws are
    # not the CPU's: a dropout model compares on one device only)
    "dropout_model": "examples.dropout_lm:DropoutGPT?split=emb,blocks.0,blocks.1,blocks.2,blocks.3,norm,head",
    "randomness_runs": [["fp32", "full"], ["bf16", "full"]],
    # c, d: the big model, speed
    "big_model": "llama:1b",
    "big_seq_len": 2048,
    "big_micro_batch": 2,
    "big_stages": 2,
    "profile_repeats": 3,
    "rate_microbatches": 4,  # per optimizer step
    "rate_steps": 3,  # timed steps, after one warm-up step
    "split_repeats": 5,
    "snapshot_takes": 3,
    # seconds; the order the sections run in (the exactness ones first)
    "boxes": {"machine": 15, "reference": 40, "workers": 70, "randomness": 110, "replay": 60,
              "profile": 50, "rates": 50, "split": 40, "snapshot": 30},
}
assert sum(GPU["boxes"].values()) < TOTAL_S, "every section must start: the boxes fit the total"

# the dry run: the same sections, boxes and comparisons, on the CPU with tiny sizes
DRY = dict(GPU, device="cpu", worker_iterations=4, kill="0:1@1", rejoin="0:1@2",
           randomness_runs=[["fp32", "full"], ["bf16", "full"]],
           big_model="llama:debug", big_seq_len=32, big_micro_batch=2, profile_repeats=1,
           rate_microbatches=2, rate_steps=1, split_repeats=1, snapshot_takes=3,
           ref_iterations=3)


def boxes_line(st: dict, names: list[str]) -> str:
    """The time boxes of the sections that run, and their sum against the total."""
    boxes = st["boxes"]
    return (", ".join(f"{n} {boxes[n]} s" for n in names)
            + f": {sum(boxes[n] for n in names)} s of the run's {TOTAL_S} s")


def settings(dry_run: bool, peak_tflops: float | None = None) -> dict:
    s = dict(DRY if dry_run else GPU)
    s["dry_run"], s["peak_tflops"] = dry_run, peak_tflops
    return s
