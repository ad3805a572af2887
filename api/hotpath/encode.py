"""A plan's JSON, and the parts of it that shares carry, assembled from memoised pieces.

Plan.to_json serialises every action of every worker (17 ms at 4,096 workers, 53,000
actions), for every version, although a new version shares almost all its workers' action
lists with earlier ones (PlanCache shares equal parts, mapping.py maps a replica's workers
once). Here each list's JSON is made once and kept, keyed by the list's identity (the
entry keeps the list, so the id stays its own); a plan's JSON is pydantic's for everything
but the workers, with the workers' memoised JSON spliced in: byte for byte Plan.to_json
(tests/test_service_hotpath.py).
"""
from __future__ import annotations

from pydantic import TypeAdapter

from planner.plan import Action, Plan

ACTIONS = TypeAdapter(list[Action])  # pydantic's serialiser: as the plan's JSON has them
HEAD = {"format", "job", "failed", "version", "routes"}  # the fields before `workers`
TAIL = {"metrics", "solver", "incarnations"}             # and after


class JsonParts:
    """Memoised JSON of action lists and the micro-batches they touch (both made at first
    sight of a list, so a warm-up readies both); at most `limit` lists kept (all dropped at
    once beyond it)."""

    def __init__(self, limit: int = 400_000):
        self.limit = limit
        self._memo: dict[int, tuple[list, str, tuple]] = {}

    def _get(self, actions: list) -> tuple[list, str, tuple]:
        got = self._memo.get(id(actions))
        if got is None or got[0] is not actions:
            if len(self._memo) >= self.limit:
                self._memo = {}
            mbs = tuple({a.microbatch for a in actions if a.microbatch is not None})
            got = self._memo[id(actions)] = (actions, ACTIONS.dump_json(actions).decode(), mbs)
        return got

    def actions(self, actions: list) -> str:
        """ACTIONS.dump_json(actions), once per list."""
        return self._get(actions)[1]

    def microbatches(self, actions: list) -> tuple:
        """The micro-batches `actions` touch, once per list."""
        return self._get(actions)[2]

    def plan(self, plan: Plan) -> str:
        """plan.to_json(), the workers' actions from the memo."""
        head = plan.model_dump_json(include=HEAD)
        tail = plan.model_dump_json(include=TAIL)
        workers = ",".join([f'{{"replica":{w.replica},"stage":{w.stage},"actions":'
                            f'{self.actions(w.actions)}}}' for w in plan.workers])
        return f'{head[:-1]},"workers":[{workers}],{tail[1:]}'


PARTS = JsonParts()  # the service's (one process, one event loop)
