"""Markdown table, JSON and notes for `python -m benchmarks.bench_executor` (benchmarks/executor_bench.py)."""
from __future__ import annotations

import json
import os


def _fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def write_report(out_md: str, res: dict) -> None:
    c = res["config"]
    lines = [
        "# Executor benchmark: ReCycle runtime vs torch.distributed.pipelining", "",
        f"Command: `{res['command']}`", "",
        f"Tree: {res.get('tree', 'unknown')}", "",
        f"Model: {res.get('model', 'gpt')} d_model={c['d_model']}, layers={c['n_layers']}, heads={c['n_heads']}, "
        f"seq={c['seq_len']}, vocab={c['vocab']}, micro-batch {c['micro_batch_size']}; "
        f"S={res['stages']} stages, M={res['microbatches']} micro-batches per replica; "
        f"{res['iterations']} iterations, first {res['warmup']} excluded. gloo on loopback, "
        f"1 thread per process, {res['cores']} cores on {res['machine']}, shared with other jobs "
        f"(1-min load average at start {res['load_start']:.1f}). Planner back-end: {res['solver']}.", "",
        "Profiled spec (us): " + json.dumps(res["job_d2"]["cost"]) +
        f", p2p {res['job_d2']['p2p']} (measured gloo one-way latency {_fmt(res['latency_us'], 0)} us).", "",
        "| run | procs | failed | planned period (ms) | CPU-share bound (ms) | realised (ms/iter) "
        "| realised / planned | compute slowdown | realised / (planned x slowdown) "
        "| tok/s | per replica (ms/iter) | slowest worker: compute / comm wait / snapshot / step bookkeeping / data+send+control / other (ms) "
        "| snapshot (MB) | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['procs']} | - | {_fmt(r.get('planned_ms'))} | - "
                         f"| n/a: {r['error']} | - | - | - | - | - | - | - | - |")
            continue
        if "realised_ms" not in r:  # a run with a real kill: no steady period, its throughput
            lines.append(f"| {r['name']} | {r['procs']} | {r.get('failed') or 'none'} "
                         f"| {_fmt(r.get('planned_ms'))} | - | - | - | - | - "
                         f"| {_fmt(r.get('run_tok_s'), 0)} (whole run) | - | - "
                         f"| {_fmt(r.get('snapshot_mb'), 2)} | {_fmt(r.get('load_avg'))} |")
            continue
        ratio = r["realised_ms"] / r["planned_ms"] if r.get("planned_ms") else None
        b = r.get("breakdown_ms", {}).get(r.get("slowest"))
        split = f"{r['slowest']}: " + " / ".join(f"{v:.0f}" for k, v in b.items() if k != "timers") if b else "-"
        reps = ", ".join(f"d{d}: {v:.1f}" for d, v in r.get("per_replica_ms", {}).items()) or "-"
        lines.append(f"| {r['name']} | {r['procs']} | {r.get('failed', '-') or 'none'} "
                     f"| {_fmt(r.get('planned_ms'))} | {_fmt(r.get('cpu_bound_ms'))} "
                     f"| {_fmt(r['realised_ms'])} | {_fmt(ratio, 2)} | {_fmt(r.get('slowdown'), 2)} "
                     f"| {_fmt(r.get('adjusted_ratio'), 2)} | {_fmt(r.get('tok_s'), 0)} | {reps} | {split} "
                     f"| {_fmt(r.get('snapshot_mb'), 2)} | {_fmt(r.get('load_avg'))} |")
    lines += ["", "Columns: *planned* is the plan's `metrics.period` for the profiled spec (for "
              "torch's 1F1B: our `1f1b` back-end on the same spec with B = autograd's backward); *CPU-share bound* is "
              "max(planned, all the plan's work / cores), since the plan assumes one core per "
              "worker; *realised* is the mean interval between one worker's consecutive "
              "optimizer steps after warm-up, the largest over workers; *compute slowdown* is "
              "the time workers really spent in F/I/W and AdamW per iteration over what the "
              "plan gives them (mean over workers): how much slower compute ran than when "
              "profiled alone; the next column divides it out, leaving scheduling, "
              "communication and Python overhead; *tok/s* is the global batch (D x M x micro-batch "
              "x seq tokens, unchanged by failures) over the realised period; *snapshot* is the "
              "time per iteration in the stepper beyond the optimizer step (the pre-step copy "
              "rollback keeps, runtime/steps/stepper.py) and *snapshot (MB)* the most extra memory "
              "its snapshots held on one worker; *load* is the 1-min load average when the "
              "run ended.", ""]
    lines += res.get("notes", [])
    os.makedirs(os.path.dirname(out_md) or ".", exist_ok=True)
    with open(out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(out_md)[0] + ".json", "w") as f:
        json.dump(res, f, indent=1)


