"""Node events (docs/api.md, "Node events"): machines come and go.

A node REMOVE (a spot preemption notice, an instance gone) names the node's workers: they
fail together, one membership change (planner/control/membership.py `fail_many`), one plan
version. A node ADD (a new instance) grows nothing: the job's grid is its capacity, so the
new node's workers take the ids of dead workers, chosen here (planner/control/vacancies.py)
and answered; each then joins with its own incarnation by a recovery event, as a fresh
worker with no state. Both are stored like other events (idempotent by `event_id`, in the
same id space) and shown in the job's history.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Optional

from api.jobs.runtime import ApiError, JobRuntime, transition
from api.models import NodeEventIn
from planner.control.membership import Membership, Reject
from planner.control.vacancies import NoVacancy, vacant_ids

Worker = tuple[int, int]


def grants(rows) -> dict[Worker, int]:
    """The ids given by node adds and not used yet, from a job's stored events (oldest
    first), each with the number of its add (1 for the job's first): an add gives its
    workers' ids, a recovery of one uses it."""
    out: dict[Worker, int] = {}
    adds = 0
    for row in rows:
        if row["kind"] == "add":
            adds += 1
            for w in json.loads(row["response_json"]).get("workers") or ():
                out[(w["replica"], w["stage"])] = adds
        elif row["kind"] == "recovery":
            out.pop((row["replica"], row["stage"]), None)
    return out


class NodeEvents:
    """Mixed into api.service.Service (uses its store, metrics and _change)."""

    async def apply_node(self, job: JobRuntime, ev: NodeEventIn,
                         source: str) -> tuple[dict, bool]:
        """A node removed or added; returns (answer, replayed). Raises ApiError."""
        t0 = time.perf_counter()
        _check_shape(ev)
        body_json = ev.model_dump_json(exclude_none=True)
        async with job.lock:
            old = self.store.event(job.id, ev.event_id)
            if old is not None:
                if old["body_json"] != body_json:
                    raise ApiError(409, f"event_id {ev.event_id!r} was already used with a "
                                        "different body")
                return json.loads(old["response_json"]), True
            for w in ev.workers or ():
                job.check_worker(w.replica, w.stage)
            self._check_running(job)
            head = {"job_id": job.id, "event_id": ev.event_id, "kind": ev.kind,
                    "replica": None, "stage": None, "source": source}
            # the events table names one worker per row: a node event's are in its body
            row = {"event_id": ev.event_id, "kind": ev.kind, "replica": -1, "stage": -1,
                   "source": source, "body_json": body_json}
            if ev.kind == "add":
                answer = await self._add(job, ev, head, row)
                done = None
            else:
                workers = [(w.replica, w.stage) for w in ev.workers]
                members, decision = await transition(
                    job.members.fail_many,
                    [((w.replica, w.stage), w.incarnation) for w in ev.workers])
                if isinstance(decision, Reject):
                    raise ApiError(409, decision.reason)
                gone = sorted(set(members.failed) - set(job.members.failed))

                def answer_of(m: Membership, version: int, plan_source: Optional[str]) -> dict:
                    return {**head, "state": m.state, "reason": m.reason,
                            "failed": sorted(m.failed), "plan_version": version,
                            "plan_source": plan_source, "incarnation": None,
                            "workers": [{"replica": r, "stage": s,
                                         "incarnation": m.incarnation((r, s))}
                                        for r, s in gone]}
                row["workers"] = gone  # their heartbeat arming goes (as a failure's)
                done = await self._change(job, members, decision, f"remove:{source}",
                                          workers, row, answer_of, t0)
                answer = done.answer
        if done is not None:
            self._after_change(job, "remove", source, gone, done)
        else:
            self.metrics.events.labels("add", source, "accepted").inc()
        return answer, False

    async def _add(self, job: JobRuntime, ev: NodeEventIn, head: dict, row: dict) -> dict:
        """Under job.lock: the ids of the new node's workers (no plan changes: each joins
        by its own recovery event)."""
        try:
            ids, node = vacant_ids(job.spec.replicas, job.spec.stages, job.members.failed,
                                   count=ev.count, per_node=ev.workers_per_node,
                                   granted=job.granted,
                                   # slots of the job's own grid (a shape's are of its own)
                                   empty=job.empty if job.plan.partition is None else ())
        except NoVacancy as e:
            raise ApiError(409, str(e)) from None
        answer = {**head, "state": job.state, "reason": job.reason, "failed": job.failed,
                  "plan_version": job.version, "plan_source": None, "incarnation": None,
                  "workers": [{"replica": r, "stage": s,
                               "incarnation": job.incarnation(r, s) + 1} for r, s in ids]}
        if node is not None:
            answer["node_rank"] = node
        await asyncio.to_thread(self.store.apply_event, job.id, row, answer, job.state,
                                job.reason, job.failed, None)
        job.adds += 1
        for w in ids:
            job.granted[w] = job.adds
        job.notify()  # the live page shows the event
        return answer


def _check_shape(ev: NodeEventIn) -> None:
    """One clear line for a body that mixes the two kinds' fields."""
    if ev.kind == "remove":
        if ev.workers is None:
            raise ApiError(422, "a node remove names its workers: workers: [{replica, stage, "
                                "incarnation?}, ...]")
        if ev.count is not None or ev.workers_per_node is not None:
            raise ApiError(422, "a node remove takes workers, not count or workers_per_node")
    else:
        if ev.workers is not None:
            raise ApiError(422, "a node add takes count or workers_per_node, not workers (the "
                                "service chooses the ids)")
        if ev.count is None and ev.workers_per_node is None:
            raise ApiError(422, "a node add says how many workers the new node runs: count, "
                                "or workers_per_node for a whole node")
