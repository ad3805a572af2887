"""One section of the check, in a process of its own (a CUDA error, an out-of-memory or a
hang then ends that section only; the runner kills it at its time box):

    python -m benchmarks.gpu_check.section NAME SETTINGS_JSON RESULT_JSON

writes {"lines": [markdown], "numbers": {...}, "ok": bool} to RESULT_JSON, or exits 1
with the error's traceback on stderr (the runner reports its last line).
"""
from __future__ import annotations

import json
import sys

# name -> (the letter, title, "module:function"), in the order they run
SECTIONS = {
    "machine": ("e", "The machine", "machine:machine"),
    "reference": ("a", "The one-process reference on the device against the CPU",
                  "exact:reference"),
    "workers": ("b", "Workers on the device: a 2x2 grid, a SIGKILL and a rejoin",
                "exact:workers"),
    "randomness": ("b", "Dropout and activation checkpointing on the device, through a "
                   "SIGKILL and a rejoin", "exact:randomness"),
    "replay": ("b", "A stage lost whole, replayed from the boundary logs on the device",
               "exact:replay"),
    "profile": ("c", "`recycle profile` of the big model on the device", "speed:profile"),
    "rates": ("c", "Tokens/s and MFU: the whole model and each stage (bf16)", "speed:rates"),
    "split": ("d", "The I/W split's cost over fused B on the device", "speed:split"),
    "snapshot": ("d", "The peer-memory snapshot's copy", "speed:snapshot"),
}


def main(argv: list[str]) -> int:
    name, settings, out = argv
    module, fn = SECTIONS[name][2].split(":")
    import importlib

    import torch
    st = json.loads(settings)
    if st["dry_run"]:
        torch.set_num_threads(1)  # a shared CPU: stay on one core
    result = getattr(importlib.import_module(f"benchmarks.gpu_check.{module}"), fn)(st)
    with open(out, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
