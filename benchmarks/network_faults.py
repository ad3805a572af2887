"""Network faults between real test hosts: how long until the fault is known, until the
survivors train under the plan that routes around it, and whether the run stayed exact.

    PYTHONPATH=. .venv/bin/python benchmarks/network_faults.py [--rounds 1] [--cases all]

Needs root (network namespaces, veth links, nftables, tc). Each case is one run of
tests/netns_support.py, the one tests/test_network_faults.py asserts on: a 2x2 grid
(M=2, the tiny GPT), every worker on its own host (a network namespace on a bridge; the
coordinator's store at the bridge's address), `--timeout 3` (torchrun: 6), the fault
injected once the named iteration is in:
  partition  (a)+(b) 1:1's host drops every packet; healed once the others train without
             it; `--restart 1:1@6` brings it back
  cut        (c) only the link between 0:0 (stage 0) and 0:1 (stage 1) is cut
  slow       (d) 1:1's link at 400 kbit/s both ways (tc tbf): planned around as a straggler
  loss       (e) every host drops 5% of its packets in and out (nftables numgen)
  torchrun   (a)+(b) through torchrun: node 1 (replica 1) partitioned, healed at once;
             torchrun restarts the fenced workers (`--timeout 6`: the hold for them lasts
             4 x --timeout + 5 s, and a node's restart takes up to ~16 s here)
Times are seconds after the injection: `detect` to the coordinator's first event after it
(the death or cut it declares; for a slow or lossy link, a re-published plan if any),
`recover` until every worker of the first plan that trained after that event had entered
that plan, `back` until the cut-off worker is admitted again. Writes
benchmarks/results/network_faults.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import netns_support as ns  # noqa: E402

CASES = {
    "partition": (4, ns.partition_case, "1:1's host drops every packet (nftables), healed "
                  "once the others train without it; `--restart 1:1@6`"),
    "cut": (4, ns.cut_case, "the link between 0:0 (stage 0) and 0:1 (stage 1) cut, both "
            "still reach the store"),
    "slow": (4, ns.slow_case, "1:1's link at 400 kbit/s both ways (tc tbf)"),
    "loss": (4, ns.loss_case, "every host drops 5% of its packets in and out (nftables "
             "`numgen random mod 100 < 5 drop`)"),
    "torchrun": (2, ns.torchrun_partition_case, "torchrun, node 1 (replica 1) on its own "
                 "host partitioned, healed at once; torchrun restarts the fenced workers "
                 f"(`--timeout {ns.TORCHRUN_TIMEOUT:g}`)"),
}


def fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def med(xs) -> str:
    """The median of the runs that have the figure, and in how many it is when not all."""
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    return fmt(statistics.median(got)) + ("" if len(got) == len(xs) else
                                          f" ({len(got)} of {len(xs)} runs)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default="all", help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "network_faults.md"))
    args = ap.parse_args()
    why = ns.Lab.unavailable()
    if why:
        sys.exit(f"network_faults: {why}")
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    rows = {n: [] for n in names}
    t0 = time.monotonic()
    for r in range(args.rounds):
        for name in names:
            hosts, case, _ = CASES[name]
            with tempfile.TemporaryDirectory(prefix=f"netfault-{name}-") as tmp, \
                    ns.Lab(hosts) as lab:
                out = case(lab, tmp)
            rows[name].append(out)
            print(f"round {r} {name}: detect {fmt(out.detect_s)} s, recover "
                  f"{fmt(out.recover_s)} s, back {fmt(out.back_s)} s, exact {out.exact}"
                  f" {'; '.join(out.notes)}", flush=True)
    wall = time.monotonic() - t0
    cmd = "PYTHONPATH=. .venv/bin/python benchmarks/network_faults.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    lines = [
        "# Network faults between test hosts",
        "",
        f"`{cmd.strip()}`",
        "",
        f"{platform.node()}: {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end, {args.rounds} round(s), {wall:.0f} s in all. "
        "A 2x2 grid (M=2, the tiny GPT: vocab 32, seq 8, d 16, 2 layers), every worker on "
        "its own test host (a network namespace on a veth link to a bridge; the "
        "coordinator's store at the bridge's address; gloo over the links), "
        f"`--timeout {ns.TIMEOUT:g}` (torchrun: {ns.TORCHRUN_TIMEOUT:g}). Seconds after the "
        "fault was injected: **detect** the "
        "coordinator's first event after it, **recover** every worker of the first plan that "
        "trained after it had entered that plan, **back** the cut-off worker admitted "
        "again. **exact**: losses and final parameters equal the one-process reference's "
        "within 1e-5 (medians over rounds; exact in how many).",
        "",
        "| case | fault | the coordinator's first event after it | detect s | recover s | "
        "back s | exact |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        outs = rows[name]
        line = next((o.detect_line for o in outs if o.detect_line), "") or "(no event)"
        line = line if len(line) <= 110 else line[:107] + "..."
        lines.append(
            f"| {name} | {CASES[name][2]} | `{line.strip()}` | "
            f"{med([o.detect_s for o in outs])} | {med([o.recover_s for o in outs])}"
            f" | {med([o.back_s for o in outs])} | "
            f"{sum(o.exact for o in outs)}/{len(outs)} |")
    lines += ["", "## What happened, per run", ""]
    for name in names:
        for i, o in enumerate(rows[name]):
            plans = o.result.summary.plans if o.exact else []
            trained = ", ".join(f"v{p['version']} failed {p['failed'] or '-'} from "
                                f"iteration {p['first_iteration']}" for p in plans)
            lines.append(f"- **{name}** round {i}: {'; '.join(o.notes) or '-'}; plans "
                         f"trained: {trained or '-'}"
                         + (f"; node agents exited {o.nodes}" if o.nodes else ""))
    lines += ["", "## Reading it", "", READING, ""]
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines))
    print(f"wrote {args.out}")


READING = """\
- **partition**: the cut-off worker is alive and keeps trying to send, but reaches no
  one (not the store either). Its peers' operations time out (`--timeout`), they report
  it, and its heartbeat, silent since the partition, is 2 s old by then: declared failed.
  Before this, the local coordinator watched only its workers' exits, and re-published
  the same members for ever. The test then sends, as that process, a fatal error and
  wrong losses of iteration 0: ignored (`fenced_messages` in the summary), the run
  neither halts nor changes. Healed, the process hears from the store again (TCP resends
  its last request), finds itself out of the plan and stops; `--restart` starts its next
  incarnation, which loads its stage from a live peer.
