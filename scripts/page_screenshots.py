"""Screenshots of the live cluster page for docs/: a 4x4 job and a 64x16 job, each with
failures (a worker's own report: failed; an operator's: fenced), a slow worker and a
rejoining one, against a real `recycle serve` and Debian's headless chromium.

    PYTHONPATH=. .venv/bin/python scripts/page_screenshots.py [--out docs]
"""
from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from api_support import ADMIN, ProcServer, admin_headers, spec, token_client  # noqa: E402
from browser_support import chromium, console_errors  # noqa: E402


def stage_job(admin: httpx.Client, url: str, D: int, S: int, M: int, failed, fenced, slow,
              rejoining, max_failures: int):
    r = admin.post(f"/v1/jobs?max_failures={max_failures}", json=spec(D=D, S=S, M=M))
    r.raise_for_status()
    job, token = r.json()["id"], r.json()["token"]
    worker = token_client(url, token)
    for d in range(D):
        for s in range(S):
            worker.post(f"/v1/jobs/{job}/heartbeats", json={"replica": d, "stage": s,
                                                            "iteration": 0}).raise_for_status()
    n = 0
    for client, cells, body in ((worker, failed, {"kind": "failure",
                                                  "reason": "process exited (SIGKILL)"}),
                                (admin, fenced, {"kind": "failure",
                                                 "reason": "operator: draining the node"}),
                                (worker, rejoining, {"kind": "failure",
                                                     "reason": "process exited"})):
        for d, s in cells:
            n += 1
            client.post(f"/v1/jobs/{job}/events", json={"event_id": f"shot-{n}", "replica": d,
                                                        "stage": s, **body}).raise_for_status()
    for d, s, v in slow:
        n += 1
        admin.post(f"/v1/jobs/{job}/speeds", json={
            "event_id": f"shot-{n}", "replica": d, "stage": s, "speed": v,
            "reason": "thermal throttling"}).raise_for_status()
    for d, s in rejoining:
        n += 1
        worker.post(f"/v1/jobs/{job}/events", json={"event_id": f"shot-{n}", "kind": "recovery",
                                                    "replica": d, "stage": s}).raise_for_status()
    skip = {*failed, *fenced, *rejoining}

    def beat() -> None:  # fresh heartbeats just before a screenshot, as a live fleet sends
        for d in range(D):
            for s in range(S):
                if (d, s) not in skip:
                    worker.post(f"/v1/jobs/{job}/heartbeats",
                                json={"replica": d, "stage": s, "iteration": 1})
    return job, beat


def shoot(browser, url: str, staged, out: Path, width: int) -> None:
    job, beat = staged
    beat()
    browser.set_window_size(width, 1000)
    browser.get(f"{url}/jobs/{job}#token={ADMIN}")
    t0 = time.monotonic()
    while browser.execute_script("return document.body.dataset.version") is None:
        if time.monotonic() - t0 > 30:
            raise TimeoutError("page did not render")
        time.sleep(0.05)
    time.sleep(1.5)  # one more push: heartbeat ages, the Gantt chart
    # the whole page, not only the window: Chromium's DevTools protocol
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    out.write_bytes(base64.b64decode(shot["data"]))
    errors = console_errors(browser)
    if errors:
        raise RuntimeError(f"console errors: {errors}")
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs"))
    out = Path(ap.parse_args().out)
    with tempfile.TemporaryDirectory() as tmp:
        server = ProcServer(Path(tmp) / "service.db", "--solvers", "greedy",
                            "--heartbeat-timeout", "600").start()
        try:
            admin = httpx.Client(base_url=server.url, headers=admin_headers(), timeout=60)
            small = stage_job(admin, server.url, 4, 4, 8, failed=[(1, 2)], fenced=[(3, 0)],
                              slow=[(2, 1, 0.5)], rejoining=[(0, 3)], max_failures=2)
            big = stage_job(admin, server.url, 64, 16, 4,
                            failed=[(5, 3), (17, 8), (40, 0), (41, 12)], fenced=[(22, 11)],
                            slow=[(9, 5, 0.5), (50, 14, 0.7)], rejoining=[(30, 2)],
                            max_failures=1)
            with chromium() as browser:
                shoot(browser, server.url, small, out / "page_4x4.png", 1400)
                shoot(browser, server.url, big, out / "page_64x16.png", 1400)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
