"""What the live page costs the service: per open page, one snapshot per second (and one
per change of the job); per change, the history re-read; per plan version, the plan.

    PYTHONPATH=. .venv/bin/python benchmarks/page_cost.py [--repeat 200]

For each grid (4x4, 64x16 with 3 failures and a slow worker): the time to build and
JSON-encode one snapshot (api/page/view.py job_view), to re-read the history (events and
versions), and the sizes of a snapshot and of the plan the page fetches once per version.
Writes benchmarks/results/page_cost.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from api_support import ThreadServer, admin_headers, spec  # noqa: E402


def measure(server, admin, D: int, S: int, M: int, repeat: int) -> dict:
    from api.page.view import history, job_view
    job_id = admin.post("/v1/jobs?max_failures=0", json=spec(D=D, S=S, M=M)).json()["id"]
    for i, (d, s) in enumerate([(D - 1, 0), (D // 2, S - 1), (1, S // 2)]):
        admin.post(f"/v1/jobs/{job_id}/events", json={"event_id": f"f{i}", "kind": "failure",
                                                      "replica": d, "stage": s})
    admin.post(f"/v1/jobs/{job_id}/speeds", json={"event_id": "slow", "replica": 0,
                                                  "stage": 1, "speed": 0.5})
    svc = server.service
    job = svc.jobs[job_id]
    hist = history(svc.store, job_id)
    t0 = time.perf_counter()
    for _ in range(repeat):
        body = json.dumps(job_view(svc, job, hist), separators=(",", ":"))
    snap = (time.perf_counter() - t0) / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        history(svc.store, job_id)
    hist_s = (time.perf_counter() - t0) / repeat
    return {"grid": f"{D}x{S}, M={M}", "snapshot_ms": snap * 1e3, "history_ms": hist_s * 1e3,
            "snapshot_kib": len(body) / 1024, "plan_kib": len(job.plan_bytes) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/page_cost.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            ThreadServer(os.path.join(tmp, "s.db"), heartbeat_timeout_s=600,
                         precompute_failures=0) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=60) as admin:
        rows = [measure(server, admin, 4, 4, 8, args.repeat),
                measure(server, admin, 64, 16, 4, args.repeat)]
    lines = ["# What the live page costs the service", "",
             "Command: `PYTHONPATH=. .venv/bin/python benchmarks/" + Path(__file__).name
             + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "") + "`",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared, noisy), "
             f"Python {platform.python_version()}", "",
             "Per open page the service builds one snapshot a second (and one per change); "
             "the history is re-read on a change (or every 5 s); the plan is fetched once "
             "per version.", "",
             "| grid | snapshot (build + JSON) | history re-read | snapshot size | plan size |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['grid']} | {r['snapshot_ms']:.2f} ms | {r['history_ms']:.2f} ms "
                     f"| {r['snapshot_kib']:.1f} KiB | {r['plan_kib']:.0f} KiB |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
