"""benchmarks/results/gpu.md from the sections' results, rewritten after every section (a
run cut short still leaves what it measured)."""
from __future__ import annotations

import datetime
import shlex

from benchmarks.gpu_check.section import SECTIONS


def header(st: dict, argv: list[str], started: datetime.datetime, boxes: str) -> list[str]:
    mode = ("dry run on the CPU (tiny sizes, device cpu where the check asks cuda: every "
            "code path but the CUDA calls)" if st["dry_run"] else "one NVIDIA GPU")
    return ["# ReCycle on one GPU: the CUDA path, run for real", "",
            f"`scripts/gpu_check.sh {' '.join(shlex.quote(a) for a in argv)}` "
            f"(benchmarks/gpu_check/), started {started:%Y-%m-%d %H:%M} UTC, {mode}. "
            "Each section runs in its own process under a time box; a failed one says its "
            "error's last line and the others still run. docs/gpu.md says what each "
            "measures.", "", f"Time boxes: {boxes}.", ""]


def section(name: str, res: dict) -> list[str]:
    letter, title, _ = SECTIONS[name]
    status = res["status"]
    if status == "ok" and res.get("ok") is False:
        status = "ok, check FAILED"  # it ran; the device disagrees beyond the tolerance
    out = [f"## {letter}. {title} ({status}, {res['seconds']:.1f} s)", ""]
    if res["status"] != "ok":
        out.append(f"**{res['status'].upper()}**: {res['error']}")
    else:
        out += res["lines"]
    return out + [""]


def render(head: list[str], results: dict, total_s: float | None) -> str:
    lines = list(head)
    for name, res in results.items():
        lines += section(name, res)
    if total_s is not None:
        ran = sum(r["status"] == "ok" for r in results.values())
        lines.append(f"Total: {total_s:.1f} s, {ran} of {len(results)} sections ran to the end.")
    return "\n".join(lines) + "\n"
