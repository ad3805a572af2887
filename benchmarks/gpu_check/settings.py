"""The sizes of one GPU run, and of the dry run on the CPU (same code, tiny sizes).

A section gets these as a JSON dict (it runs in its own process). Time boxes are seconds
per section; the whole run also stops starting sections past TOTAL_S (see __main__).
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
    "worker_precisions": ["fp32", "bf16"],
    # b: keyed randomness (examples/dropout_lm.py, 4 blocks) under activation checkpointing
    "dropout_model": "examples.dropout_lm:DropoutGPT?split=emb,blocks.0,blocks.1,blocks.2,blocks.3,norm,head",
    "checkpointing": ["none", "full"],
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
    "boxes": {"machine": 30, "reference": 90, "workers": 150, "randomness": 120, "replay": 90,
              "profile": 150, "rates": 150, "split": 90, "snapshot": 90},
}

# the dry run's b runs fp32 only: bf16 is the same code with another flag (a runs both)
DRY = dict(GPU, device="cpu", worker_iterations=4, kill="0:1@1", rejoin="0:1@2",
           worker_precisions=["fp32"], checkpointing=["full"],
           big_model="llama:debug", big_seq_len=32, big_micro_batch=2, profile_repeats=1,
           rate_microbatches=2, rate_steps=1, split_repeats=1, snapshot_takes=3,
           ref_iterations=3)


def settings(dry_run: bool, peak_tflops: float | None = None) -> dict:
    s = dict(DRY if dry_run else GPU)
    s["dry_run"], s["peak_tflops"] = dry_run, peak_tflops
    return s
