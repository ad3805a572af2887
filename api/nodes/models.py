"""Request and answer bodies of the node routes."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field

from api.models import Index, HeartbeatIn, _In
from planner.control.routes import MAX_PER_NODE

AgentId = Field(min_length=1, max_length=100, pattern=r"^[\x21-\x7e]+$",
                description="the agent's own id, chosen at start (e.g. host-pid-random)")
PerNode = Field(ge=1, le=MAX_PER_NODE, strict=True,
                description="workers per node (torchrun's --nproc-per-node); the same for "
                            "every node of a job")


class NodeClaimIn(_In):
    agent_id: str = AgentId
    workers_per_node: int = PerNode


class NodeBeatIn(NodeClaimIn):
    workers: list[HeartbeatIn] = Field(max_length=4096, description="one heartbeat per live "
                                       "local worker (each as POST /heartbeats takes it)")


class Cell(BaseModel):
    replica: int = Index
    stage: int = Index


class NodeOut(BaseModel):
    job_id: str
    node_rank: int
    agent_id: str
    workers: list[Cell] = Field(description="the node's workers, in rank order")
    state: str
    plan_version: int
    timeout_s: float


class Refused(BaseModel):
    replica: int
    stage: int
    status: int
    detail: str


class NodeBeatOut(BaseModel):
    state: str
    plan_version: int
    timeout_s: float
    incarnations: list[int] = Field(description="per heartbeat sent, in order: the "
                                    "incarnation the plan in force admits for that worker")
    refused: list[Refused] = Field(description="heartbeats not taken (409: the worker is "
                                   "failed, or another incarnation); the others were")


class DetachOut(BaseModel):
    released: bool
    reason: Optional[str] = None
