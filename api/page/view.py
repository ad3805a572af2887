"""What the live page shows of one job, as one JSON-able dict (pure reads, no side effects).

Worker states, in the order they win:
  failed     in the failed set, by its own report or its silence (source worker/heartbeat)
  fenced     in the failed set by an operator's event: its process may still run, and is
             fenced out (its heartbeats answer 409, its worker plan says in_plan: false)
  finished   in the plan when the job finished (training completed): it exits, and its
             heartbeats are no longer watched
  rejoining  in the plan under a newer incarnation, no heartbeat from it yet (it is loading
             its stage's state from a live peer)
  waiting    in the plan, first incarnation, no heartbeat yet (not started, or starting)
  slow       live, and the plan in force gives it a speed below 1.0 (a straggler)
  live       live and heartbeating
The grid is by worker (its id, its home slot); with roles, `roles[r][s]` is the slot
worker r.s fills (None: it fills none), and the page marks a worker away from home.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional

HISTORY = 60  # plan versions and events sent to the page (the newest)


def worker_states(job, last_beat: dict, failure_source: dict) -> list[list[str]]:
    """[replica][stage] -> state name (see the module docstring)."""
    failed = set(map(tuple, job.failed))
    speeds = job.speeds
    done = job.state == "finished"
    out = []
    for d in range(job.spec.replicas):
        row = []
        for s in range(job.spec.stages):
            w = (d, s)
            if w in failed:
                row.append("fenced" if failure_source.get(w) == "operator" else "failed")
            elif done:
                row.append("finished")
            elif w not in last_beat:
                row.append("rejoining" if job.incarnation(d, s) > 1 else "waiting")
            elif speeds[d][s] < 1.0:
                row.append("slow")
            else:
                row.append("live")
        out.append(row)
    return out


def roles_grid(job) -> Optional[list[list[Optional[list[int]]]]]:
    """[replica][stage] -> the slot worker r.s fills in the plan in force (None: it fills
    none); None for a plan without roles (every worker in its home slot)."""
    if job.plan.roles is None:
        return None
    return [[None if (slot := job.slot_of((d, s))) is None else list(slot)
             for s in range(job.spec.stages)] for d in range(job.spec.replicas)]


def _failure_sources(events: list[dict]) -> dict:
    """(replica, stage) -> source of the failure event (or node remove) that put it in the
    failed set."""
    src = {}
    for ev in events:
        if ev["kind"] == "failure":
            src[(ev["replica"], ev["stage"])] = ev["source"]
        elif ev["kind"] == "remove":
            for w in ev["workers"]:
                src[(w[0], w[1])] = ev["source"]
    return src


def _events(rows) -> list[dict]:
    out = []
    for r in rows:
        body = json.loads(r["body_json"])
        answer = json.loads(r["response_json"])
        ev = {"seq": r["seq"], "kind": r["kind"], "replica": r["replica"],
              "stage": r["stage"], "source": r["source"], "created": r["created"],
              "reason": body.get("reason"), "speed": body.get("speed"),
              "plan_version": answer.get("plan_version"), "state": answer.get("state")}
        if r["kind"] in ("remove", "add"):  # a node event: its workers (ids given, for an add)
            ev.update(replica=None, stage=None,
                      workers=[[w["replica"], w["stage"]] for w in answer.get("workers") or ()])
        out.append(ev)
    return out


def history(store, job_id: str) -> dict:
    """The slowly changing part: events, plan versions, the failure-free period. Read again
    only when the job changes (or every few seconds), not on every push."""
    versions = []
    for r in store.plan_history(job_id):
        v = dict(r)
        moves = v.pop("moves_json", None)
        v["moves"] = json.loads(moves) if moves else []
        versions.append(v)
    events = _events(store.events(job_id))
    return {"events": events[-HISTORY:], "sources": _failure_sources(events),
            "versions": versions[-HISTORY:],
            "baseline_period": versions[0]["period"] if versions else None}


def job_view(svc, job, hist: dict, now_mono: Optional[float] = None) -> dict[str, Any]:
    """The page's snapshot of `job`: grid states and heartbeat ages, the plan in force and
    its figures, history, precompute progress, the coordinator's training progress."""
    now_mono = time.monotonic() if now_mono is None else now_mono
    monitor = svc.monitor
    last = dict(monitor.last.get(job.id, {})) if monitor is not None else {}
    plan = job.plan
    m = plan.metrics
    base = hist["baseline_period"]
    ages = [[round(now_mono - last[(d, s)], 2) if (d, s) in last else None
             for s in range(job.spec.stages)] for d in range(job.spec.replicas)]
    pre = svc.store.precompute(job.id)
    return {
        "id": job.id, "state": job.state, "reason": job.reason,
        "replicas": job.spec.replicas, "stages": job.spec.stages,
        "microbatches": job.spec.microbatches, "created": job.created,
        "version": job.version, "failed": [list(w) for w in job.failed],
        "period": m.period, "makespan": m.makespan, "lower_bound": m.lower_bound,
        "gap": m.gap, "solver": plan.solver.name, "solver_status": plan.solver.status,
        "baseline_period": base,
        # the global batch never changes, so throughput goes as 1 / period
        "kept": (base / m.period) if base and m.period else None,
        "timeout_s": svc.config.heartbeat_timeout_s,
        "states": worker_states(job, last, hist["sources"]),
        "roles": roles_grid(job),
        "ages": ages, "speeds": job.speeds, "incarnations": job.incarnations,
        "precompute": None if pre is None else {
            "state": pre["state"], "done": pre["done"], "total": pre["total"],
            "sets": pre["sets"], "error": pre["error"]},
        # POST /v1/jobs/{id}/progress: iteration, iterations, loss, tokens_per_s, at
        "progress": job.progress,
        "events": hist["events"], "versions": hist["versions"],
        "server_time": time.time(),
    }
