"""Node agents on the service side: one agent per machine claims a node (a block of
consecutive worker ranks), heartbeats for all of its workers in one request and long-polls
the plan once for them (see executor/node/ for the agent, docs/api.md "Node agents")."""
