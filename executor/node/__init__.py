"""The node agent (`recycle agent`): one per machine, between its workers and the service
(DESIGN section 10). See agent.py."""
