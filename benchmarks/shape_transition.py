"""What a change of shape costs at run time: the issue's run (a 2x4 GPT that loses five of
its eight workers for good, `--snapshot-every 2`) at growing model widths, on real worker
processes. Every worker logs the seconds its entry into a shaped version took (building
its new stage, receiving its parameters and AdamW state by name, the commit): the
`changed shape ... in X s` lines of reshape.py. Printed and saved as a markdown table.

    PYTHONPATH=. python benchmarks/shape_transition.py [--widths 32,128,256] [--out FILE]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = ["-d", "2", "-s", "4", "-m", "4", "--layers", "4", "--iterations", "12",
        "--snapshot-every", "2", "--kill", "0:0@2", "--kill", "0:1@3", "--kill", "1:2@4",
        "--kill", "0:3@5", "--kill", "1:3@6"]
LINE = re.compile(r"changed shape to (\d+) stages .* from (.+?) in ([0-9.]+) s")


def params_of(width: int, layers: int = 4, vocab: int = 64, seq: int = 16) -> int:
    """The GPT's parameter count (embeddings, blocks of attention + 4x MLP, head)."""
    block = 4 * width * width + 4 * width + 2 * (4 * width * width) + 5 * width + 4 * width
    return vocab * width + seq * width + layers * block + 2 * width + width * vocab


def run(width: int, heads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="shape-transition-") as tmp:
        summary = os.path.join(tmp, "s.json")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *GRID,
                            "--d-model", str(width), "--heads", str(heads),
                            "--summary", summary, "--run-dir", os.path.join(tmp, "run")],
                           capture_output=True, text=True, cwd=ROOT, timeout=600,
                           env={**os.environ, "PYTHONPATH": ROOT})
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"width {width}: recycle train exited {r.returncode}: "
                             f"{r.stderr.strip().splitlines()[-1:]}")
        got = json.load(open(summary))
        entries = []
        for path in glob.glob(os.path.join(tmp, "run", "worker-*.log")):
            for line in open(path):
                m = LINE.search(line)
                if m:
                    entries.append((int(m.group(1)), m.group(2), float(m.group(3))))
    return {"width": width, "entries": entries, "wall": wall,
            "pauses": got["elastic"]["pauses"],
            "shapes": got["elastic"].get("shape_changes", 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="32,128,256")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                   "shape_transition.md"))
    a = ap.parse_args()
    rows = []
    for w in [int(x) for x in a.widths.split(",")]:
        res = run(w, heads=max(2, w // 32))
        secs = [s for _, _, s in res["entries"]]
        by_source = {}
        for _, src, s in res["entries"]:
            by_source.setdefault(src, []).append(s)
        detail = "; ".join(f"{src}: {len(v)} entries, max {max(v):.3f} s"
                           for src, v in sorted(by_source.items()))
        n = params_of(w)
        rows.append(f"| {w} | {n / 1e6:.2f} M ({n * 12 / 2**20:.1f} MiB with AdamW) | "
                    f"{res['shapes']} | {len(secs)} | {statistics.median(secs):.3f} | "
                    f"{max(secs):.3f} | {detail} | {res['pauses']} | {res['wall']:.0f} s |")
        print(rows[-1], flush=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT).stdout.strip()
    text = "\n".join([
        "# What a change of shape costs at run time",
        "",
        f"Made by `PYTHONPATH=. python benchmarks/shape_transition.py --widths {a.widths}` at "
        f"commit {head} ({time.strftime('%Y-%m-%d')}, 2 shared CPU cores, gloo).",
        "",
        "The issue's run: `recycle train " + " ".join(GRID) + " --d-model W`: five of eight "
        "workers SIGKILLed for good, the pipeline cut from 4 stages to fewer. Per worker entry "
        "into a shaped version (reshape.py's log line): build the new stage, receive its "
        "parameters and AdamW state by name from the old stages' holders (or their "
        "snapshots), commit. Not counted here: detection and the plan (the coordinator's "
        "event path), the iteration in flight, and a roll-back's iterations trained again.",
        "",
        "| d_model | parameters (bytes moved at most) | shape changes | entries | median s | "
        "max s | by source | pauses | run wall time |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
        *rows, ""])
    with open(a.out, "w") as f:
        f.write(text)
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
