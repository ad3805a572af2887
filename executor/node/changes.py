"""A node agent's own membership changes (docs/api.md, "Roles and node events"): machines
come and go. On a preemption notice (SIGTERM, as spot instances get) the agent posts a
node remove for its workers, one plan version without them all, before it stops them;
started with no node rank (a new instance) it posts a node add, and serves the vacant node
the service gives it: its workers take dead workers' ids and join as new incarnations.
Mixed into NodeAgent (agent.py)."""
from __future__ import annotations

from typing import Optional

import httpx

from executor.runtime.transport.waiting import retried
from planner.control import routes as R
from planner.control.routes import Route
from planner.errors import UserError


# A spot instance's notice gives it seconds to minutes: its node remove is tried this long,
# then the agent stops its workers anyway (the heartbeat timeout takes over).
PREEMPTION_NOTICE_S = 10.0


class AgentError(UserError):
    """A reason the agent cannot serve its node, in one line (the CLI exits 2)."""


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text[:300]


class NodeChanges:
    """Uses the agent's api client, job, node, cells, incarnations and say()."""

    def url(self, route: Route) -> str:
        """A declared route (planner/control/routes.py) of this job, and of this node."""
        node = {"node": self.node} if "{node}" in route.template else {}
        return route.url(job_id=self.job_id, **node)

    def _post(self, route: Route, body: dict,
              patience_s: Optional[float] = None) -> httpx.Response:
        """POST, retried while the service is unreachable (it may be restarting): the
        service's patience, or a shorter one where time runs out first (a preemption)."""
        url = self.url(route)
        try:
            return retried(lambda: self.api.post(url, json=body), f"POST {url}",
                           patience_s=self.patience_s if patience_s is None else patience_s,
                           retry_on=(httpx.TransportError,), first_s=0.5)
        except httpx.TransportError as e:
            raise AgentError(f"plan service unreachable: {e}") from None

    def join(self) -> None:
        """A new instance with no node rank: a node add; the service answers the vacant
        node whose (dead) workers' ids this node's workers take."""
        r = self._post(R.NODES, {
            "event_id": f"agent-join-{self.job_id}-{self.agent_id}", "kind": "add",
            "workers_per_node": self.per_node,
            "reason": f"node agent {self.agent_id} started"})
        if r.status_code != 200:
            raise AgentError(f"the plan service gave this new node no workers "
                             f"({r.status_code}): {_detail(r)}")
        body = r.json()
        self.node = body["node_rank"]
        ids = " ".join(f"{w['replica']}:{w['stage']}" for w in body["workers"])
        self.say(f"agent {self.agent_id}: joined job {self.job_id} as node {self.node}: "
                 f"workers {ids} (ids of dead workers; each joins as a new incarnation)")

    def preempt(self) -> None:
        """A preemption notice (SIGTERM): remove the node, then stop (run() does both)."""
        self.preempted.set()
        self.stopping.set()

    def remove_node(self) -> None:
        """Tell the service the node's workers go, all at once (one plan version)."""
        if self.state == "finished" or not self.cells:
            return
        with self.cond:
            incs = dict(self.incs)
        workers = [{"replica": r, "stage": s, **({"incarnation": incs[(r, s)]}
                                                  if incs.get((r, s)) else {})}
                   for r, s in self.cells]
        try:
            r = self._post(R.NODES, {
                "event_id": f"agent-{self.job_id}-n{self.node}-preempt-{self.agent_id}",
                "kind": "remove", "workers": workers,
                "reason": f"node agent {self.node}: preemption notice (SIGTERM)"},
                PREEMPTION_NOTICE_S)
        except AgentError as e:
            self.say(f"agent node {self.node}: preemption notice; node remove not posted: {e}")
            return
        if r.status_code == 200:
            self.say(f"agent node {self.node}: preemption notice: node removed, plan "
                     f"v{r.json()['plan_version']}")
        else:
            self.say(f"agent node {self.node}: preemption notice; node remove not applied "
                     f"({r.status_code}): {_detail(r)}")