def notes(res: dict) -> list[str]:
    rows = res["rows"]
    ok = [r for r in rows if "realised_ms" in r]
    t = next((r for r in ok if r["name"] == "torch Schedule1F1B"), None)
    o = next((r for r in ok if r["name"].startswith("ReCycle D=1")), None)
    out = ["Notes:", ""]
    if t and o:
        out.append(f"- ReCycle D=1 vs torch Schedule1F1B on the same {res['stages']} processes, best of "
                   f"{res['rounds']} interleaved rounds: {o['realised_ms']:.1f} vs {t['realised_ms']:.1f} "
                   f"ms/iter ({o['realised_ms'] / t['realised_ms']:.2f}x; rounds: ours "
                   f"{', '.join(_fmt(v) for v in o['rounds_ms'])}, 1F1B {', '.join(_fmt(v) for v in t['rounds_ms'])}). "
                   f"Planned {o['planned_ms']:.1f} vs {t['planned_ms']:.1f} ms: the I/W split fills "
                   "1F1B's bubbles, but on shared cores a bubble-free schedule also keeps both "
                   "processes computing at once, so they contend all the time, while 1F1B's idle "
                   "rank hands its core to the busy one.")
    f = next((r for r in ok if "fused B" in r["name"]), None)
    if t and f:
        out.append(f"- ReCycle D=1 with fused-B plans (no I/W split: B is StageCompute.backward_full) vs "
                   f"torch Schedule1F1B: {f['realised_ms']:.1f} vs {t['realised_ms']:.1f} ms/iter "
                   f"({f['realised_ms'] / t['realised_ms']:.2f}x; rounds: "
                   f"{', '.join(_fmt(v) for v in f['rounds_ms'])}); planned {f['planned_ms']:.1f} ms. "
                   "`recycle train --no-split` runs such plans.")
    ours = [r for r in ok if r["name"].startswith("ReCycle")]
    if ours:
        lo, hi = min(r["realised_ms"] / r["planned_ms"] for r in ours), max(r["realised_ms"] / r["planned_ms"] for r in ours)
        alo, ahi = min(r["adjusted_ratio"] for r in ours), max(r["adjusted_ratio"] for r in ours)
        out.append(f"- Realised / planned for ReCycle runs: {lo:.2f} to {hi:.2f} (target <= 1.10). "
                   f"Compute itself took {min(r['slowdown'] for r in ours):.2f}x to "
                   f"{max(r['slowdown'] for r in ours):.2f}x its profiled time (the plan assumes "
                   f"one idle core per worker; here {res['cores']} cores are shared by up to "
                   f"{max(r['procs'] for r in ours)} workers plus other jobs, see *load*); with that "
                   f"divided out the ratio is {alo:.2f} to {ahi:.2f}, which is what the runtime adds: "
                   f"gloo latency on loopback ({_fmt(res['latency_us'], 0)} us one way when measured, "
                   "paid on every F and I hop of the critical path; receives are posted ahead, so "
                   "a message sent before its action moves meanwhile), Python dispatch per action, "
                   "and per-iteration work the plan does not model (the snapshot for rollback, "
                   "flattening gradients for the all-reduce where a stage has peers, store messages "
                   "and the heartbeat thread): the slowest worker's breakdown column.")
    base = next((r for r in ours if r["name"].startswith("ReCycle D=2") and not r.get("failed")), None)
    if base and base.get("losses"):
        for r in ours:
            if r is not base and r["name"].startswith("ReCycle D=2") and r.get("losses"):
                d = max(abs(a - b) for a, b in zip(base["losses"], r["losses"]))
                out.append(f"- Failed {r['failed']}: per-iteration losses match the failure-free "
                           f"D=2 run to {d:.1e} (re-routing keeps the global batch).")
    none2 = next((r for r in ours if r["name"].startswith("ReCycle D=2") and not r.get("failed")), None)
    one2 = next((r for r in ours if r["name"].startswith("ReCycle D=2") and r.get("failed") == "1:0"), None)
    kill = next((r for r in rows if r.get("kills") and "run_tok_s" in r), None)
    if none2 and one2:
        line = (f"- Tokens/s, D=2: failure-free {none2['tok_s']:.0f}, one worker failed "
                f"(1:0, steady state) {one2['tok_s']:.0f} ({one2['tok_s'] / none2['tok_s']:.2f}x; "
                f"planned {none2['planned_ms'] / one2['planned_ms']:.2f}x)")
        if kill and none2.get("run_tok_s"):
            line += (f"; over the whole run after warm-up, failure-free {none2['run_tok_s']:.0f} "
                     f"vs {kill['run_tok_s']:.0f} with worker {kill['kills'][0][0]}:{kill['kills'][0][1]} "
                     f"SIGKILLed in iteration {kill['kills'][0][2]} (detection, rollback of the "
                     f"iteration in flight, re-plan and the re-routed steady state included)")
        out.append(line + ".")
        if kill and none2.get("losses") and kill.get("losses"):
            d = max(abs(a - b) for a, b in zip(none2["losses"], kill["losses"]))
            out.append(f"- The run with the SIGKILL matches the failure-free D=2 run's losses to {d:.1e}.")
    snaps = [r for r in ours if r.get("breakdown_ms")]
    if snaps:
        per = [r["breakdown_ms"][r["slowest"]]["snapshot"] for r in snaps]
        out.append(f"- Snapshot for rollback (runtime/steps/stepper.py): {min(per):.1f} to {max(per):.1f} "
                   f"ms per iteration on the slowest worker, up to "
                   f"{max(r.get('snapshot_mb', 0) for r in snaps):.2f} MB extra memory per worker.")
    out.append("- Zero-bubble schedules of torch.distributed.pipelining (ZBV, interleaved ZB) "
               "need several stages per rank, so they run the same model split into "
               f"{2 * res['stages']} chunks, 2 per rank (ZBV: chunks r and 2S-1-r; interleaved: "
               "r and r+S); ReCycle's own plans split I and W with one stage per worker. torch "
               "rows have no plan, except 1F1B, planned with our `1f1b` back-end on the same spec "
               "(B = autograd's backward).")
    prof = res.get("profile_us")
    if prof:
        iw, nat = sum(r["I"] + r["W"] for r in prof), sum(r["native_backward"] for r in prof)
        out.append(f"- Backward split cost: per micro-batch, I + W take {iw / 1e3:.1f} ms over all "
                   f"stages against {nat / 1e3:.1f} ms for autograd's own backward (what torch's "
                   f"schedules run), {100 * (iw / nat - 1):+.0f}%. ReCycle's split plans pay this "
                   "(the deferred weight gradients of executor/compute/) on every micro-batch, which "
                   "eats most of what filling 1F1B's bubbles gains at S=2 (bubble share of 1F1B "
                   f"= (S-1)/(M+S-1) = {(res['stages'] - 1) / (res['microbatches'] + res['stages'] - 1):.0%}). "
                   "The torch 1F1B row is planned with that native backward.")
    out.append(f"- Data: generating one synthetic micro-batch costs "
               f"{res['data_ms_per_microbatch']:.1f} ms here (vs F of stage 0 "
               f"{res['job_d1']['cost']['F'][0] / 1e3:.1f} ms). The agent loads the next "
               "iteration's micro-batches on a loader thread while the current one computes "
               "(first and last stage); here both runtimes generate all of them before timing, "
               "so neither pays for data inside the measured iterations.")
    out.append("- Timing noise: the machine is shared; compare rows through the *load* column, "
               "and rerun the command for fresh numbers.")
    return out
