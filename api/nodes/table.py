"""Which agent holds which node of a job: leases kept in memory.

Node `n` of a job with `k` workers per node is the block of ranks `n*k .. n*k+k-1`
(rank = replica * stages + stage, as torchrun numbers them). One agent holds a node at a
time; its lease lasts while it heartbeats (the service's heartbeat timeout). A second
agent for a held node is refused (409) until the holder detaches or its lease lapses (a
replacement machine then takes the node over). Nothing here is persisted: after a service
restart the agents' next heartbeats claim their nodes again (every heartbeat is a claim).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from api.hotpath.views import node_cells
from api.jobs.runtime import ApiError, JobRuntime


@dataclass
class Lease:
    agent_id: str
    seen: float  # time.monotonic() of the holder's last attach or heartbeat


class NodeTable:
    def __init__(self, lease_s: float):
        self.lease_s = lease_s
        self.per_node: dict[str, int] = {}                 # job id -> workers per node
        self.leases: dict[tuple[str, int], Lease] = {}     # (job id, node) -> holder

    def workers(self, job: JobRuntime, node: int, per_node: int) -> list[tuple[int, int]]:
        """The (replica, stage) cells of node `node`; 422 for a node outside the job."""
        cells = node_cells(job, node, per_node)
        if cells is None:
            n = job.spec.replicas * job.spec.stages
            raise ApiError(422, f"node rank {node} is outside job {job.id}: its {n} workers "
                                f"at {per_node} per node make nodes 0..{-(-n // per_node) - 1}")
        return cells

    def claim(self, job: JobRuntime, node: int, agent_id: str, per_node: int
              ) -> list[tuple[int, int]]:
        """Give (or renew) `agent_id` the lease of `node`; its workers. 409 if another
        agent holds it, or the job's nodes were claimed with another size."""
        have = self.per_node.get(job.id)
        if have is not None and have != per_node:
            raise ApiError(409, f"job {job.id}'s nodes have {have} workers each; this agent "
                                f"says {per_node} (--workers-per-node must match)")
        cells = self.workers(job, node, per_node)
        now = time.monotonic()
        lease = self.leases.get((job.id, node))
        if lease is not None and lease.agent_id != agent_id and now - lease.seen < self.lease_s:
            raise ApiError(409, f"node {node} of job {job.id} is held by agent "
                                f"{lease.agent_id} (heard {now - lease.seen:.1f} s ago); stop "
                                f"it, or wait {self.lease_s:g} s after it goes silent")
        self.per_node[job.id] = per_node
        self.leases[(job.id, node)] = Lease(agent_id, now)
        return cells

    def release(self, job_id: str, node: int, agent_id: str) -> bool:
        lease = self.leases.get((job_id, node))
        if lease is None or lease.agent_id != agent_id:
            return False
        del self.leases[(job_id, node)]
        if not any(j == job_id for j, _ in self.leases):
            self.per_node.pop(job_id, None)  # no node held: the next agents may re-size
        return True

    def holder(self, job_id: str, node: int) -> Optional[Lease]:
        return self.leases.get((job_id, node))
