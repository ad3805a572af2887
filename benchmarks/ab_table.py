"""The results table of an A/B benchmark: realised ms/iter per interleaved run, per variant."""
from __future__ import annotations

import statistics
from typing import Optional


def write_ab(title: str, cmd: str, description: str, label: str,
             res: dict[str, list[float]], out: Optional[str]) -> str:
    rounds = max(len(v) for v in res.values())
    lines = [f"# {title}", "", f"Command: `{cmd}`", "", description, "",
             f"| {label} | " + " | ".join(f"run {i + 1}" for i in range(rounds)) + " | median | best |",
             "| --- |" + " --- |" * (rounds + 2)]
    for k, v in res.items():
        lines.append(f"| {k} | " + " | ".join(f"{x:.1f}" for x in v)
                     + f" | {statistics.median(v):.1f} | {min(v):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text
