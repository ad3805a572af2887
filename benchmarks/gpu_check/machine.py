"""Section e (the machine) and what MFU is measured against.

Peak dense bf16 tensor-core TFLOPS from NVIDIA's datasheets (without 2:4 sparsity, which
the datasheets' headline figures include and training does not use). The name is
torch.cuda.get_device_name's; the more specific pattern comes first (an H100 PCIe's name
also contains "H100").
"""
from __future__ import annotations

import platform
import subprocess
from typing import Optional

import torch

PEAK_BF16_TFLOPS = [  # (substring of the device name, peak)
    ("H200 NVL", 835.0),
    ("H200", 989.0),  # H200 SXM: the H100 SXM's compute, more and faster memory
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # H100 SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
]


def peak_tflops(name: str) -> Optional[float]:
    """The peak dense bf16 TFLOPS of the GPU called `name`; None for one not in the table."""
    for pattern, peak in PEAK_BF16_TFLOPS:
        if pattern.lower() in name.lower():
            return peak
    return None


def _nvidia_smi() -> str:
    """Driver version and GPU as nvidia-smi reports them (a line saying why not, else)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi not usable here ({type(exc).__name__})"
    return out.stdout.strip() or (out.stderr.strip().splitlines() or ["no output"])[-1]


def machine(settings: dict) -> dict:
    """What ran the check: GPU model, driver, torch and CUDA versions, the peak used."""
    dev = torch.device(settings["device"])
    rows = [("host", f"{platform.node()} ({platform.machine()}, {platform.system()})"),
            ("torch", torch.__version__),
            ("CUDA (torch built with)", str(torch.version.cuda)),
            ("nvidia-smi (name, driver, memory)", _nvidia_smi())]
    numbers = {"torch_threads": float(torch.get_num_threads())}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name = torch.cuda.get_device_name(dev)
        rows += [("GPU", name), ("GPU memory", f"{props.total_memory / 2**30:.1f} GiB"),
                 ("compute capability", f"{props.major}.{props.minor}"),
                 ("GPUs visible", str(torch.cuda.device_count())),
                 ("cuDNN", str(torch.backends.cudnn.version()))]
        numbers["gpu_memory_gib"] = props.total_memory / 2**30
    else:
        name = f"CPU ({platform.processor() or platform.machine()}), dry run"
        rows.append(("GPU", "none: dry run on the CPU"))
    peak = settings.get("peak_tflops") or peak_tflops(name)
    rows.append(("peak dense bf16 TFLOPS (MFU's denominator)",
                 f"{peak:g}" + (" (--peak-tflops)" if settings.get("peak_tflops") else "")
                 if peak else "unknown: not in PEAK_BF16_TFLOPS, pass --peak-tflops"))
    if peak:
        numbers["peak_tflops"] = peak
    lines = ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows]
    return {"lines": lines, "numbers": numbers}
