"""Run timing-dependent tests many times with every core busy, and count the passes.

    .venv/bin/python scripts/repeat_under_load.py --times 20 \
        tests/test_executor_runtime.py::test_rejoin_keeps_the_worker_out_until_its_iteration ...

A test of kills, rejoins or stragglers must pass every time, also on a loaded machine: this
starts one busy loop per core (a CPU hog), runs each test `--times` times in one Python
process per test (pytest.main in a loop: no interpreter and torch import per run), prints
a table of passes, and stops the hogs. Exit 1 if any run failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOP = """
import sys, pytest
n, test, ok = int(sys.argv[1]), sys.argv[2], 0
for i in range(n):
    rc = pytest.main(["-q", "-x", "-p", "no:cacheprovider", test])
    ok += rc == 0
    print(f"@@ run {i + 1}: {'pass' if rc == 0 else 'FAIL'}", flush=True)
print(f"@@ {ok}/{n}", flush=True)
"""


def hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tests", nargs="+", help="pytest node ids")
    ap.add_argument("--times", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2,
                    help="busy loops running meanwhile (default: one per core)")
    ap.add_argument("--log", default=None, help="append every run's output here")
    args = ap.parse_args()
    if args.times < 1 or args.hogs < 0:
        print("--times must be >= 1 and --hogs >= 0", file=sys.stderr)
        return 2
    busy = hogs(args.hogs)
    rows = []
    try:
        for test in args.tests:
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "-c", LOOP, str(args.times), test], cwd=ROOT,
                                 capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=ROOT))
            if args.log:
                with open(args.log, "a") as f:
                    f.write(out.stdout + out.stderr)
            last = [line for line in out.stdout.splitlines() if line.startswith("@@ ") and "/" in line]
            passed = int(last[-1].split()[1].split("/")[0]) if last else 0
            rows.append((test, passed, time.monotonic() - t0))
            print(f"{passed:>3}/{args.times}  {time.monotonic() - t0:6.0f} s  {test}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"\n{args.times} runs each with {args.hogs} busy loops on {os.cpu_count()} cores:")
    for test, passed, secs in rows:
        print(f"| {test} | {passed}/{args.times} | {secs:.0f} s |")
    return 0 if all(p == args.times for _, p, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