- **cut**: both ends of the cut link reach the store, so nobody is silent: every plan of
  the same members failed its rendezvous (gloo connects every pair) and the coordinator
  re-published for ever. Now the members of a version after the first probe each other
  (a TCP connection to the address each checked in with) before gloo's rendezvous; both
  ends report the link down and the coordinator fences one end. Detection is the
  failed iteration's timeout, one re-published version (a timeout more), its probe (up
  to a timeout) and a second of gathering reports: about 3 x `--timeout` + 1 s.
- **slow**: the worker behind the slow link computes as fast as ever, but its TCP
  connections stay busy: once an iteration each worker reads the kernel's busy time of
  its connections to its neighbours on other hosts (TCP_INFO, link_meter.py) and reports
  max(compute, link) per micro-batch, its own link being the fastest of its neighbour
  links (1:0, sending into the slow link, has a fast one to 0:0: not it). The detector
  (window of 3, persist 3) marks 1:1 slow and the next plan routes micro-batches away.
  The gradient all-reduce of stage 1 still crosses the link every iteration, so the
  iteration gains less than the micro-batches moved: see the s/iteration notes.
  Before this, no event: the detector saw CPU time only.
- **loss**: TCP resends what is lost (the first resend after 200 ms, doubling), so
  iterations slow down. A segment lost again and again outlasts `--timeout` now and then:
  the iteration is aborted, the coordinator re-publishes the same members (the event
  then shown) and the run goes on, exact. Both ends of a link must report it down before
  anyone is fenced, so one probe lost to the loss fences nobody.
- **torchrun**: the coordinator declares node 1's two workers failed by their heartbeats
  and the others train on. Healed, the fenced processes stop with exit 5 (EXIT_FENCED)
  because the run goes on, so torchrun's agent restarts them (before, they exited 0 and
  were never restarted: their slots stayed empty to the end); `back` includes TCP's
  resend to the healed link and the new processes' start (importing torch). A worker the
  partition caught in a store request that times out dies of it instead, and is
  restarted the same way.
"""


if __name__ == "__main__":
    main()
