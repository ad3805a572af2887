"""The node agent (`recycle agent`): one per machine, between its workers and the service
(docs/design.md section 10). See agent.py."""
