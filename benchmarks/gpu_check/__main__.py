"""`scripts/gpu_check.sh [--dry-run] [--out PATH] [--only a,b] [--peak-tflops X]`: the
CUDA path on one GPU, in under 8 minutes, into benchmarks/results/gpu.md (docs/gpu.md).

Sections run one after another, each in its own process (benchmarks/gpu_check/section.py)
killed at its time box; the boxes add up to less than settings.TOTAL_S, so every section
starts (and none would start past the total).
--dry-run: the same on the CPU with tiny sizes, into a temp file (never gpu.md), so that
every code path but the CUDA calls runs in the tests (tests/test_gpu_check.py).
Exit: 0 all sections ran and passed, 1 one failed, 2 bad input (one line).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_check.report import header, render
from benchmarks.gpu_check.section import SECTIONS
from benchmarks.gpu_check.settings import TOTAL_S, boxes_line, settings

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "gpu.md"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, not argparse's usage block
        print(f"gpu_check: {message}", file=sys.stderr)
        sys.exit(2)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else "no output"


def run_section(name: str, st: dict, box: float, log) -> dict:
    """The section in a child process of its own session (its workers die with it)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        out = os.path.join(tmp, "result.json")
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.gpu_check.section", name, json.dumps(st), out],
            # TMPDIR: the section's temp files go in ours, removed even when it is killed
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=box)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this Popen started
            text, _ = proc.communicate()
            res = {"status": "timed out",
                   "error": f"past its {box:.0f} s box; last output: {_last_line(text)}"}
        else:
            if proc.returncode == 0 and os.path.exists(out):
                with open(out) as fh:
                    res = {"status": "ok", **json.load(fh)}
            else:
                res = {"status": "failed", "error": _last_line(text)}
    log.write(f"==== {name} ====\n{text}\n")
    log.flush()
    return {**res, "seconds": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = _Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU with tiny sizes (a test that every path but CUDA runs)")
    ap.add_argument("--out", help=f"report path (default: {RESULT.relative_to(ROOT)}; "
                                  "dry run: a temp file)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--peak-tflops", type=float,
                    help="the GPU's peak dense bf16 TFLOPS (for a GPU not in the table)")
    a = ap.parse_args(argv)
    names = a.only.split(",") if a.only else list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        ap.error(f"--only: no section {unknown[0]!r} (sections: {', '.join(SECTIONS)})")
    if a.peak_tflops is not None and not a.peak_tflops > 0:
        ap.error(f"--peak-tflops must be positive, not {a.peak_tflops:g}")
    out = Path(a.out) if a.out else (
        Path(tempfile.mkstemp(prefix="gpu_check_", suffix=".md")[1]) if a.dry_run else RESULT)
    if a.dry_run and out.resolve() == RESULT.resolve():
        ap.error(f"--dry-run never writes {RESULT.relative_to(ROOT)} (the GPU's results)")
    if not a.dry_run:
        import torch
        if not torch.cuda.is_available():
            ap.error("no CUDA device here: run it on a GPU machine, or pass --dry-run")
    st = settings(a.dry_run, a.peak_tflops)
    boxes = boxes_line(st, names)
    head = header(st, argv, datetime.datetime.now(datetime.timezone.utc), boxes)
    print(f"gpu_check: time boxes {boxes}", flush=True)
    t0 = time.monotonic()
    results: dict = {}
    log_path = Path(f"{out}.log")  # each section's own output, for when one fails
    with open(log_path, "w") as log:
        for name in names:
            left = TOTAL_S - (time.monotonic() - t0)
            box = min(st["boxes"][name], left)
            if box < 10:
                results[name] = {"status": "skipped", "seconds": 0.0,
                                 "error": f"not started: the run's {TOTAL_S} s were spent"}
            else:
                print(f"gpu_check: {SECTIONS[name][0]}. {name} (box {box:.0f} s) ...",
                      flush=True)
                results[name] = run_section(name, st, box, log)
            res = results[name]
            print(f"gpu_check: {name}: {res['status']}"
                  + (f" ({res['error']})" if "error" in res else "")
                  + (" -- check FAILED" if res.get("ok") is False else "")
                  + f" in {res['seconds']:.1f} s", flush=True)
            out.write_text(render(head, results, None))
    total = time.monotonic() - t0
    out.write_text(render(head, results, total))
    print(f"gpu_check: total {total:.1f} s; wrote {out} (section output in {log_path})",
          flush=True)
    bad = [n for n, r in results.items() if r["status"] != "ok" or r.get("ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
