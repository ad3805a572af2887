"""ReCycle and torchft side by side: the same model, token data and kill schedule, in
interleaved rounds (the machine is shared and noisy), figures printed and saved.

    PYTHONPATH=. python -m benchmarks.peers.run [--rounds 3] [--out benchmarks/results/peers.md]

Each round runs, in a rotating order: ReCycle and torchft without failure, then each with
replica 1 SIGKILLed mid-iteration --kill-at (no restart). D replicas of S=1 (torchft:
DDP-style replica groups; ReCycle: `recycle train -s 1`), the project's GPT, token data
from `recycle data prepare --tokenizer bpe:4096` on the Python standard library's text.
Needs the optional extras: pip install 'recycle[peers,tokens]'.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.peers.runs import (HEARTBEAT_TIMEOUT_MS, JOIN_TIMEOUT_MS, PY, QUORUM_TICK_MS,
                                   ROOT, Setup, figures, recycle_run, torchft_run)

SYSTEMS = {"recycle": recycle_run, "torchft": torchft_run}


def token_data(path: str) -> str:
    """The benchmark's corpus: Python's own documentation (pydoc topics), licence and the
    json/email packages, BPE-tokenized (4096); prepared once."""
    if not os.path.exists(path):
        from executor.data.prepare import stdlib_dir
        lib = stdlib_dir()
        src = [os.path.join(lib, p) for p in ("pydoc_data", "LICENSE.txt", "json", "email")]
        subprocess.run([PY, "-m", "recycle.cli", "data", "prepare", *[p for p in src
                        if os.path.exists(p)], "--tokenizer", "bpe:4096", "--out", path],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", "-d", type=int, default=2)
    ap.add_argument("--microbatches", "-m", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=24)
    ap.add_argument("--kill-at", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "recycle-peers-bpe4096.bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "peers.md"))
    ap.add_argument("--render", metavar="PEERS.json", help="no runs: write the table again "
                    "from the raw data a run saved (with the flags that run had)")
    a = ap.parse_args()
    try:
        import torchft  # noqa: F401  (the replicas import it; fail here, in one line)
    except ImportError as exc:
        sys.exit(f"error: torchft is not installed ({exc}): pip install 'recycle[peers]'")
    data = a.data if a.render else token_data(a.data)
    from executor.data.token_file import open_tokens
    model = dict(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, seq_len=a.seq_len,
                 micro_batch_size=a.micro_batch_size, vocab=open_tokens(data).vocab, lr=3e-3)
    setups = {k: Setup(a.replicas, a.microbatches, a.iterations, model, data,
                       a.kill_at if k else -1, a.timeout) for k in (False, True)}
    order = [(s, k) for k in (False, True) for s in SYSTEMS]
    runs: dict = {key: [] for key in order}
    if a.render:
        return write(a, setups, load_runs(a.render, order))
    for r in range(a.rounds):
        for key in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
            system, kill = key
            with tempfile.TemporaryDirectory(prefix=f"peers-{system}-") as wd:
                run = SYSTEMS[system](setups[kill], wd)
            runs[key].append(run)
            print(f"round {r} {system:8} {'kill' if kill else 'clean':5} wall {run.wall:6.1f} s"
                  + (f"  ERROR {run.error}" if run.error else ""), flush=True)
    write(a, setups, runs)


def write(a, setups, runs) -> None:
    st = setups[True]
    rows, per_round = [], []
    for (system, kill), rs in runs.items():
        figs = [figures(run, setups[kill], runs[(system, False)][i] if kill else
                        (runs[("recycle", False)][i] if system == "torchft" else None))
                for i, run in enumerate(rs)]
        rows.append((system, kill, figs))
    table = ["| system | failure | samples/s (median of rounds) | per round | samples dropped | "
             "kill -> next step (s) | losses equal (1e-5) | param checksum rel. diff | "
             "whole command (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for system, kill, figs in rows:
        ok = [f for f in figs if "error" not in f]
        if not ok:
            table.append(f"| {system} | {'kill' if kill else 'none'} | error: "
                         f"{figs[0]['error'][:200]} | | | | | | |")
            continue
        sps = [f["samples_per_s"] for f in ok]
        k2s = [f["kill_to_step_s"] for f in ok if f.get("kill_to_step_s") is not None]
        eq = [f.get("losses_equal") for f in ok]
        what = ("vs its own failure-free run" if kill else
                "vs ReCycle's failure-free run" if system == "torchft" else "")
        eq_s = (f"{sum(bool(e) for e in eq)}/{len(eq)} {what}; max diff "
                f"{max(f.get('max_loss_diff') or 0 for f in ok):.2g}") if what else "(the reference)"
        ck = [f["checksum_rel"] for f in ok if "checksum_rel" in f]
        ck_s = f"max {max(ck):.2g}" if ck else "-"
        table.append(
            f"| {system} | {'replica 1 killed @' + str(st.kill_at) if kill else 'none'} | "
            f"{statistics.median(sps):.1f} | {', '.join(f'{x:.1f}' for x in sps)} | "
            f"{statistics.median(f['dropped'] for f in ok):.0f} of {st.batch * st.iterations} | "
            f"{(', '.join(f'{x:.2f}' for x in k2s)) if k2s else '-'} | {eq_s} | {ck_s} | "
            f"{statistics.median(f['wall_s'] for f in ok):.1f} |")
    ratios = []
    rec, tft = runs[("recycle", True)], runs[("torchft", True)]
    for i in range(len(rec)):
        fr, ft = figures(rec[i], st, None), figures(tft[i], st, None)
        if "error" not in fr and "error" not in ft:
            ratios.append(fr["samples_per_s"] / ft["samples_per_s"])
    m = setups[False].model
    made = os.path.getmtime(a.render) if a.render else time.time()
    cmd = (f"PYTHONPATH=. python -m benchmarks.peers.run --rounds {a.rounds} -d {a.replicas} "
           f"-m {a.microbatches} --iterations {a.iterations} --kill-at {a.kill_at} "
           f"--d-model {a.d_model} --layers {a.layers} --heads {a.heads} --seq-len {a.seq_len} "
           f"--micro-batch-size {a.micro_batch_size} --timeout {a.timeout:g}")
    text = "\n".join([
        "# ReCycle and torchft side by side", "",
        f"Made by `{cmd}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(made))}"
        + (f" (table re-made from its raw data by `--render {os.path.relpath(a.render, ROOT)}`)"
           if a.render else "") + ", "
        f"{os.cpu_count()} cores (shared), torch threads 1 per process.", "",
        f"Same model (the project's GPT: d_model {m['d_model']}, {m['n_layers']} layers, "
        f"{m['n_heads']} heads, seq_len {m['seq_len']}, vocab {m['vocab']} from the token "
        f"file), same data (BPE-4096 tokens of Python's own docs and sources, "
        f"`recycle data prepare --tokenizer bpe:4096`), same micro-batches (replica d's "
        f"share of iteration i is micro-batches d*M..d*M+M-1 of `microbatch(cfg, i, g)`), "
        f"D={a.replicas} replicas of S=1, M={a.microbatches} micro-batches of "
        f"{a.micro_batch_size} samples each per replica ({st.batch} samples per global "
        f"batch), {a.iterations} iterations, AdamW lr 3e-3. Failure: replica 1 SIGKILLed "
        f"during iteration {a.kill_at}, not restarted. ReCycle: `recycle train -s 1 --kill "
        f"1:0@{a.kill_at} --timeout {a.timeout:g} --no-split --checkpoint-every "
        f"{a.iterations}` (with S=1 there is no bubble for a deferred W to fill; no "
        f"periodic checkpoint, as torchft here). torchft {_version()}: its Rust "
        f"lighthouse (`torchft_lighthouse --min_replicas 1 --join_timeout_ms "
        f"{JOIN_TIMEOUT_MS} --quorum_tick_ms {QUORUM_TICK_MS} --heartbeat_timeout_ms "
        f"{HEARTBEAT_TIMEOUT_MS}`, tuned down from its 60 s / 5 s defaults), one Manager per "
        f"replica group (async quorum, timeout {a.timeout:g} s), its fault-tolerant gloo "
        f"process group, Manager.allreduce of the gradients and should_commit before the "
        f"step (benchmarks/peers/torchft_replica.py).", "",
        "samples/s: samples in the updates of steps 1..N-1 over the wall time from the end "
        "of step 0 to the end of the last step (start-up left out for both; 'whole command' "
        "has it). Samples dropped: samples of the N global batches that no update used. "
        "kill -> next step: from the SIGKILL to the end of the first optimizer step of the "
        "iteration in flight or a later one. Losses equal: every iteration's loss within 1e-5 of the failure-free run's; "
        "checksum: the final parameters' float64 sum, relative difference.", "",
        *table, "",
        f"ReCycle / torchft samples/s under the failure, per round (side by side, "
        f"interleaved): {', '.join(f'{x:.2f}' for x in ratios)}; median "
        f"{statistics.median(ratios):.2f}." if ratios else "No round had both failure runs.",
        ""])
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        fh.write(text + "\n")
    print(text)
    if a.render:
        return
    raw = {f"{s}-{'kill' if k else 'clean'}": [
        {"step_end": r.step_end, "samples": r.samples, "losses": r.losses, "t_kill": r.t_kill,
         "wall": r.wall, "checksum": r.checksum, "error": r.error}
        for r in rs] for (s, k), rs in runs.items()}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as fh:
        json.dump(raw, fh)


def load_runs(path: str, order) -> dict:
    from benchmarks.peers.runs import Run
    with open(path) as fh:
        raw = json.load(fh)
    ints = lambda d: {int(k): v for k, v in d.items()}
    return {(s, k): [Run(s, k, ints(r["step_end"]), ints(r["samples"]), ints(r["losses"]),
                         r["t_kill"], r["wall"], r["checksum"], r["error"])
                     for r in raw[f"{s}-{'kill' if k else 'clean'}"]] for s, k in order}


def _version() -> str:
    from importlib.metadata import version
    return version("torchft")


if __name__ == "__main__":
    main()
